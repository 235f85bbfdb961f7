// The kernel table's Llama-family CUDA slots (f32): RMSNorm, SiLU/SwiGLU, the rotary
// embedding, grouped-query attention, dropout. As register.cc: the device check, the slot's
// shape and dtype checks (core/kernel_checks.h, shared with the CPU backend), then the launchers
// of llama_launch.h (the attention's: launchers.h) on the device's kernel stream. bf16/f16
// tensors reach these through the table's up-cast fallbacks (kernels::RegisterHalfFallbacks), as
// the CPU's do.
#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/kernels/llama_launch.h"
#include "backends/cuda/kernels/register_util.h"
#include "backends/cuda/launch.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cuda {
namespace {

namespace checks = kernels::checks;
constexpr DType kF32 = DType::kF32;

int Dev(const Tensor& t) { return t.device().index; }

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& out, Tensor& rstd) {
  CheckCudaTensors("rmsnorm_forward", {&x, &weight, &out, &rstd});
  const checks::RowsDims d = checks::RmsNormForward("cuda", kF32, x, weight, out, rstd);
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchRmsNormForward(x.data<float>(), weight.data<float>(), eps, d.rows, d.cols,
                                 out.data<float>(), rstd.data<float>(), KernelStream(Dev(x))),
            "rmsnorm_forward");
}

void RmsNormBackward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                     Tensor& dx, Tensor& dweight) {
  CheckCudaTensors("rmsnorm_backward", {&dout, &x, &weight, &rstd, &dx, &dweight});
  const checks::RowsDims d =
      checks::RmsNormBackward("cuda", kF32, dout, x, weight, rstd, dx, dweight);
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchRmsNormBackward(dout.data<float>(), x.data<float>(), weight.data<float>(),
                                  rstd.data<float>(), d.rows, d.cols, dx.data<float>(),
                                  dweight.data<float>(), KernelStream(Dev(x))),
            "rmsnorm_backward");
}

void SwiGluForward(const Tensor& gate, const Tensor& up, Tensor& out) {
  CheckCudaTensors("swiglu_forward", {&gate, &out});
  if (up.defined()) CheckCudaTensors("swiglu_forward", {&gate, &up});
  const int64_t n = checks::SwiGluForward("cuda", kF32, gate, up, out);
  DeviceGuard g(Dev(gate));
  CheckCuda(LaunchSwiGluForward(gate.data<float>(), up.defined() ? up.data<float>() : nullptr,
                                out.data<float>(), n, KernelStream(Dev(gate))),
            "swiglu_forward");
}

void SwiGluBackward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                    Tensor& dup) {
  CheckCudaTensors("swiglu_backward", {&dout, &gate, &dgate});
  if (up.defined()) CheckCudaTensors("swiglu_backward", {&gate, &up});
  if (dup.defined()) CheckCudaTensors("swiglu_backward", {&gate, &dup});
  const int64_t n = checks::SwiGluBackward("cuda", kF32, dout, gate, up, dgate, dup);
  DeviceGuard g(Dev(gate));
  CheckCuda(LaunchSwiGluBackward(dout.data<float>(), gate.data<float>(),
                                 up.defined() ? up.data<float>() : nullptr, dgate.data<float>(),
                                 dup.defined() ? dup.data<float>() : nullptr, n,
                                 KernelStream(Dev(gate))),
            "swiglu_backward");
}

void Rope(const Tensor& x, const kernels::RopeParams& p, Tensor& out) {
  CheckCudaTensors("rope", {&x, &out});
  const checks::RopeDims d = checks::Rope("cuda", kF32, x, p, out);
  if (x.numel() == 0) return;
  DeviceGuard g(Dev(x));
  // The cos/sin table: a tensor from the device's allocator (the caching allocator), freed on
  // return and reused in the kernel stream's order.
  Tensor table = Tensor::Empty({d.t * d.d}, kF32, x.device());
  const RopeLaunch launch{d.b, d.t, d.h, d.d, double(p.theta), double(p.position_scale),
                          p.position_offset, p.inverse};
  CheckCuda(LaunchRope(x.data<float>(), launch, table.data<float>(), out.data<float>(),
                       KernelStream(Dev(x))),
            "rope");
}

void GqaForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& att) {
  CheckCudaTensors("gqa_forward", {&q, &k, &v, &out, &att});
  const checks::GqaDims s = checks::GqaForward("cuda", kF32, q, k, v, out, att);
  DeviceGuard g(Dev(q));
  CheckCuda(LaunchGqaForward(q.data<float>(), k.data<float>(), v.data<float>(), s.b, s.t, s.h,
                             s.hkv, s.d, out.data<float>(), att.data<float>(),
                             KernelStream(Dev(q))),
            "gqa_forward");
}

void GqaBackward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& att, Tensor& dq, Tensor& dk, Tensor& dv) {
  CheckCudaTensors("gqa_backward", {&dout, &q, &k, &v, &att, &dq, &dk, &dv});
  const checks::GqaDims s = checks::GqaBackward("cuda", kF32, dout, q, k, v, att, dq, dk, dv);
  DeviceGuard g(Dev(q));
  // dS scratch, as big as att (the reference path is quadratic in T anyway).
  Tensor ds = Tensor::Empty(att.shape(), kF32, q.device());
  CheckCuda(LaunchGqaBackward(dout.data<float>(), q.data<float>(), k.data<float>(),
                              v.data<float>(), att.data<float>(), s.b, s.t, s.h, s.hkv, s.d,
                              ds.data<float>(), dq.data<float>(), dk.data<float>(),
                              dv.data<float>(), KernelStream(Dev(q))),
            "gqa_backward");
}

void Dropout(const Tensor& x, float p, uint64_t seed, Tensor& out) {
  CheckCudaTensors("dropout", {&x, &out});
  const int64_t n = checks::Dropout("cuda", kF32, x, p, out);
  DeviceGuard g(Dev(x));
  CheckCuda(LaunchDropout(x.data<float>(), p, seed, out.data<float>(), n, KernelStream(Dev(x))),
            "dropout");
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::rmsnorm_forward, DeviceType::kCUDA, &RmsNormForward);
BRAID_REGISTER_KERNEL(kernels::rmsnorm_backward, DeviceType::kCUDA, &RmsNormBackward);
BRAID_REGISTER_KERNEL(kernels::swiglu_forward, DeviceType::kCUDA, &SwiGluForward);
BRAID_REGISTER_KERNEL(kernels::swiglu_backward, DeviceType::kCUDA, &SwiGluBackward);
BRAID_REGISTER_KERNEL(kernels::rope, DeviceType::kCUDA, &Rope);
BRAID_REGISTER_KERNEL(kernels::gqa_forward, DeviceType::kCUDA, &GqaForward);
BRAID_REGISTER_KERNEL(kernels::gqa_backward, DeviceType::kCUDA, &GqaBackward);
BRAID_REGISTER_KERNEL(kernels::dropout, DeviceType::kCUDA, &Dropout);

}  // namespace braid::cuda
