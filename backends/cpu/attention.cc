// Fused causal self-attention for the CPU, one (batch, head) per task.
//
// Forward, per block of query rows: scores = scale * Q Kᵀ for the causal columns only, a
// row-wise causal softmax written straight into `att`, then out = P V over the causal range.
// Backward: dP = dO Vᵀ, dS = P * (dP - rowsum(P * dP)) * scale, dQ = dS K, dK = dSᵀ Q, dV = Pᵀ dO,
// each restricted to the lower triangle. The per-head passes and their register-blocked
// products are attention_head.h's (shared with grouped-query attention); here they read Q, K, V
// and dO in place in their strided [B, T, 3C] / [B, T, C] layouts, with Kᵀ and Vᵀ copied (D x T)
// so that the products' right-hand side is contiguous.
#include <cmath>
#include <vector>

#include "backends/cpu/attention_head.h"
#include "backends/cpu/thread_pool.h"
#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cpu {
namespace {

namespace at = attention;
using AttnDims = kernels::checks::AttentionDims;

// One head of the q|k|v layout: rows 3C floats apart, out's C apart.
void AttentionHeadForward(const AttnDims& s, float scale, const float* q, const float* k,
                          const float* v, float* att, float* out) {
  const int64_t T = s.t, D = s.d, ld = 3 * s.c;
  thread_local std::vector<float> buf;
  float* kt = at::Scratch(buf, 2 * D * T);  // Kᵀ [D, T], then V [T, D]
  float* vc = kt + D * T;
  at::Transpose(k, ld, T, D, kt, T);
  at::CopyRows(v, ld, T, D, vc);
  at::HeadForward(T, D, scale, q, ld, kt, vc, att, out, s.c);
}

void AttentionHeadBackward(const AttnDims& s, float scale, const float* q, const float* k,
                           const float* v, const float* att, const float* dout, float* dq,
                           float* dk, float* dv) {
  const int64_t T = s.t, D = s.d, ld = 3 * s.c;
  thread_local std::vector<float> buf;
  float* ds = at::Scratch(buf, T * T + 4 * T * D);  // dS [T, T], Vᵀ [D, T], Q, K, dO [T, D]
  float* vt = ds + T * T;
  float* qc = vt + T * D;
  float* kc = qc + T * D;
  float* gc = kc + T * D;
  at::Transpose(v, ld, T, D, vt, T);
  at::CopyRows(q, ld, T, D, qc);
  at::CopyRows(k, ld, T, D, kc);
  at::CopyRows(dout, s.c, T, D, gc);
  at::HeadBackward(T, D, scale, qc, kc, vt, gc, att, ds, dq, ld, dk, dv, ld);
}

void AttentionForward(const Tensor& qkv, int n_head, Tensor& out, Tensor& att) {
  const AttnDims s = kernels::checks::AttentionForward("cpu", DType::kF32, qkv, n_head, out, att);
  const float* pq = qkv.data<float>();
  float* po = out.data<float>();
  float* pa = att.data<float>();
  const float scale = float(1.0 / std::sqrt(double(s.d)));
  ParallelFor(s.b * s.h, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / s.h, h = task % s.h;
      const float* q = pq + b * s.t * 3 * s.c + h * s.d;
      AttentionHeadForward(s, scale, q, q + s.c, q + 2 * s.c, pa + task * s.t * s.t,
                           po + b * s.t * s.c + h * s.d);
    }
  });
}

void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int n_head,
                       Tensor& dqkv) {
  const AttnDims s =
      kernels::checks::AttentionBackward("cpu", DType::kF32, dout, qkv, att, n_head, dqkv);
  const float* pq = qkv.data<float>();
  const float* pg = dout.data<float>();
  const float* pa = att.data<float>();
  float* pd = dqkv.data<float>();
  const float scale = float(1.0 / std::sqrt(double(s.d)));
  ParallelFor(s.b * s.h, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / s.h, h = task % s.h;
      const int64_t off = b * s.t * 3 * s.c + h * s.d;
      const float* q = pq + off;
      float* dq = pd + off;
      AttentionHeadBackward(s, scale, q, q + s.c, q + 2 * s.c, pa + task * s.t * s.t,
                            pg + b * s.t * s.c + h * s.d, dq, dq + s.c, dq + 2 * s.c);
    }
  });
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::attention_forward, DeviceType::kCPU, &AttentionForward);
BRAID_REGISTER_KERNEL(kernels::attention_backward, DeviceType::kCPU, &AttentionBackward);

}  // namespace braid::cpu
