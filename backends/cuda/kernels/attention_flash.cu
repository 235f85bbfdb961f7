// The fused causal attention (flash-attention style): memory linear in T. The tile math is
// backends/cuda/math/flash_attention.h (checked on the CPU in this file's order); this file owns
// the data movement and the warp reductions.
//
// Layout: a warp per row, kFlashRowsPerBlock rows per block sharing one tile of kFlashTile (32)
// keys or queries at a time in shared memory (f32, rows padded to D + 1 floats so that the 32
// lanes reading 32 different rows at the same d hit 32 banks). Lane l owns the tile's l-th key
// (forward, dQ) or query (dK/dV): it computes that score with a sequential dot over d; the
// tile's max and sum are xor butterflies; each lane then owns the head dimensions
// d = lane + 32 r (r < NR, in registers) and accumulates the tile's 32 entries in lane order,
// broadcast by shuffles. Everything accumulates in f32 whatever the input dtype.
//
// Forward: keeps out and lse [B, H, T] (f32) only. Backward: delta_i = dout_i . out_i (a
// [B, H, T] f32 workspace), then two kernels that recompute the probabilities from lse: dQ per
// query row over key tiles, dK and dV per key row over query tiles. Each gradient element is
// written once by one lane (no atomics): deterministic, and the price is computing the scores
// twice in backward.
#include <cuda_runtime_api.h>

#include "backends/cuda/kernels/attention_flash_launch.h"
#include "backends/cuda/kernels/reduce.h"
#include "backends/cuda/math/convert.h"
#include "backends/cuda/math/flash_attention.h"

namespace braid::cuda {
namespace {

using namespace braid::cuda::math;  // NOLINT: the tile math

constexpr int kThreads = 32 * kFlashRowsPerBlock;

struct Dims {
  int64_t B, T, C, H, D;
  float scale;
};

// Element access by dtype: f32 as is, bf16 and f16 as their bits (convert.h's exact roundings).
template <AttentionDType K>
struct Elem;
template <>
struct Elem<AttentionDType::kF32> {
  using T = float;
  static __device__ __forceinline__ float Load(T x) { return x; }
  static __device__ __forceinline__ T Store(float x) { return x; }
};
template <>
struct Elem<AttentionDType::kBF16> {
  using T = uint16_t;
  static __device__ __forceinline__ float Load(T x) { return BF16ToFloat(x); }
  static __device__ __forceinline__ T Store(float x) { return FloatToBF16(x); }
};
template <>
struct Elem<AttentionDType::kF16> {
  using T = uint16_t;
  static __device__ __forceinline__ float Load(T x) { return F16ToFloat(x); }
  static __device__ __forceinline__ T Store(float x) { return FloatToF16(x); }
};

__device__ __forceinline__ int64_t QkvAt(const Dims& s, int64_t b, int64_t t, int64_t which,
                                         int64_t h, int64_t d) {
  return FlashQkvIndex(b, t, which, h, d, s.T, s.C, s.D);
}
__device__ __forceinline__ int64_t OutAt(const Dims& s, int64_t b, int64_t t, int64_t h,
                                         int64_t d) {
  return FlashOutIndex(b, t, h, d, s.T, s.C, s.D);
}

// Loads rows [t0, t0 + kFlashTile) of `which` (0 q, 1 k, 2 v) into a padded [kFlashTile][D + 1]
// tile; rows past T become zeros.
template <AttentionDType K>
__device__ void LoadQkvTile(const typename Elem<K>::T* qkv, const Dims& s, int64_t b, int64_t h,
                            int64_t which, int64_t t0, float* tile) {
  const int stride = int(s.D) + 1;
  for (int e = threadIdx.x; e < kFlashTile * s.D; e += blockDim.x) {
    const int r = e / int(s.D), d = e % int(s.D);
    const int64_t t = t0 + r;
    tile[r * stride + d] = t < s.T ? Elem<K>::Load(qkv[QkvAt(s, b, t, which, h, d)]) : 0.0f;
  }
}

// The same for out/dout-shaped [B, T, C] tensors.
template <AttentionDType K>
__device__ void LoadOutTile(const typename Elem<K>::T* x, const Dims& s, int64_t b, int64_t h,
                            int64_t t0, float* tile) {
  const int stride = int(s.D) + 1;
  for (int e = threadIdx.x; e < kFlashTile * s.D; e += blockDim.x) {
    const int r = e / int(s.D), d = e % int(s.D);
    const int64_t t = t0 + r;
    tile[r * stride + d] = t < s.T ? Elem<K>::Load(x[OutAt(s, b, t, h, d)]) : 0.0f;
  }
}

__device__ __forceinline__ float Dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// grid (B * H, ceil(T / rows)), kThreads threads. Shared: K and V tiles, the block's q rows.
template <AttentionDType K, int NR>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(const typename Elem<K>::T* qkv, Dims s, typename Elem<K>::T* out,
                       float* lse) {
  extern __shared__ float smem[];
  const int stride = int(s.D) + 1;
  float* ks = smem;
  float* vs = ks + kFlashTile * stride;
  float* qs = vs + kFlashTile * stride;  // [rows][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.x, b = bh / s.H, h = bh % s.H;
  const int64_t i0 = int64_t(blockIdx.y) * kFlashRowsPerBlock, i = i0 + warp;
  const bool active = i < s.T;  // the same for the whole warp
  float* q = qs + warp * s.D;
  if (active) {
    for (int64_t d = lane; d < s.D; d += 32) q[d] = Elem<K>::Load(qkv[QkvAt(s, b, i, 0, h, d)]);
  }
  float acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
  FlashRow row = FlashRowStart();
  const int64_t last_row = min(s.T - 1, i0 + kFlashRowsPerBlock - 1);
  for (int64_t t = 0; t <= last_row / kFlashTile; ++t) {
    __syncthreads();  // the previous tile is no longer read (and the q rows are written)
    LoadQkvTile<K>(qkv, s, b, h, 1, t * kFlashTile, ks);
    LoadQkvTile<K>(qkv, s, b, h, 2, t * kFlashTile, vs);
    __syncthreads();
    if (!active) continue;
    const int64_t j = t * kFlashTile + lane;
    const bool visible = FlashVisible(i, j, s.T);
    const float score = FlashScore(visible ? Dot(q, ks + lane * stride, s.D) : 0.0f, s.scale, visible);
    const float alpha = FlashRescale(&row, WarpMax(score));
    const float p = FlashTileProb(score, row);
    FlashAddMass(&row, WarpSum(p));
    for (int r = 0; r < NR; ++r) acc[r] *= alpha;
    for (int jj = 0; jj < kFlashTile; ++jj) {
      const float pj = __shfl_sync(kFullMask, p, jj);
      for (int r = 0; r < NR; ++r) {
        const int d = lane + 32 * r;
        if (d < s.D) acc[r] += pj * vs[jj * stride + d];
      }
    }
  }
  if (!active) return;
  for (int r = 0; r < NR; ++r) {
    const int d = lane + 32 * r;
    if (d < s.D) out[OutAt(s, b, i, h, d)] = Elem<K>::Store(FlashOutput(acc[r], row));
  }
  if (lane == 0) lse[bh * s.T + i] = FlashLogSumExp(row);
}

// delta[bh, i] = dout_i . out_i: a warp per row, kThreads threads, grid ceil(B H T / rows).
template <AttentionDType K>
__global__ void __launch_bounds__(kThreads)
    FlashDeltaKernel(const typename Elem<K>::T* dout, const typename Elem<K>::T* out, Dims s,
                     float* delta) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t task = int64_t(blockIdx.x) * kFlashRowsPerBlock + warp;  // (b H + h) T + i
  if (task >= s.B * s.H * s.T) return;  // the whole warp leaves together
  const int64_t i = task % s.T, bh = task / s.T, h = bh % s.H, b = bh / s.H;
  float part = 0.0f;
  for (int64_t d = lane; d < s.D; d += 32) {
    const int64_t at = OutAt(s, b, i, h, d);
    part += Elem<K>::Load(dout[at]) * Elem<K>::Load(out[at]);
  }
  part = WarpSum(part);
  if (lane == 0) delta[task] = part;
}

// dQ: grid (B * H, ceil(T / rows)). Shared: K and V tiles, the block's q and dout rows.
template <AttentionDType K, int NR>
__global__ void __launch_bounds__(kThreads)
    FlashDqKernel(const typename Elem<K>::T* dout, const typename Elem<K>::T* qkv,
                  const float* lse, const float* delta, Dims s, typename Elem<K>::T* dqkv) {
  extern __shared__ float smem[];
  const int stride = int(s.D) + 1;
  float* ks = smem;
  float* vs = ks + kFlashTile * stride;
  float* qs = vs + kFlashTile * stride;          // [rows][D]
  float* gs = qs + kFlashRowsPerBlock * s.D;     // [rows][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.x, b = bh / s.H, h = bh % s.H;
  const int64_t i0 = int64_t(blockIdx.y) * kFlashRowsPerBlock, i = i0 + warp;
  const bool active = i < s.T;
  float* q = qs + warp * s.D;
  float* go = gs + warp * s.D;
  float row_lse = 0.0f, row_delta = 0.0f;
  if (active) {
    for (int64_t d = lane; d < s.D; d += 32) {
      q[d] = Elem<K>::Load(qkv[QkvAt(s, b, i, 0, h, d)]);
      go[d] = Elem<K>::Load(dout[OutAt(s, b, i, h, d)]);
    }
    row_lse = lse[bh * s.T + i];
    row_delta = delta[bh * s.T + i];
  }
  float dq[NR];
  for (int r = 0; r < NR; ++r) dq[r] = 0.0f;
  const int64_t last_row = min(s.T - 1, i0 + kFlashRowsPerBlock - 1);
  for (int64_t t = 0; t <= last_row / kFlashTile; ++t) {
    __syncthreads();
    LoadQkvTile<K>(qkv, s, b, h, 1, t * kFlashTile, ks);
    LoadQkvTile<K>(qkv, s, b, h, 2, t * kFlashTile, vs);
    __syncthreads();
    if (!active) continue;
    const int64_t j = t * kFlashTile + lane;
    const bool visible = FlashVisible(i, j, s.T);
    const float score = FlashScore(visible ? Dot(q, ks + lane * stride, s.D) : 0.0f, s.scale, visible);
    const float p = FlashRecomputedProb(score, row_lse);
    const float dp = visible ? Dot(go, vs + lane * stride, s.D) : 0.0f;
    const float ds = FlashDScore(p, dp, row_delta, s.scale);
    for (int jj = 0; jj < kFlashTile; ++jj) {
      const float dsj = __shfl_sync(kFullMask, ds, jj);
      for (int r = 0; r < NR; ++r) {
        const int d = lane + 32 * r;
        if (d < s.D) dq[r] += dsj * ks[jj * stride + d];
      }
    }
  }
  if (!active) return;
  for (int r = 0; r < NR; ++r) {
    const int d = lane + 32 * r;
    if (d < s.D) dqkv[QkvAt(s, b, i, 0, h, d)] = Elem<K>::Store(dq[r]);
  }
}

// dK, dV: grid (B * H, ceil(T / rows)), a warp per key row j. Shared: q and dout tiles, their
// rows' lse and delta, the block's k and v rows.
template <AttentionDType K, int NR>
__global__ void __launch_bounds__(kThreads)
    FlashDkDvKernel(const typename Elem<K>::T* dout, const typename Elem<K>::T* qkv,
                    const float* lse, const float* delta, Dims s, typename Elem<K>::T* dqkv) {
  extern __shared__ float smem[];
  const int stride = int(s.D) + 1;
  float* qs = smem;
  float* gs = qs + kFlashTile * stride;
  float* lse_s = gs + kFlashTile * stride;       // [kFlashTile]
  float* delta_s = lse_s + kFlashTile;           // [kFlashTile]
  float* krows = delta_s + kFlashTile;           // [rows][D]
  float* vrows = krows + kFlashRowsPerBlock * s.D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.x, b = bh / s.H, h = bh % s.H;
  const int64_t j0 = int64_t(blockIdx.y) * kFlashRowsPerBlock, j = j0 + warp;
  const bool active = j < s.T;
  float* k = krows + warp * s.D;
  float* v = vrows + warp * s.D;
  if (active) {
    for (int64_t d = lane; d < s.D; d += 32) {
      k[d] = Elem<K>::Load(qkv[QkvAt(s, b, j, 1, h, d)]);
      v[d] = Elem<K>::Load(qkv[QkvAt(s, b, j, 2, h, d)]);
    }
  }
  float dk[NR], dv[NR];
  for (int r = 0; r < NR; ++r) dk[r] = dv[r] = 0.0f;
  // Queries before the block's first key see none of its keys.
  for (int64_t t = j0 / kFlashTile; t * kFlashTile < s.T; ++t) {
    const int64_t t0 = t * kFlashTile;
    __syncthreads();
    LoadQkvTile<K>(qkv, s, b, h, 0, t0, qs);
    LoadOutTile<K>(dout, s, b, h, t0, gs);
    if (threadIdx.x < kFlashTile) {
      const int64_t iq = t0 + threadIdx.x;
      lse_s[threadIdx.x] = iq < s.T ? lse[bh * s.T + iq] : 0.0f;
      delta_s[threadIdx.x] = iq < s.T ? delta[bh * s.T + iq] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    const int64_t i = t0 + lane;
    const bool visible = FlashVisible(i, j, s.T);
    const float score = FlashScore(visible ? Dot(k, qs + lane * stride, s.D) : 0.0f, s.scale, visible);
    const float p = FlashRecomputedProb(score, lse_s[lane]);
    const float dp = visible ? Dot(v, gs + lane * stride, s.D) : 0.0f;
    const float ds = FlashDScore(p, dp, delta_s[lane], s.scale);
    for (int ll = 0; ll < kFlashTile; ++ll) {
      const float pl = __shfl_sync(kFullMask, p, ll);
      const float dsl = __shfl_sync(kFullMask, ds, ll);
      for (int r = 0; r < NR; ++r) {
        const int d = lane + 32 * r;
        if (d < s.D) {
          dk[r] += dsl * qs[ll * stride + d];
          dv[r] += pl * gs[ll * stride + d];
        }
      }
    }
  }
  if (!active) return;
  for (int r = 0; r < NR; ++r) {
    const int d = lane + 32 * r;
    if (d < s.D) {
      dqkv[QkvAt(s, b, j, 1, h, d)] = Elem<K>::Store(dk[r]);
      dqkv[QkvAt(s, b, j, 2, h, d)] = Elem<K>::Store(dv[r]);
    }
  }
}

Dims MakeDims(int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t D = C / H;
  return Dims{B, T, C, H, D, float(1.0 / sqrt(double(D)))};
}

// Shared memory beyond the default 48 KiB must be asked for per kernel (D > 128 only).
template <typename Kernel>
cudaError_t AllowSharedBytes(Kernel kernel, size_t bytes) {
  if (bytes <= (size_t(48) << 10)) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

template <AttentionDType K, int NR>
cudaError_t Forward(const void* qkv, const Dims& s, void* out, float* lse, cudaStream_t stream) {
  using T = typename Elem<K>::T;
  const FlashSharedBytes sh = FlashAttentionSharedBytes(s.D);
  auto kernel = FlashForwardKernel<K, NR>;
  if (cudaError_t e = AllowSharedBytes(kernel, sh.forward); e != cudaSuccess) return e;
  const dim3 grid(unsigned(s.B * s.H), unsigned((s.T + kFlashRowsPerBlock - 1) / kFlashRowsPerBlock));
  kernel<<<grid, kThreads, sh.forward, stream>>>(static_cast<const T*>(qkv), s, static_cast<T*>(out), lse);
  return cudaGetLastError();
}

template <AttentionDType K, int NR>
cudaError_t Backward(const void* dout, const void* qkv, const void* out, const float* lse,
                     const Dims& s, float* delta, void* dqkv, cudaStream_t stream) {
  using T = typename Elem<K>::T;
  const FlashSharedBytes sh = FlashAttentionSharedBytes(s.D);
  auto dq = FlashDqKernel<K, NR>;
  auto dkdv = FlashDkDvKernel<K, NR>;
  if (cudaError_t e = AllowSharedBytes(dq, sh.dq); e != cudaSuccess) return e;
  if (cudaError_t e = AllowSharedBytes(dkdv, sh.dkdv); e != cudaSuccess) return e;
  const int64_t rows = s.B * s.H * s.T;
  FlashDeltaKernel<K><<<unsigned((rows + kFlashRowsPerBlock - 1) / kFlashRowsPerBlock), kThreads,
                        0, stream>>>(static_cast<const T*>(dout), static_cast<const T*>(out), s,
                                     delta);
  const dim3 grid(unsigned(s.B * s.H), unsigned((s.T + kFlashRowsPerBlock - 1) / kFlashRowsPerBlock));
  dq<<<grid, kThreads, sh.dq, stream>>>(static_cast<const T*>(dout), static_cast<const T*>(qkv),
                                        lse, delta, s, static_cast<T*>(dqkv));
  dkdv<<<grid, kThreads, sh.dkdv, stream>>>(static_cast<const T*>(dout),
                                            static_cast<const T*>(qkv), lse, delta, s,
                                            static_cast<T*>(dqkv));
  return cudaGetLastError();
}

// Registers per lane: ceil(D / 32) rounded up to 1, 2, 4 or 8.
template <AttentionDType K, typename F>
cudaError_t ByHeadDim(int64_t d, F&& f) {
  if (d <= 32) return f.template operator()<K, 1>();
  if (d <= 64) return f.template operator()<K, 2>();
  if (d <= 128) return f.template operator()<K, 4>();
  return f.template operator()<K, 8>();
}

template <typename F>
cudaError_t ByDType(AttentionDType dt, int64_t d, F&& f) {
  switch (dt) {
    case AttentionDType::kF32: return ByHeadDim<AttentionDType::kF32>(d, f);
    case AttentionDType::kBF16: return ByHeadDim<AttentionDType::kBF16>(d, f);
    case AttentionDType::kF16: return ByHeadDim<AttentionDType::kF16>(d, f);
  }
  return cudaErrorInvalidValue;
}

struct ForwardCall {
  const void* qkv;
  Dims s;
  void* out;
  float* lse;
  cudaStream_t stream;
  template <AttentionDType K, int NR>
  cudaError_t operator()() const { return Forward<K, NR>(qkv, s, out, lse, stream); }
};

struct BackwardCall {
  const void *dout, *qkv, *out;
  const float* lse;
  Dims s;
  float* delta;
  void* dqkv;
  cudaStream_t stream;
  template <AttentionDType K, int NR>
  cudaError_t operator()() const {
    return Backward<K, NR>(dout, qkv, out, lse, s, delta, dqkv, stream);
  }
};

}  // namespace

cudaError_t LaunchFlashAttentionForward(AttentionDType dtype, const void* qkv, int64_t B,
                                        int64_t T, int64_t C, int64_t H, void* out, float* lse,
                                        cudaStream_t stream) {
  if (B * T * H == 0 || C == 0) return cudaSuccess;
  const Dims s = MakeDims(B, T, C, H);
  if (!FlashAttentionApplies(B, T, H, s.D)) return cudaErrorInvalidValue;  // planned before
  return ByDType(dtype, s.D, ForwardCall{qkv, s, out, lse, stream});
}

cudaError_t LaunchFlashAttentionBackward(AttentionDType dtype, const void* dout, const void* qkv,
                                         const void* out, const float* lse, int64_t B, int64_t T,
                                         int64_t C, int64_t H, float* delta_workspace, void* dqkv,
                                         cudaStream_t stream) {
  if (B * T * H == 0 || C == 0) return cudaSuccess;
  const Dims s = MakeDims(B, T, C, H);
  if (!FlashAttentionApplies(B, T, H, s.D)) return cudaErrorInvalidValue;  // planned before
  return ByDType(dtype, s.D, BackwardCall{dout, qkv, out, lse, s, delta_workspace, dqkv, stream});
}

}  // namespace braid::cuda
