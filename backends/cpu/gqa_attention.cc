// Causal grouped-query attention for the CPU (f32), the gqa_forward/gqa_backward slots.
//
// Query head h reads K/V head h / (H / Hkv) in place: K and V are never repeated. Forward runs
// one task per (batch, query head); backward one per (batch, K/V head), which owns that head's
// dk and dv and its group's dq, so the sums over the group are formed by one thread in a fixed
// order: the same bits for any thread count, with no atomics.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cpu {
namespace {

namespace checks = kernels::checks;
constexpr DType kF32 = DType::kF32;
// Multiply-adds per parallel task: one (batch, head) of a short sequence is too little work.
constexpr int64_t kAttentionGrain = 1 << 16;

float Dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * b[i + j];
  }
  float s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void GqaForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& att) {
  const auto s = checks::GqaForward("cpu", kF32, q, k, v, out, att);
  const int64_t group = s.h / s.hkv, T = s.t, D = s.d;
  const int64_t q_row = s.h * D, kv_row = s.hkv * D;  // one time step's stride
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  float* po = out.data<float>();
  float* pa = att.data<float>();
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t grain = std::max<int64_t>(1, kAttentionGrain / std::max<int64_t>(T * T * D, 1));
  ParallelFor(s.b * s.h, grain, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t b = j / s.h, h = j % s.h, g = h / group;
      const float* Q = pq + b * T * q_row + h * D;
      const float* K = pk + b * T * kv_row + g * D;
      const float* V = pv + b * T * kv_row + g * D;
      float* O = po + b * T * q_row + h * D;
      float* A = pa + j * T * T;
      for (int64_t t = 0; t < T; ++t) {
        float* row = A + t * T;
        float mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          row[u] = Dot(Q + t * q_row, K + u * kv_row, D) * scale;
          mx = std::max(mx, row[u]);
        }
        float sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          row[u] = std::exp(row[u] - mx);
          sum += row[u];
        }
        const float inv = 1.0f / sum;
        for (int64_t u = 0; u <= t; ++u) row[u] *= inv;
        for (int64_t u = t + 1; u < T; ++u) row[u] = 0.0f;
        float* o = O + t * q_row;
        std::fill(o, o + D, 0.0f);
        for (int64_t u = 0; u <= t; ++u) Axpy(row[u], V + u * kv_row, o, D);
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
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t grain =
      std::max<int64_t>(1, kAttentionGrain / std::max<int64_t>(group * T * T * D, 1));
  ParallelFor(s.b * s.hkv, grain, [&](int64_t j0, int64_t j1) {
    std::vector<float> dA(static_cast<size_t>(T));
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t b = j / s.hkv, g = j % s.hkv;
      const float* K = pk + b * T * kv_row + g * D;
      const float* V = pv + b * T * kv_row + g * D;
      float* dK = pdk + b * T * kv_row + g * D;
      float* dV = pdv + b * T * kv_row + g * D;
      for (int64_t u = 0; u < T; ++u) {
        std::fill(dK + u * kv_row, dK + u * kv_row + D, 0.0f);
        std::fill(dV + u * kv_row, dV + u * kv_row + D, 0.0f);
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* Q = pq + b * T * q_row + h * D;
        const float* G = pg + b * T * q_row + h * D;
        float* dQ = pdq + b * T * q_row + h * D;
        const float* A = pa + (b * s.h + h) * T * T;
        for (int64_t t = 0; t < T; ++t) {
          const float* row = A + t * T;
          const float* go = G + t * q_row;
          // out[t] = sum_u A[t,u] v[u]: dA[u] = <dout[t], v[u]>, dv[u] += A[t,u] dout[t].
          float dot_pa = 0;
          for (int64_t u = 0; u <= t; ++u) {
            dA[size_t(u)] = Dot(go, V + u * kv_row, D);
            dot_pa += row[u] * dA[size_t(u)];
            Axpy(row[u], go, dV + u * kv_row, D);
          }
          float* dq_t = dQ + t * q_row;
          std::fill(dq_t, dq_t + D, 0.0f);
          for (int64_t u = 0; u <= t; ++u) {
            // Softmax backward, then the scaled q.k products.
            const float ds = row[u] * (dA[size_t(u)] - dot_pa) * scale;
            Axpy(ds, K + u * kv_row, dq_t, D);
            Axpy(ds, Q + t * q_row, dK + u * kv_row, D);
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
