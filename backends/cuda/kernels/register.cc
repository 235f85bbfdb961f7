// The kernel table's CUDA slots (f32): shape and dtype checks as the CPU backend's, then the
// launchers of launchers.h on the device's kernel stream (launch.h). matmul is in matmul.cc; the
// copy slot (host <-> device) belongs to the CUDA runtime.
#include <cmath>

#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/kernels/register_util.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/math/convert.h"
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

void CheckNumel(const char* kernel, const Tensor& t, int64_t n) {
  BRAID_CHECK(t.numel() == n) << "cuda kernel '" << kernel << "': " << t.DescribeForError()
                              << " should have " << n << " elements";
}

void CheckDType(const char* kernel, const Tensor& t, DType want) {
  BRAID_CHECK(t.dtype() == want) << "cuda kernel '" << kernel << "' wants " << DTypeName(want)
                                 << ", got " << t.DescribeForError();
}

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
  CheckF32CudaTensors("binary", {&a, &b, &out});
  const int64_t n = a.numel(), nb = b.numel();
  CheckNumel("binary", out, n);
  BRAID_CHECK(nb == n || (nb > 0 && n % nb == 0))
      << "cuda binary: " << b.DescribeForError() << " neither matches nor repeats along "
      << a.DescribeForError();
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchBinary(math::Binary(int(op)), a.data<float>(), b.data<float>(), nb,
                         out.data<float>(), n, KernelStream(Dev(a))),
            "binary");
}

void Unary(UnaryOp op, const Tensor& a, float scalar, Tensor& out) {
  CheckF32CudaTensors("unary", {&a, &out});
  CheckNumel("unary", out, a.numel());
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchUnary(math::Unary(int(op)), a.data<float>(), scalar, out.data<float>(),
                        a.numel(), KernelStream(Dev(a))),
            "unary");
}

void UnaryBackward(UnaryOp op, const Tensor& a, const Tensor& grad_out, Tensor& grad_in) {
  CheckF32CudaTensors("unary_backward", {&a, &grad_out, &grad_in});
  CheckNumel("unary_backward", grad_out, a.numel());
  CheckNumel("unary_backward", grad_in, a.numel());
  BRAID_CHECK(op != UnaryOp::kScale)
      << "cuda unary_backward: kScale's derivative is its scalar, which this slot does not "
         "receive; scale the gradient with `unary` instead";
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchUnaryGrad(math::Unary(int(op)), a.data<float>(), grad_out.data<float>(),
                            grad_in.data<float>(), a.numel(), KernelStream(Dev(a))),
            "unary_backward");
}

void Axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  CheckF32CudaTensors("axpby", {&x, &y});
  CheckNumel("axpby", y, x.numel());
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchAxpby(alpha, x.data<float>(), beta, y.data<float>(), x.numel(),
                        KernelStream(Dev(x))),
            "axpby");
}

void SumAll(const Tensor& a, Tensor& out) {
  CheckF32CudaTensors("sum_all", {&a, &out});
  CheckNumel("sum_all", out, 1);
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchSumAll(a.data<float>(), a.numel(), out.data<float>(), KernelStream(Dev(a))),
            "sum_all");
}

void SumRows(const Tensor& a, Tensor& out, float beta) {
  CheckF32CudaTensors("sum_rows", {&a, &out});
  const int64_t cols = out.numel();
  BRAID_CHECK(cols > 0 && a.numel() % cols == 0)
      << "cuda sum_rows: " << a.DescribeForError() << " is not rows of " << out.DescribeForError();
  DeviceGuard g(Dev(a));
  CheckCuda(LaunchSumRows(a.data<float>(), a.numel() / cols, cols, out.data<float>(), beta,
                          KernelStream(Dev(a))),
            "sum_rows");
}

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& out, Tensor& mean, Tensor& rstd) {
  CheckF32CudaTensors("layernorm_forward", {&x, &weight, &bias, &out, &mean, &rstd});
  const int64_t c = weight.numel();
  BRAID_CHECK(c > 0 && x.numel() % c == 0) << "cuda layernorm_forward: " << x.DescribeForError()
                                           << " is not rows of " << weight.DescribeForError();
  const int64_t rows = x.numel() / c;
  CheckNumel("layernorm_forward", bias, c);
  CheckNumel("layernorm_forward", out, x.numel());
  CheckNumel("layernorm_forward", mean, rows);
  CheckNumel("layernorm_forward", rstd, rows);
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchLayerNormForward(x.data<float>(), weight.data<float>(), bias.data<float>(), eps,
                                   rows, c, out.data<float>(), mean.data<float>(),
                                   rstd.data<float>(), KernelStream(Dev(x))),
            "layernorm_forward");
}

void LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                       Tensor& dbias) {
  CheckF32CudaTensors("layernorm_backward",
                      {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias});
  const int64_t c = weight.numel();
  BRAID_CHECK(c > 0 && x.numel() % c == 0) << "cuda layernorm_backward: " << x.DescribeForError()
                                           << " is not rows of " << weight.DescribeForError();
  const int64_t rows = x.numel() / c;
  CheckNumel("layernorm_backward", dout, x.numel());
  CheckNumel("layernorm_backward", dx, x.numel());
  CheckNumel("layernorm_backward", dweight, c);
  CheckNumel("layernorm_backward", dbias, c);
  CheckNumel("layernorm_backward", mean, rows);
  CheckNumel("layernorm_backward", rstd, rows);
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchLayerNormBackward(dout.data<float>(), x.data<float>(), weight.data<float>(),
                                    mean.data<float>(), rstd.data<float>(), rows, c,
                                    dx.data<float>(), dweight.data<float>(), dbias.data<float>(),
                                    KernelStream(Dev(x))),
            "layernorm_backward");
}

void SoftmaxForward(const Tensor& x, Tensor& out) {
  CheckF32CudaTensors("softmax_forward", {&x, &out});
  CheckNumel("softmax_forward", out, x.numel());
  BRAID_CHECK(x.ndim() >= 1) << "cuda softmax_forward of a scalar " << x.DescribeForError();
  const int64_t c = x.size(-1), rows = c == 0 ? 0 : x.numel() / c;
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchSoftmaxForward(x.data<float>(), rows, c, out.data<float>(), KernelStream(Dev(x))),
            "softmax_forward");
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  CheckF32CudaTensors("softmax_backward", {&y, &dy, &dx});
  CheckNumel("softmax_backward", dy, y.numel());
  CheckNumel("softmax_backward", dx, y.numel());
  BRAID_CHECK(y.ndim() >= 1) << "cuda softmax_backward of a scalar " << y.DescribeForError();
  const int64_t c = y.size(-1), rows = c == 0 ? 0 : y.numel() / c;
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
  CheckDType("cross_entropy_forward", logits, DType::kF32);
  CheckDType("cross_entropy_forward", targets, DType::kI32);
  CheckDType("cross_entropy_forward", losses, DType::kF32);
  CheckDType("cross_entropy_forward", probs, DType::kF32);
  BRAID_CHECK(logits.ndim() == 2) << "cuda cross_entropy_forward wants logits [N, V], got "
                                  << logits.DescribeForError();
  const int64_t n = logits.size(0), v = logits.size(1);
  CheckNumel("cross_entropy_forward", targets, n);
  CheckNumel("cross_entropy_forward", losses, n);
  CheckNumel("cross_entropy_forward", probs, n * v);
  DeviceGuard g(Dev(logits));
  CheckCuda(LaunchCrossEntropyForward(logits.data<float>(), targets.data<int32_t>(), n, v,
                                      losses.data<float>(), probs.data<float>(),
                                      KernelStream(Dev(logits))),
            "cross_entropy_forward");
}

void CrossEntropyBackward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                          Tensor& dlogits) {
  CheckCudaTensors("cross_entropy_backward", {&probs, &targets, &dloss, &dlogits});
  CheckDType("cross_entropy_backward", probs, DType::kF32);
  CheckDType("cross_entropy_backward", targets, DType::kI32);
  CheckDType("cross_entropy_backward", dloss, DType::kF32);
  CheckDType("cross_entropy_backward", dlogits, DType::kF32);
  BRAID_CHECK(probs.ndim() == 2) << "cuda cross_entropy_backward wants probs [N, V], got "
                                 << probs.DescribeForError();
  const int64_t n = probs.size(0), v = probs.size(1);
  CheckNumel("cross_entropy_backward", targets, n);
  CheckNumel("cross_entropy_backward", dloss, n);
  CheckNumel("cross_entropy_backward", dlogits, n * v);
  DeviceGuard g(Dev(probs));
  CheckCuda(LaunchCrossEntropyBackward(probs.data<float>(), targets.data<int32_t>(),
                                       dloss.data<float>(), n, v, dlogits.data<float>(),
                                       KernelStream(Dev(probs))),
            "cross_entropy_backward");
}

void EmbeddingForward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  CheckCudaTensors("embedding_forward", {&weight, &ids, &out});
  CheckDType("embedding_forward", weight, DType::kF32);
  CheckDType("embedding_forward", ids, DType::kI32);
  CheckDType("embedding_forward", out, DType::kF32);
  BRAID_CHECK(weight.ndim() == 2) << "cuda embedding_forward wants weight [V, C], got "
                                  << weight.DescribeForError();
  const int64_t c = weight.size(1), n = ids.numel();
  CheckNumel("embedding_forward", out, n * c);
  DeviceGuard g(Dev(weight));
  CheckCuda(LaunchEmbeddingForward(weight.data<float>(), ids.data<int32_t>(), n, c,
                                   out.data<float>(), KernelStream(Dev(weight))),
            "embedding_forward");
}

void EmbeddingBackward(const Tensor& dout, const Tensor& ids, Tensor& dweight) {
  CheckCudaTensors("embedding_backward", {&dout, &ids, &dweight});
  CheckDType("embedding_backward", dout, DType::kF32);
  CheckDType("embedding_backward", ids, DType::kI32);
  CheckDType("embedding_backward", dweight, DType::kF32);
  BRAID_CHECK(dweight.ndim() == 2)
      << "cuda embedding_backward wants dweight [V, C], got " << dweight.DescribeForError();
  const int64_t c = dweight.size(1), n = ids.numel();
  CheckNumel("embedding_backward", dout, n * c);
  DeviceGuard g(Dev(dout));
  CheckCuda(LaunchEmbeddingBackward(dout.data<float>(), ids.data<int32_t>(), n, c,
                                    dweight.data<float>(), KernelStream(Dev(dout))),
            "embedding_backward");
}

struct AttnDims {
  int64_t b, t, c, h;
};

AttnDims CheckAttention(const char* kernel, const Tensor& qkv, int n_head) {
  BRAID_CHECK(qkv.dtype() == DType::kF32 && qkv.ndim() == 3 && n_head > 0 &&
              qkv.size(2) % (3 * int64_t(n_head)) == 0)
      << "cuda " << kernel << " wants f32 qkv [B, T, 3C] with C divisible by n_head=" << n_head
      << ", got " << qkv.DescribeForError();
  return {qkv.size(0), qkv.size(1), qkv.size(2) / 3, n_head};
}

void AttentionForward(const Tensor& qkv, int n_head, Tensor& out, Tensor& att) {
  CheckF32CudaTensors("attention_forward", {&qkv, &out, &att});
  const AttnDims s = CheckAttention("attention_forward", qkv, n_head);
  CheckNumel("attention_forward", out, s.b * s.t * s.c);
  CheckNumel("attention_forward", att, s.b * s.h * s.t * s.t);
  DeviceGuard g(Dev(qkv));
  CheckCuda(LaunchAttentionForward(qkv.data<float>(), s.b, s.t, s.c, s.h, out.data<float>(),
                                   att.data<float>(), KernelStream(Dev(qkv))),
            "attention_forward");
}

void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int n_head,
                       Tensor& dqkv) {
  CheckF32CudaTensors("attention_backward", {&dout, &qkv, &att, &dqkv});
  const AttnDims s = CheckAttention("attention_backward", qkv, n_head);
  CheckNumel("attention_backward", dout, s.b * s.t * s.c);
  CheckNumel("attention_backward", att, s.b * s.h * s.t * s.t);
  CheckNumel("attention_backward", dqkv, qkv.numel());
  DeviceGuard g(Dev(qkv));
  cudaStream_t stream = KernelStream(Dev(qkv));
  // dS scratch, as big as att; stream-ordered so it is reused without a sync. (The runtime's
  // caching allocator should provide it once it exists.)
  float* ds = nullptr;
  CheckCuda(cudaMallocAsync(reinterpret_cast<void**>(&ds), att.nbytes(), stream),
            "attention_backward scratch");
  CheckCuda(LaunchAttentionBackward(dout.data<float>(), qkv.data<float>(), att.data<float>(), s.b,
                                    s.t, s.c, s.h, ds, dqkv.data<float>(), stream),
            "attention_backward");
  CheckCuda(cudaFreeAsync(ds, stream), "attention_backward scratch");
}

void AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const kernels::AdamWParams& p) {
  CheckF32CudaTensors("adamw", {&param, &grad, &m, &v});
  const int64_t n = param.numel();
  CheckNumel("adamw", grad, n);
  CheckNumel("adamw", m, n);
  CheckNumel("adamw", v, n);
  BRAID_CHECK(p.step >= 1) << "cuda adamw: step is 1-based, got " << p.step;
  const math::AdamWConsts k =
      math::MakeAdamWConsts(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step);
  DeviceGuard g(Dev(param));
  CheckCuda(LaunchAdamW(k, param.data<float>(), grad.data<float>(), m.data<float>(),
                        v.data<float>(), n, KernelStream(Dev(param))),
            "adamw");
}

void Sgd(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const kernels::SgdParams& p) {
  CheckF32CudaTensors("sgd", {&param, &grad});
  const int64_t n = param.numel();
  CheckNumel("sgd", grad, n);
  const bool use_momentum = p.momentum != 0.0f;
  float* buf = nullptr;
  if (use_momentum) {
    CheckF32CudaTensors("sgd", {&param, &momentum_buf});
    CheckNumel("sgd", momentum_buf, n);
    buf = momentum_buf.data<float>();
  }
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
BRAID_REGISTER_KERNEL(kernels::layernorm_forward, DeviceType::kCUDA, &LayerNormForward);
BRAID_REGISTER_KERNEL(kernels::layernorm_backward, DeviceType::kCUDA, &LayerNormBackward);
BRAID_REGISTER_KERNEL(kernels::softmax_forward, DeviceType::kCUDA, &SoftmaxForward);
BRAID_REGISTER_KERNEL(kernels::softmax_backward, DeviceType::kCUDA, &SoftmaxBackward);
BRAID_REGISTER_KERNEL(kernels::cross_entropy_forward, DeviceType::kCUDA, &CrossEntropyForward);
BRAID_REGISTER_KERNEL(kernels::cross_entropy_backward, DeviceType::kCUDA, &CrossEntropyBackward);
BRAID_REGISTER_KERNEL(kernels::embedding_forward, DeviceType::kCUDA, &EmbeddingForward);
BRAID_REGISTER_KERNEL(kernels::embedding_backward, DeviceType::kCUDA, &EmbeddingBackward);
BRAID_REGISTER_KERNEL(kernels::attention_forward, DeviceType::kCUDA, &AttentionForward);
BRAID_REGISTER_KERNEL(kernels::attention_backward, DeviceType::kCUDA, &AttentionBackward);
BRAID_REGISTER_KERNEL(kernels::adamw, DeviceType::kCUDA, &AdamW);
BRAID_REGISTER_KERNEL(kernels::sgd, DeviceType::kCUDA, &Sgd);

}  // namespace braid::cuda
