// The documented (reference) causal attention kernels, multi-head and grouped-query: they
// produce the [B, H, T, T] probabilities the kernel table's attention_forward and gqa_forward
// slots save for backward, which cuDNN's fused SDPA never forms, so they are the path for those
// slots (attention_plan.h); straightforward rather than fast: O(T^2 D) work with strided K/V
// reads. One set of kernels serves both: GPT's packed qkv [B, T, 3C] is q, k and v at offsets
// 0, C and 2C with a row stride of 3C and as many K/V heads as query heads; Llama's q [B, T, H,
// D] and k, v [B, T, Hkv, D] have query head h read K/V head h / (H / Hkv) in place.
//
// Forward, one block of kAttnThreads per (batch, head, query row i): scores s_j = scale q_i.k_j
// (sequential dot over D) for j <= i into att's row, their max and sum of exp by block
// reductions (reduce.h), p_j = exp(s_j - max) / sum, zeros above the diagonal, then
// out_i[d] = sum_{j<=i} p_j v_j[d] (sequential over j).
// Backward, first kernel per query row i: dp_j = dout_i.v_j, dot = sum_j p_j dp_j,
// ds_j = p_j (dp_j - dot) scale into a scratch [B, H, T, T], dq_i = sum_{j<=i} ds_j k_j. Second
// kernel per (K/V head, key row j): dk_j = sum over the group's query heads (in order) of
// sum_{i>=j} ds_ij q_i, dv_j likewise of p_ij dout_i: no atomics, deterministic.
// rows_math_test.cc runs this exact algorithm on the CPU against the CPU backend.
#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/kernels/reduce.h"

namespace braid::cuda {
namespace {

using namespace braid::cuda::math;  // NOLINT: the per-element functions

constexpr int kAttnThreads = 128;

// Element (b, t, head, i) of an operand is at base[(b * T + t) * ld + head * D + i]: q and dq
// with q_ld, k, v, dk and dv with kv_ld, out and dout with o_ld.
struct Dims {
  int64_t B, T, H, Hkv, D;
  int64_t q_ld, kv_ld, o_ld;
  float scale;
};

// The query row of a block of the forward and dq kernels (blockIdx.x = (b * H + h) * T + i):
// its batch entry, head, K/V head and where that K/V head's keys and values start.
struct QueryRow {
  int64_t task, i, b, h;
  const float* k0;
  const float* v0;
  __device__ QueryRow(const Dims& s, const float* k_all, const float* v_all)
      : task(blockIdx.x), i(task % s.T) {
    const int64_t bh = task / s.T;
    h = bh % s.H;
    b = bh / s.H;
    const int64_t g = h / (s.H / s.Hkv);
    k0 = k_all + b * s.T * s.kv_ld + g * s.D;
    v0 = v_all + b * s.T * s.kv_ld + g * s.D;
  }
};

__global__ void AttentionForwardKernel(const float* q_all, const float* k_all, const float* v_all,
                                       Dims s, float* out, float* att) {
  __shared__ float shared[64];
  const QueryRow r(s, k_all, v_all);
  const int64_t i = r.i, b = r.b, h = r.h;
  const float* k0 = r.k0;
  const float* v0 = r.v0;
  const float* q = q_all + (b * s.T + i) * s.q_ld + h * s.D;
  float* row = att + r.task * s.T;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* k = k0 + j * s.kv_ld;
    float dot = 0;
    for (int64_t d = 0; d < s.D; ++d) dot += q[d] * k[d];
    const float score = AttentionScore(dot, s.scale);
    row[j] = score;
    mx = fmaxf(mx, score);
  }
  mx = RowMax(mx, shared);
  float sum = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float e = expf(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  sum = RowSum(sum, shared);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < s.T; j += blockDim.x) {
    row[j] = AttentionVisible(i, j) ? row[j] * inv : 0.0f;
  }
  __syncthreads();  // the row's probabilities, written by all threads, are read by each below
  for (int64_t d = threadIdx.x; d < s.D; d += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j <= i; ++j) acc += row[j] * v0[j * s.kv_ld + d];
    out[(b * s.T + i) * s.o_ld + h * s.D + d] = acc;
  }
}

__global__ void AttentionDqKernel(const float* dout, const float* k_all, const float* v_all,
                                  const float* att, Dims s, float* ds_all, float* dq) {
  __shared__ float shared[64];
  const QueryRow r(s, k_all, v_all);
  const int64_t i = r.i, b = r.b, h = r.h;
  const float* k0 = r.k0;
  const float* v0 = r.v0;
  const float* go = dout + (b * s.T + i) * s.o_ld + h * s.D;
  const float* p = att + r.task * s.T;
  float* ds = ds_all + r.task * s.T;
  float dot = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* v = v0 + j * s.kv_ld;
    float dp = 0;
    for (int64_t d = 0; d < s.D; ++d) dp += go[d] * v[d];
    ds[j] = dp;
    dot += p[j] * dp;
  }
  dot = RowSum(dot, shared);
  for (int64_t j = threadIdx.x; j < s.T; j += blockDim.x) {
    ds[j] = AttentionVisible(i, j) ? AttentionDScore(p[j], ds[j], dot, s.scale) : 0.0f;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < s.D; d += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j <= i; ++j) acc += ds[j] * k0[j * s.kv_ld + d];
    dq[(b * s.T + i) * s.q_ld + h * s.D + d] = acc;
  }
}

__global__ void AttentionDkDvKernel(const float* dout, const float* q_all, const float* att,
                                    const float* ds_all, Dims s, float* dk, float* dv) {
  const int64_t task = blockIdx.x;  // (b * Hkv + g) * T + j
  const int64_t j = task % s.T, bg = task / s.T, g = bg % s.Hkv, b = bg / s.Hkv;
  const int64_t group = s.H / s.Hkv;
  for (int64_t d = threadIdx.x; d < s.D; d += blockDim.x) {
    float dk_acc = 0, dv_acc = 0;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* q0 = q_all + b * s.T * s.q_ld + h * s.D;
      const float* go0 = dout + b * s.T * s.o_ld + h * s.D;
      const float* p = att + (b * s.H + h) * s.T * s.T;
      const float* ds = ds_all + (b * s.H + h) * s.T * s.T;
      for (int64_t i = j; i < s.T; ++i) {
        dk_acc += ds[i * s.T + j] * q0[i * s.q_ld + d];
        dv_acc += p[i * s.T + j] * go0[i * s.o_ld + d];
      }
    }
    dk[(b * s.T + j) * s.kv_ld + g * s.D + d] = dk_acc;
    dv[(b * s.T + j) * s.kv_ld + g * s.D + d] = dv_acc;
  }
}

cudaError_t Forward(const float* q, const float* k, const float* v, const Dims& d, float* out,
                    float* att, cudaStream_t s) {
  const int64_t tasks = d.B * d.H * d.T;
  if (tasks == 0 || d.D == 0) return cudaSuccess;
  AttentionForwardKernel<<<tasks, kAttnThreads, 0, s>>>(q, k, v, d, out, att);
  return cudaGetLastError();
}

cudaError_t Backward(const float* dout, const float* q, const float* k, const float* v,
                     const float* att, const Dims& d, float* ds_scratch, float* dq, float* dk,
                     float* dv, cudaStream_t s) {
  if (d.B * d.H * d.T == 0 || d.D == 0) return cudaSuccess;
  AttentionDqKernel<<<d.B * d.H * d.T, kAttnThreads, 0, s>>>(dout, k, v, att, d, ds_scratch, dq);
  AttentionDkDvKernel<<<d.B * d.Hkv * d.T, 64, 0, s>>>(dout, q, att, ds_scratch, d, dk, dv);
  return cudaGetLastError();
}

float Scale(int64_t D) { return float(1.0 / sqrt(double(D))); }

// GPT's packed qkv [B, T, 3C]: q, k, v at offsets 0, C, 2C, rows 3C apart; out [B, T, C].
Dims PackedDims(int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t D = C / H;
  return Dims{B, T, H, H, D, 3 * C, 3 * C, C, Scale(D)};
}

Dims GqaDims(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  return Dims{B, T, H, Hkv, D, H * D, Hkv * D, H * D, Scale(D)};
}

}  // namespace

cudaError_t LaunchAttentionForward(const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                                   float* out, float* att, cudaStream_t s) {
  if (C == 0) return cudaSuccess;
  return Forward(qkv, qkv + C, qkv + 2 * C, PackedDims(B, T, C, H), out, att, s);
}

cudaError_t LaunchAttentionBackward(const float* dout, const float* qkv, const float* att,
                                    int64_t B, int64_t T, int64_t C, int64_t H, float* ds_scratch,
                                    float* dqkv, cudaStream_t s) {
  if (C == 0) return cudaSuccess;
  return Backward(dout, qkv, qkv + C, qkv + 2 * C, att, PackedDims(B, T, C, H), ds_scratch, dqkv,
                  dqkv + C, dqkv + 2 * C, s);
}

cudaError_t LaunchGqaForward(const float* q, const float* k, const float* v, int64_t B,
                             int64_t T, int64_t H, int64_t Hkv, int64_t D, float* out, float* att,
                             cudaStream_t s) {
  return Forward(q, k, v, GqaDims(B, T, H, Hkv, D), out, att, s);
}

cudaError_t LaunchGqaBackward(const float* dout, const float* q, const float* k, const float* v,
                              const float* att, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                              int64_t D, float* ds_scratch, float* dq, float* dk, float* dv,
                              cudaStream_t s) {
  return Backward(dout, q, k, v, att, GqaDims(B, T, H, Hkv, D), ds_scratch, dq, dk, dv, s);
}

}  // namespace braid::cuda
