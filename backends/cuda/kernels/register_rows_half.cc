// The kernel table's bf16/f16 CUDA slots for LayerNorm, softmax, cross-entropy and embedding:
// the native row kernels of nn.cu (rows_half_launch.h) on half storage, registered under their
// dtype so that the up-cast fallbacks (backend_registration.cc's RegisterHalfFallbacks, which
// only fill empty slots) no longer serve them: no conversion passes, the same f32 sums and one
// rounding per stored output. The device check and the slot's checks (core/kernel_checks.h) come
// first, as for f32 (register.cc).
#include "backends/cuda/kernels/register_util.h"
#include "backends/cuda/kernels/rows_half_launch.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/math/convert.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cuda {
namespace {

namespace checks = kernels::checks;

template <DType D>
constexpr int kFormat = D == DType::kBF16 ? int(math::Format::kBF16) : int(math::Format::kF16);

int Dev(const Tensor& t) { return t.device().index; }

template <DType D>
void LayerNormForwardHalf(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                          Tensor& out, Tensor& mean, Tensor& rstd) {
  CheckCudaTensors("layernorm_forward", {&x, &weight, &bias, &out, &mean, &rstd});
  const auto dims = checks::LayerNormForward("cuda", D, x, weight, bias, out, mean, rstd);
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchLayerNormForwardHalf(kFormat<D>, x.raw_data(), weight.raw_data(),
                                       bias.raw_data(), eps, dims.rows, dims.cols, out.raw_data(),
                                       mean.data<float>(), rstd.data<float>(),
                                       KernelStream(Dev(x))),
            "layernorm_forward");
}

template <DType D>
void LayerNormBackwardHalf(const Tensor& dout, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                           Tensor& dbias) {
  CheckCudaTensors("layernorm_backward", {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias});
  const auto dims =
      checks::LayerNormBackward("cuda", D, dout, x, weight, mean, rstd, dx, dweight, dbias);
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchLayerNormBackwardHalf(kFormat<D>, dout.raw_data(), x.raw_data(),
                                        weight.raw_data(), mean.data<float>(), rstd.data<float>(),
                                        dims.rows, dims.cols, dx.raw_data(), dweight.raw_data(),
                                        dbias.raw_data(), KernelStream(Dev(x))),
            "layernorm_backward");
}

template <DType D>
void SoftmaxForwardHalf(const Tensor& x, Tensor& out) {
  CheckCudaTensors("softmax_forward", {&x, &out});
  const auto dims = checks::SoftmaxForward("cuda", D, x, out);
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchSoftmaxForwardHalf(kFormat<D>, x.raw_data(), dims.rows, dims.cols,
                                     out.raw_data(), KernelStream(Dev(x))),
            "softmax_forward");
}

template <DType D>
void SoftmaxBackwardHalf(const Tensor& y, const Tensor& dy, Tensor& dx) {
  CheckCudaTensors("softmax_backward", {&y, &dy, &dx});
  const auto dims = checks::SoftmaxBackward("cuda", D, y, dy, dx);
  DeviceGuard g(Dev(y));
  CheckCuda(LaunchSoftmaxBackwardHalf(kFormat<D>, y.raw_data(), dy.raw_data(), dims.rows,
                                      dims.cols, dx.raw_data(), KernelStream(Dev(y))),
            "softmax_backward");
}

// Targets stay on the device, unchecked there (register.cc's CrossEntropyForward says why).
template <DType D>
void CrossEntropyForwardHalf(const Tensor& logits, const Tensor& targets, Tensor& losses,
                             Tensor& probs) {
  CheckCudaTensors("cross_entropy_forward", {&logits, &targets, &losses, &probs});
  const auto dims = checks::CrossEntropyForward("cuda", D, logits, targets, losses, probs);
  DeviceGuard g(Dev(logits));
  CheckCuda(LaunchCrossEntropyForwardHalf(kFormat<D>, logits.raw_data(), targets.data<int32_t>(),
                                          dims.rows, dims.cols, losses.data<float>(),
                                          probs.data<float>(), KernelStream(Dev(logits))),
            "cross_entropy_forward");
}

template <DType D>
void CrossEntropyBackwardHalf(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                              Tensor& dlogits) {
  CheckCudaTensors("cross_entropy_backward", {&probs, &targets, &dloss, &dlogits});
  const auto dims = checks::CrossEntropyBackward("cuda", D, probs, targets, dloss, dlogits);
  DeviceGuard g(Dev(probs));
  CheckCuda(LaunchCrossEntropyBackwardHalf(kFormat<D>, probs.data<float>(),
                                           targets.data<int32_t>(), dloss.data<float>(),
                                           dims.rows, dims.cols, dlogits.raw_data(),
                                           KernelStream(Dev(probs))),
            "cross_entropy_backward");
}

template <DType D>
void EmbeddingForwardHalf(const Tensor& weight, const Tensor& ids, Tensor& out) {
  CheckCudaTensors("embedding_forward", {&weight, &ids, &out});
  const auto dims = checks::EmbeddingForward("cuda", D, weight, ids, out);
  DeviceGuard g(Dev(weight));
  CheckCuda(LaunchEmbeddingForwardHalf(weight.raw_data(), ids.data<int32_t>(), dims.n, dims.cols,
                                       out.raw_data(), KernelStream(Dev(weight))),
            "embedding_forward");
}

// The sort's scratch comes from the device's allocator (the caching allocator in a program) and
// is freed on return, reused in the kernel stream's order.
template <DType D>
void EmbeddingBackwardHalf(const Tensor& dout, const Tensor& ids, Tensor& dweight) {
  CheckCudaTensors("embedding_backward", {&dout, &ids, &dweight});
  const auto dims = checks::EmbeddingBackward("cuda", D, dout, ids, dweight);
  DeviceGuard g(Dev(dout));
  size_t bytes = 0;
  CheckCuda(EmbeddingBackwardHalfScratchBytes(dims.n, dims.vocab, &bytes), "embedding_backward");
  if (bytes == 0) return;  // no positions
  Tensor scratch = Tensor::Empty({int64_t(bytes)}, DType::kU8, dout.device());
  CheckCuda(LaunchEmbeddingBackwardHalf(kFormat<D>, dout.raw_data(), ids.data<int32_t>(), dims.n,
                                        dims.cols, dims.vocab, dweight.raw_data(),
                                        scratch.raw_data(), bytes, KernelStream(Dev(dout))),
            "embedding_backward");
}

}  // namespace

#define BRAID_REGISTER_CUDA_HALF_ROWS(slot, fn)                                             \
  BRAID_REGISTER_KERNEL_FOR_DTYPE(slot, DeviceType::kCUDA, DType::kBF16, &fn<DType::kBF16>); \
  BRAID_REGISTER_KERNEL_FOR_DTYPE(slot, DeviceType::kCUDA, DType::kF16, &fn<DType::kF16>)
BRAID_REGISTER_CUDA_HALF_ROWS(kernels::layernorm_forward, LayerNormForwardHalf);
BRAID_REGISTER_CUDA_HALF_ROWS(kernels::layernorm_backward, LayerNormBackwardHalf);
BRAID_REGISTER_CUDA_HALF_ROWS(kernels::softmax_forward, SoftmaxForwardHalf);
BRAID_REGISTER_CUDA_HALF_ROWS(kernels::softmax_backward, SoftmaxBackwardHalf);
BRAID_REGISTER_CUDA_HALF_ROWS(kernels::cross_entropy_forward, CrossEntropyForwardHalf);
BRAID_REGISTER_CUDA_HALF_ROWS(kernels::cross_entropy_backward, CrossEntropyBackwardHalf);
BRAID_REGISTER_CUDA_HALF_ROWS(kernels::embedding_forward, EmbeddingForwardHalf);
BRAID_REGISTER_CUDA_HALF_ROWS(kernels::embedding_backward, EmbeddingBackwardHalf);
#undef BRAID_REGISTER_CUDA_HALF_ROWS

}  // namespace braid::cuda
