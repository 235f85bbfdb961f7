// The kernel table's CUDA slots (f32): the device check, the slot's shape and dtype checks
// (core/kernel_checks.h, shared with the other backends), then the launchers of launchers.h on
// the device's kernel stream (launch.h). matmul is in matmul.cc; the copy slot (host <-> device)
// belongs to the CUDA runtime.
#include <cmath>

#include "backends/cuda/kernels/geometry.h"
#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/kernels/register_util.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/math/convert.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cuda {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

// math's op codes mirror core's enums, so a cast maps one onto the other.
static_assert(int(math::Unary::kScale) == int(UnaryOp::kScale) &&
              int(math::Unary::kAddScalar) == int(UnaryOp::kAddScalar) &&
              int(math::Unary::kRelu) == int(UnaryOp::kRelu) &&
              int(math::Unary::kGeluTanh) == int(UnaryOp::kGeluTanh) &&
              int(math::Unary::kExp) == int(UnaryOp::kExp) &&
              int(math::Unary::kLog) == int(UnaryOp::kLog) &&
              int(math::Unary::kNeg) == int(UnaryOp::kNeg) &&
              int(math::Unary::kSquare) == int(UnaryOp::kSquare) &&
              int(math::Unary::kSqrt) == int(UnaryOp::kSqrt) &&
              int(math::Unary::kTanh) == int(UnaryOp::kTanh));
static_assert(int(math::Binary::kAdd) == int(BinaryOp::kAdd) &&
              int(math::Binary::kSub) == int(BinaryOp::kSub) &&
              int(math::Binary::kMul) == int(BinaryOp::kMul) &&
              int(math::Binary::kDiv) == int(BinaryOp::kDiv));

namespace checks = kernels::checks;
constexpr DType kF32 = DType::kF32;

int Dev(const Tensor& t) { return t.device().index; }

void Fill(Tensor& dst, float value) {
  CheckCudaTensors("fill", {&dst});
  uint64_t bits = 0;
  switch (dst.dtype()) {
    case DType::kF32: bits = math::FloatBits(value); break;
    case DType::kBF16: bits = math::FloatToBF16(value); break;
    case DType::kF16: bits = math::FloatToF16(value); break;
    case DType::kI32: bits = uint32_t(int32_t(double(value))); break;
    case DType::kI64: bits = uint64_t(int64_t(double(value))); break;
    case DType::kU8: bits = uint8_t(double(value)); break;
    case DType::kI8: bits = uint8_t(int8_t(double(value))); break;
  }
  DeviceGuard g(Dev(dst));
  CheckCuda(LaunchFill(dst.raw_data(), dst.numel(), int(SizeOf(dst.dtype())), bits,
                       KernelStream(Dev(dst))),
            "fill");
}

void Binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  CheckCudaTensors("binary", {&a, &b, &out});
  checks::Binary("cuda", kF32, a, b, out);
  const int64_t n = a.numel(), nb = b.numel();
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchBinary(math::Binary(int(op)), a.data<float>(), b.data<float>(), nb,
                         out.data<float>(), n, KernelStream(Dev(a))),
            "binary");
}

void Unary(UnaryOp op, const Tensor& a, float scalar, Tensor& out) {
  CheckCudaTensors("unary", {&a, &out});
  checks::Unary("cuda", kF32, a, out);
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchUnary(math::Unary(int(op)), a.data<float>(), scalar, out.data<float>(),
                        a.numel(), KernelStream(Dev(a))),
            "unary");
}

void UnaryBackward(UnaryOp op, const Tensor& a, const Tensor& grad_out, Tensor& grad_in) {
  CheckCudaTensors("unary_backward", {&a, &grad_out, &grad_in});
  checks::UnaryBackward("cuda", kF32, op, a, grad_out, grad_in);
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchUnaryGrad(math::Unary(int(op)), a.data<float>(), grad_out.data<float>(),
                            grad_in.data<float>(), a.numel(), KernelStream(Dev(a))),
            "unary_backward");
}

void Axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  CheckCudaTensors("axpby", {&x, &y});
  checks::Axpby("cuda", kF32, x, y);
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchAxpby(alpha, x.data<float>(), beta, y.data<float>(), x.numel(),
                        KernelStream(Dev(x))),
            "axpby");
}

// sum_all's per-block partials (ReductionGeometry(n).grid doubles), from the device's allocator:
// the caching allocator in a program, so the gradient norm's per-parameter sums reuse cached
// blocks instead of calling cudaMallocAsync each time. Freed when the caller's tensor goes out
// of scope, after the launch is enqueued: the allocator reuses it in the kernel stream's order.
Tensor SumAllScratch(const Tensor& a) {
  return Tensor::Empty({2 * ReductionGeometry(a.numel()).grid}, kF32, a.device());
}

double* Partials(Tensor& scratch) { return static_cast<double*>(scratch.raw_data()); }

void SumAll(const Tensor& a, Tensor& out) {
  CheckCudaTensors("sum_all", {&a, &out});
  checks::SumAll("cuda", kF32, a, out);
  DeviceGuard g(Dev(a));
  Tensor scratch = SumAllScratch(a);
  CheckCuda(LaunchSumAll(a.data<float>(), a.numel(), out.data<float>(), Partials(scratch),
                         KernelStream(Dev(a))),
            "sum_all");
}

// ---- Native half kernels (bf16, f16): half storage, f32 arithmetic, one rounding per output,
// as the up-cast fallbacks compute, without their conversion passes. The slots they do not
// cover keep RegisterHalfFallbacks' wrappers (backend_registration.cc), whose conversions are
// device kernels too.
int FormatCode(DType t) {
  switch (t) {
    case DType::kBF16: return int(math::Format::kBF16);
    case DType::kF16: return int(math::Format::kF16);
    default: return int(math::Format::kF32);
  }
}

template <DType D>
void BinaryHalf(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  CheckCudaTensors("binary", {&a, &b, &out});
  checks::Binary("cuda", D, a, b, out);
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchBinaryHalf(FormatCode(D), math::Binary(int(op)), a.raw_data(), b.raw_data(),
                             b.numel(), out.raw_data(), a.numel(), KernelStream(Dev(a))),
            "binary");
}

template <DType D>
void UnaryHalf(UnaryOp op, const Tensor& a, float scalar, Tensor& out) {
  CheckCudaTensors("unary", {&a, &out});
  checks::Unary("cuda", D, a, out);
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchUnaryHalf(FormatCode(D), math::Unary(int(op)), a.raw_data(), scalar,
                            out.raw_data(), a.numel(), KernelStream(Dev(a))),
            "unary");
}

template <DType D>
void UnaryBackwardHalf(UnaryOp op, const Tensor& a, const Tensor& grad_out, Tensor& grad_in) {
  CheckCudaTensors("unary_backward", {&a, &grad_out, &grad_in});
  checks::UnaryBackward("cuda", D, op, a, grad_out, grad_in);
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchUnaryGradHalf(FormatCode(D), math::Unary(int(op)), a.raw_data(),
                                grad_out.raw_data(), grad_in.raw_data(), a.numel(),
                                KernelStream(Dev(a))),
            "unary_backward");
}

// x and y each D or f32 (the slot's key is whichever is not f32: kernels::AxpbyKey).
template <DType D>
void AxpbyHalf(float alpha, const Tensor& x, float beta, Tensor& y) {
  CheckCudaTensors("axpby", {&x, &y});
  for (const Tensor* t : {&x, static_cast<const Tensor*>(&y)}) {
    BRAID_CHECK(t->dtype() == D || t->dtype() == kF32)
        << "cuda kernel 'axpby' (" << DTypeName(D) << "): " << t->DescribeForError()
        << " is neither " << DTypeName(D) << " nor f32";
  }
  BRAID_CHECK(x.numel() == y.numel()) << "cuda kernel 'axpby': " << x.DescribeForError()
                                      << " and " << y.DescribeForError() << " differ in size";
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchAxpbyMixed(FormatCode(x.dtype()), FormatCode(y.dtype()), alpha, x.raw_data(),
                             beta, y.raw_data(), x.numel(), KernelStream(Dev(x))),
            "axpby");
}

template <DType D>
void SumAllHalf(const Tensor& a, Tensor& out) {
  CheckCudaTensors("sum_all", {&a, &out});
  checks::SumAll("cuda", D, a, out);
  DeviceGuard g(Dev(a));
  Tensor scratch = SumAllScratch(a);
  CheckCuda(LaunchSumAllHalf(FormatCode(D), a.raw_data(), a.numel(), out.raw_data(),
                             Partials(scratch), KernelStream(Dev(a))),
            "sum_all");
}

void SumRows(const Tensor& a, Tensor& out, float beta) {
  CheckCudaTensors("sum_rows", {&a, &out});
  const checks::RowsDims dims = checks::SumRows("cuda", kF32, a, out);
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchSumRows(a.data<float>(), dims.rows, dims.cols, out.data<float>(), beta,
                          KernelStream(Dev(a))),
            "sum_rows");
}

// A Linear's bias gradient in bf16/f16 without the fallback's up-cast and rounding passes.
template <DType D>
void SumRowsHalf(const Tensor& a, Tensor& out, float beta) {
  CheckCudaTensors("sum_rows", {&a, &out});
  const checks::RowsDims dims = checks::SumRows("cuda", D, a, out);
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchSumRowsHalf(FormatCode(D), a.raw_data(), dims.rows, dims.cols, out.raw_data(),
                              beta, KernelStream(Dev(a))),
            "sum_rows");
}

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& out, Tensor& mean, Tensor& rstd) {
  CheckCudaTensors("layernorm_forward", {&x, &weight, &bias, &out, &mean, &rstd});
  const auto dims = checks::LayerNormForward("cuda", kF32, x, weight, bias, out, mean, rstd);
  const int64_t rows = dims.rows, c = dims.cols;
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchLayerNormForward(x.data<float>(), weight.data<float>(), bias.data<float>(), eps,
                                   rows, c, out.data<float>(), mean.data<float>(),
                                   rstd.data<float>(), KernelStream(Dev(x))),
            "layernorm_forward");
}

void LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                       Tensor& dbias) {
  CheckCudaTensors("layernorm_backward", {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias});
  const auto dims =
      checks::LayerNormBackward("cuda", kF32, dout, x, weight, mean, rstd, dx, dweight, dbias);
  const int64_t rows = dims.rows, c = dims.cols;
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchLayerNormBackward(dout.data<float>(), x.data<float>(), weight.data<float>(),
                                    mean.data<float>(), rstd.data<float>(), rows, c,
                                    dx.data<float>(), dweight.data<float>(), dbias.data<float>(),
                                    KernelStream(Dev(x))),
            "layernorm_backward");
}

void SoftmaxForward(const Tensor& x, Tensor& out) {
  CheckCudaTensors("softmax_forward", {&x, &out});
  const auto dims = checks::SoftmaxForward("cuda", kF32, x, out);
  const int64_t rows = dims.rows, c = dims.cols;
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchSoftmaxForward(x.data<float>(), rows, c, out.data<float>(), KernelStream(Dev(x))),
            "softmax_forward");
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  CheckCudaTensors("softmax_backward", {&y, &dy, &dx});
  const auto dims = checks::SoftmaxBackward("cuda", kF32, y, dy, dx);
  const int64_t rows = dims.rows, c = dims.cols;
  DeviceGuard g(Dev(y));
  CheckCuda(LaunchSoftmaxBackward(y.data<float>(), dy.data<float>(), rows, c, dx.data<float>(),
                                  KernelStream(Dev(y))),
            "softmax_backward");
}

// Targets live on the device; checking them on the host would cost a copy and a sync per call,
// so an out-of-range target is the caller's contract here (the CPU backend checks it; the data
// loaders produce ids below the vocabulary).
void CrossEntropyForward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                         Tensor& probs) {
  CheckCudaTensors("cross_entropy_forward", {&logits, &targets, &losses, &probs});
  const auto dims = checks::CrossEntropyForward("cuda", kF32, logits, targets, losses, probs);
  const int64_t n = dims.rows, v = dims.cols;
  DeviceGuard g(Dev(logits));
  CheckCuda(LaunchCrossEntropyForward(logits.data<float>(), targets.data<int32_t>(), n, v,
                                      losses.data<float>(), probs.data<float>(),
                                      KernelStream(Dev(logits))),
            "cross_entropy_forward");
}

void CrossEntropyBackward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                          Tensor& dlogits) {
  CheckCudaTensors("cross_entropy_backward", {&probs, &targets, &dloss, &dlogits});
  const auto dims = checks::CrossEntropyBackward("cuda", kF32, probs, targets, dloss, dlogits);
  const int64_t n = dims.rows, v = dims.cols;
  DeviceGuard g(Dev(probs));
  CheckCuda(LaunchCrossEntropyBackward(probs.data<float>(), targets.data<int32_t>(),
                                       dloss.data<float>(), n, v, dlogits.data<float>(),
                                       KernelStream(Dev(probs))),
            "cross_entropy_backward");
}

void InverseCountNonnegative(const Tensor& ids, Tensor& out) {
  CheckCudaTensors("inverse_count_nonnegative", {&ids, &out});
  BRAID_CHECK(ids.dtype() == DType::kI32 && out.dtype() == kF32 && out.numel() == 1)
      << "cuda kernel 'inverse_count_nonnegative': wants i32 ids and one f32 output, got "
      << ids.DescribeForError() << " and " << out.DescribeForError();
  DeviceGuard g(Dev(ids));
  CheckCuda(LaunchInverseCountNonnegative(ids.data<int32_t>(), ids.numel(), out.data<float>(),
                                          KernelStream(Dev(ids))),
            "inverse_count_nonnegative");
}

void EmbeddingForward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  CheckCudaTensors("embedding_forward", {&weight, &ids, &out});
  const auto dims = checks::EmbeddingForward("cuda", kF32, weight, ids, out);
  const int64_t c = dims.cols, n = dims.n;
  DeviceGuard g(Dev(weight));
  CheckCuda(LaunchEmbeddingForward(weight.data<float>(), ids.data<int32_t>(), n, c,
                                   out.data<float>(), KernelStream(Dev(weight))),
            "embedding_forward");
}

void EmbeddingBackward(const Tensor& dout, const Tensor& ids, Tensor& dweight) {
  CheckCudaTensors("embedding_backward", {&dout, &ids, &dweight});
  const auto dims = checks::EmbeddingBackward("cuda", kF32, dout, ids, dweight);
  const int64_t c = dims.cols, n = dims.n;
  DeviceGuard g(Dev(dout));
  CheckCuda(LaunchEmbeddingBackward(dout.data<float>(), ids.data<int32_t>(), n, c,
                                    dweight.data<float>(), KernelStream(Dev(dout))),
            "embedding_backward");
}

void AttentionForward(const Tensor& qkv, int n_head, Tensor& out, Tensor& att) {
  CheckCudaTensors("attention_forward", {&qkv, &out, &att});
  const checks::AttentionDims s = checks::AttentionForward("cuda", kF32, qkv, n_head, out, att);
  DeviceGuard g(Dev(qkv));
  CheckCuda(LaunchAttentionForward(qkv.data<float>(), s.b, s.t, s.c, s.h, out.data<float>(),
                                   att.data<float>(), KernelStream(Dev(qkv))),
            "attention_forward");
}

void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int n_head,
                       Tensor& dqkv) {
  CheckCudaTensors("attention_backward", {&dout, &qkv, &att, &dqkv});
  const checks::AttentionDims s =
      checks::AttentionBackward("cuda", kF32, dout, qkv, att, n_head, dqkv);
  DeviceGuard g(Dev(qkv));
  cudaStream_t stream = KernelStream(Dev(qkv));
  // dS scratch, as big as att (this probability-saving path is quadratic in T; training takes
  // the fused kernel, attention_flash.cu): a tensor from the device's allocator (the caching
  // allocator), freed on return and reused in the kernel stream's order.
  Tensor ds = Tensor::Empty(att.shape(), kF32, qkv.device());
  CheckCuda(LaunchAttentionBackward(dout.data<float>(), qkv.data<float>(), att.data<float>(), s.b,
                                    s.t, s.c, s.h, ds.data<float>(), dqkv.data<float>(), stream),
            "attention_backward");
}

void AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const kernels::AdamWParams& p) {
  CheckCudaTensors("adamw", {&param, &grad, &m, &v});
  checks::AdamW("cuda", param, grad, m, v, p);
  const int64_t n = param.numel();
  const math::AdamWConsts k =
      math::MakeAdamWConsts(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step);
  DeviceGuard g(Dev(param));
  CheckCuda(LaunchAdamW(k, param.data<float>(), grad.data<float>(), m.data<float>(),
                        v.data<float>(), n, KernelStream(Dev(param))),
            "adamw");
}

void Sgd(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const kernels::SgdParams& p) {
  CheckCudaTensors("sgd", {&param, &grad});
  const bool use_momentum = p.momentum != 0.0f;
  if (use_momentum) CheckCudaTensors("sgd", {&param, &momentum_buf});
  checks::Sgd("cuda", param, grad, momentum_buf, p);
  const int64_t n = param.numel();
  float* buf = use_momentum ? momentum_buf.data<float>() : nullptr;
  const math::SgdConsts k{p.lr, p.momentum, 1.0f - p.dampening, p.weight_decay,
                          use_momentum, p.nesterov, p.first_step};
  DeviceGuard g(Dev(param));
  CheckCuda(LaunchSgd(k, param.data<float>(), grad.data<float>(), buf, n,
                      KernelStream(Dev(param))),
            "sgd");
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::fill, DeviceType::kCUDA, &Fill);
BRAID_REGISTER_KERNEL(kernels::binary, DeviceType::kCUDA, &Binary);
BRAID_REGISTER_KERNEL(kernels::unary, DeviceType::kCUDA, &Unary);
BRAID_REGISTER_KERNEL(kernels::unary_backward, DeviceType::kCUDA, &UnaryBackward);
BRAID_REGISTER_KERNEL(kernels::axpby, DeviceType::kCUDA, &Axpby);
BRAID_REGISTER_KERNEL(kernels::sum_all, DeviceType::kCUDA, &SumAll);
BRAID_REGISTER_KERNEL(kernels::sum_rows, DeviceType::kCUDA, &SumRows);
// Native half kernels: registered under their dtype, they take the place of the fallbacks.
#define BRAID_REGISTER_CUDA_HALF(slot, fn)                                                  \
  BRAID_REGISTER_KERNEL_FOR_DTYPE(slot, DeviceType::kCUDA, DType::kBF16, &fn<DType::kBF16>); \
  BRAID_REGISTER_KERNEL_FOR_DTYPE(slot, DeviceType::kCUDA, DType::kF16, &fn<DType::kF16>)
BRAID_REGISTER_CUDA_HALF(kernels::binary, BinaryHalf);
BRAID_REGISTER_CUDA_HALF(kernels::unary, UnaryHalf);
BRAID_REGISTER_CUDA_HALF(kernels::unary_backward, UnaryBackwardHalf);
BRAID_REGISTER_CUDA_HALF(kernels::axpby, AxpbyHalf);
BRAID_REGISTER_CUDA_HALF(kernels::sum_all, SumAllHalf);
BRAID_REGISTER_CUDA_HALF(kernels::sum_rows, SumRowsHalf);
#undef BRAID_REGISTER_CUDA_HALF
BRAID_REGISTER_KERNEL(kernels::layernorm_forward, DeviceType::kCUDA, &LayerNormForward);
BRAID_REGISTER_KERNEL(kernels::layernorm_backward, DeviceType::kCUDA, &LayerNormBackward);
BRAID_REGISTER_KERNEL(kernels::softmax_forward, DeviceType::kCUDA, &SoftmaxForward);
BRAID_REGISTER_KERNEL(kernels::softmax_backward, DeviceType::kCUDA, &SoftmaxBackward);
BRAID_REGISTER_KERNEL(kernels::cross_entropy_forward, DeviceType::kCUDA, &CrossEntropyForward);
BRAID_REGISTER_KERNEL(kernels::cross_entropy_backward, DeviceType::kCUDA, &CrossEntropyBackward);
BRAID_REGISTER_KERNEL(kernels::inverse_count_nonnegative, DeviceType::kCUDA,
                      &InverseCountNonnegative);
BRAID_REGISTER_KERNEL(kernels::embedding_forward, DeviceType::kCUDA, &EmbeddingForward);
BRAID_REGISTER_KERNEL(kernels::embedding_backward, DeviceType::kCUDA, &EmbeddingBackward);
BRAID_REGISTER_KERNEL(kernels::attention_forward, DeviceType::kCUDA, &AttentionForward);
BRAID_REGISTER_KERNEL(kernels::attention_backward, DeviceType::kCUDA, &AttentionBackward);
BRAID_REGISTER_KERNEL(kernels::adamw, DeviceType::kCUDA, &AdamW);
BRAID_REGISTER_KERNEL(kernels::sgd, DeviceType::kCUDA, &Sgd);

}  // namespace braid::cuda
