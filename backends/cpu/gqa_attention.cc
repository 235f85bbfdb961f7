// Causal grouped-query attention for the CPU (f32), the gqa_forward/gqa_backward slots.
//
// Query head h reads K/V head h / (H / Hkv) in place: K and V are never repeated. Both passes run
// one task per (batch, K/V head): the task lays out its K/V head once (Kᵀ and V for the forward;
// Vᵀ and K for the backward) and runs each query head of its group through the register-blocked
// per-head passes the fused GPT attention uses (attention_head.h), so the K/V head is prepared
// once per group rather than once per query head. The backward's task owns that head's dk and dv
// and its group's dq: the sums over the group are formed by one thread in a fixed order (the
// first head's part, then each next head's added), the same bits for any thread count, with no
// atomics.
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
namespace checks = kernels::checks;
constexpr DType kF32 = DType::kF32;

void GqaForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& att) {
  const auto s = checks::GqaForward("cpu", kF32, q, k, v, out, att);
  const int64_t group = s.h / s.hkv, T = s.t, D = s.d;
  const int64_t q_row = s.h * D, kv_row = s.hkv * D;  // one time step's stride
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  float* po = out.data<float>();
  float* pa = att.data<float>();
  const float scale = float(1.0 / std::sqrt(double(D)));
  ParallelFor(s.b * s.hkv, 1, [&](int64_t j0, int64_t j1) {
    thread_local std::vector<float> buf;
    float* kt = at::Scratch(buf, 2 * D * T);  // Kᵀ [D, T], then V [T, D]
    float* vc = kt + D * T;
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t b = j / s.hkv, g = j % s.hkv;
      at::Transpose(pk + b * T * kv_row + g * D, kv_row, T, D, kt, T);
      at::CopyRows(pv + b * T * kv_row + g * D, kv_row, T, D, vc);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const int64_t off = b * T * q_row + h * D;
        at::HeadForward(T, D, scale, pq + off, q_row, kt, vc, pa + (b * s.h + h) * T * T, po + off,
                        q_row);
      }
    }
  });
}

void GqaBackward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& att, Tensor& dq, Tensor& dk, Tensor& dv) {
  const auto s = checks::GqaBackward("cpu", kF32, dout, q, k, v, att, dq, dk, dv);
  const int64_t group = s.h / s.hkv, T = s.t, D = s.d;
  const int64_t q_row = s.h * D, kv_row = s.hkv * D;
  const float* pg = dout.data<float>();
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  const float* pa = att.data<float>();
  float* pdq = dq.data<float>();
  float* pdk = dk.data<float>();
  float* pdv = dv.data<float>();
  const float scale = float(1.0 / std::sqrt(double(D)));
  ParallelFor(s.b * s.hkv, 1, [&](int64_t j0, int64_t j1) {
    thread_local std::vector<float> buf;
    // dS [T, T], Vᵀ [D, T], then K, Q, dO and a later head's dK and dV parts [T, D].
    float* ds = at::Scratch(buf, T * T + 6 * T * D);
    float* vt = ds + T * T;
    float* kc = vt + T * D;
    float* qc = kc + T * D;
    float* gc = qc + T * D;
    float* dk_h = gc + T * D;
    float* dv_h = dk_h + T * D;
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t b = j / s.hkv, g = j % s.hkv;
      const int64_t kv_off = b * T * kv_row + g * D;
      float* dK = pdk + kv_off;
      float* dV = pdv + kv_off;
      at::Transpose(pv + kv_off, kv_row, T, D, vt, T);
      at::CopyRows(pk + kv_off, kv_row, T, D, kc);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const int64_t off = b * T * q_row + h * D;
        at::CopyRows(pq + off, q_row, T, D, qc);
        at::CopyRows(pg + off, q_row, T, D, gc);
        const float* A = pa + (b * s.h + h) * T * T;
        if (h == g * group) {  // the group's first head writes dK and dV
          at::HeadBackward(T, D, scale, qc, kc, vt, gc, A, ds, pdq + off, q_row, dK, dV, kv_row);
          continue;
        }
        at::HeadBackward(T, D, scale, qc, kc, vt, gc, A, ds, pdq + off, q_row, dk_h, dv_h, D);
        for (int64_t u = 0; u < T; ++u) {
          float* dk_u = dK + u * kv_row;
          float* dv_u = dV + u * kv_row;
          for (int64_t i = 0; i < D; ++i) {
            dk_u[i] += dk_h[u * D + i];
            dv_u[i] += dv_h[u * D + i];
          }
        }
      }
    }
  });
}

}  // namespace

BRAID_REGISTER_KERNEL(kernels::gqa_forward, DeviceType::kCPU, &GqaForward);
BRAID_REGISTER_KERNEL(kernels::gqa_backward, DeviceType::kCPU, &GqaBackward);

}  // namespace braid::cpu
