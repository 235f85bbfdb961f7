// The documented (reference) causal attention kernel. It produces the [B, H, T, T]
// probabilities the kernel table's attention slot saves for backward, which cuDNN's fused SDPA
// never forms, so it is the path for that slot (attention_plan.h); straightforward rather than
// fast: O(T^2 D) work with strided K/V reads.
//
// Forward, one block of kAttnThreads per (batch, head, query row i): scores s_j = scale q_i.k_j
// (sequential dot over D) for j <= i into att's row, their max and sum of exp by block
// reductions (reduce.h), p_j = exp(s_j - max) / sum, zeros above the diagonal, then
// out_i[d] = sum_{j<=i} p_j v_j[d] (sequential over j).
// Backward, first kernel per query row i: dp_j = dout_i.v_j, dot = sum_j p_j dp_j,
// ds_j = p_j (dp_j - dot) scale into a scratch [B, H, T, T], dq_i = sum_{j<=i} ds_j k_j. Second
// kernel per key row j: dk_j = sum_{i>=j} ds_ij q_i, dv_j = sum_{i>=j} p_ij dout_i.
// rows_math_test.cc runs this exact algorithm on the CPU against the CPU backend.
#include "backends/cuda/kernels/launchers.h"
#include "backends/cuda/kernels/reduce.h"

namespace braid::cuda {
namespace {

using namespace braid::cuda::math;  // NOLINT: the per-element functions

constexpr int kAttnThreads = 128;

struct Dims {
  int64_t B, T, C, H, D;
  float scale;
};

__global__ void AttentionForwardKernel(const float* qkv, Dims s, float* out, float* att) {
  __shared__ float shared[64];
  const int64_t task = blockIdx.x;  // (b * H + h) * T + i
  const int64_t i = task % s.T, bh = task / s.T, h = bh % s.H, b = bh / s.H;
  const int64_t ld = 3 * s.C;
  const float* q = qkv + (b * s.T + i) * ld + h * s.D;
  const float* k0 = qkv + b * s.T * ld + s.C + h * s.D;
  const float* v0 = k0 + s.C;
  float* row = att + task * s.T;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* k = k0 + j * ld;
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
    for (int64_t j = 0; j <= i; ++j) acc += row[j] * v0[j * ld + d];
    out[(b * s.T + i) * s.C + h * s.D + d] = acc;
  }
}

__global__ void AttentionDqKernel(const float* dout, const float* qkv, const float* att, Dims s,
                                  float* ds_all, float* dqkv) {
  __shared__ float shared[64];
  const int64_t task = blockIdx.x;
  const int64_t i = task % s.T, bh = task / s.T, h = bh % s.H, b = bh / s.H;
  const int64_t ld = 3 * s.C;
  const float* go = dout + (b * s.T + i) * s.C + h * s.D;
  const float* k0 = qkv + b * s.T * ld + s.C + h * s.D;
  const float* v0 = k0 + s.C;
  const float* p = att + task * s.T;
  float* ds = ds_all + task * s.T;
  float dot = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* v = v0 + j * ld;
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
    for (int64_t j = 0; j <= i; ++j) acc += ds[j] * k0[j * ld + d];
    dqkv[(b * s.T + i) * ld + h * s.D + d] = acc;
  }
}

__global__ void AttentionDkDvKernel(const float* dout, const float* qkv, const float* att,
                                    const float* ds_all, Dims s, float* dqkv) {
  const int64_t task = blockIdx.x;  // (b * H + h) * T + j
  const int64_t j = task % s.T, bh = task / s.T, h = bh % s.H, b = bh / s.H;
  const int64_t ld = 3 * s.C;
  const float* q0 = qkv + b * s.T * ld + h * s.D;
  const float* go0 = dout + b * s.T * s.C + h * s.D;
  const float* p = att + bh * s.T * s.T;
  const float* ds = ds_all + bh * s.T * s.T;
  for (int64_t d = threadIdx.x; d < s.D; d += blockDim.x) {
    float dk = 0, dv = 0;
    for (int64_t i = j; i < s.T; ++i) {
      dk += ds[i * s.T + j] * q0[i * ld + d];
      dv += p[i * s.T + j] * go0[i * s.C + d];
    }
    dqkv[(b * s.T + j) * ld + s.C + h * s.D + d] = dk;
    dqkv[(b * s.T + j) * ld + 2 * s.C + h * s.D + d] = dv;
  }
}

Dims MakeDims(int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t D = C / H;
  return Dims{B, T, C, H, D, float(1.0 / sqrt(double(D)))};
}

}  // namespace

cudaError_t LaunchAttentionForward(const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                                   float* out, float* att, cudaStream_t s) {
  const int64_t tasks = B * H * T;
  if (tasks == 0 || C == 0) return cudaSuccess;
  AttentionForwardKernel<<<tasks, kAttnThreads, 0, s>>>(qkv, MakeDims(B, T, C, H), out, att);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionBackward(const float* dout, const float* qkv, const float* att,
                                    int64_t B, int64_t T, int64_t C, int64_t H, float* ds_scratch,
                                    float* dqkv, cudaStream_t s) {
  const int64_t tasks = B * H * T;
  if (tasks == 0 || C == 0) return cudaSuccess;
  const Dims d = MakeDims(B, T, C, H);
  AttentionDqKernel<<<tasks, kAttnThreads, 0, s>>>(dout, qkv, att, d, ds_scratch, dqkv);
  AttentionDkDvKernel<<<tasks, 64, 0, s>>>(dout, qkv, att, ds_scratch, d, dqkv);
  return cudaGetLastError();
}

}  // namespace braid::cuda
