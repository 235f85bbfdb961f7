// The CUDA row kernels' summation orders, run on the host (test-only): sequential (the CPU
// backend's portable order) and the block tree of kernels/reduce.h (per-thread strided partials,
// xor butterflies over 32 lanes, then warp 0 over the warp results). The math tests compose
// rows.h's functions in both orders against the CPU backend.
#ifndef BRAID_BACKENDS_CUDA_MATH_REDUCTION_ORDER_H_
#define BRAID_BACKENDS_CUDA_MATH_REDUCTION_ORDER_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "backends/cuda/math/rows.h"

namespace braid::cuda::math::order {

using Term = std::function<float(int64_t)>;

inline float SeqSum(int64_t n, const Term& f) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += f(i);
  return s;
}

// 32 lanes, each adding its xor partner's value, offsets 16, 8, 4, 2, 1: every lane ends with
// the same sum (float addition commutes).
inline float Butterfly(std::vector<float> v) {
  for (int off = 16; off >= 1; off /= 2) {
    std::vector<float> w(32);
    for (int l = 0; l < 32; ++l) w[size_t(l)] = v[size_t(l)] + v[size_t(l ^ off)];
    v = w;
  }
  return v[0];
}

// The CUDA kernels' block reduction (kernels/reduce.h) with `threads` threads (a multiple of
// 32, at most 1024).
inline float TreeSum(int64_t n, int threads, const Term& f) {
  std::vector<float> part(size_t(threads), 0.f);
  for (int t = 0; t < threads; ++t) {
    for (int64_t i = t; i < n; i += threads) part[size_t(t)] += f(i);
  }
  std::vector<float> warp_sums(32, 0.f);
  for (int w = 0; w < threads / 32; ++w) {
    warp_sums[size_t(w)] =
        Butterfly(std::vector<float>(part.begin() + 32 * w, part.begin() + 32 * (w + 1)));
  }
  return threads == 32 ? warp_sums[0] : Butterfly(warp_sums);
}

// The online softmax state of a row in the kernels' order: each thread pushes its strided
// elements (value(i) loads element i), then butterflies merge states.
inline MaxSum TreeMaxSum(int64_t n, int threads, const Term& value) {
  std::vector<MaxSum> part(size_t(threads), MaxSumEmpty());
  for (int t = 0; t < threads; ++t) {
    for (int64_t i = t; i < n; i += threads) part[size_t(t)] = MaxSumPush(part[size_t(t)], value(i));
  }
  auto butterfly = [](std::vector<MaxSum> v) {
    for (int off = 16; off >= 1; off /= 2) {
      std::vector<MaxSum> w(32);
      for (int l = 0; l < 32; ++l) w[size_t(l)] = MaxSumMerge(v[size_t(l)], v[size_t(l ^ off)]);
      v = w;
    }
    return v[0];
  };
  std::vector<MaxSum> warps(32, MaxSumEmpty());
  for (int w = 0; w < threads / 32; ++w) {
    warps[size_t(w)] =
        butterfly(std::vector<MaxSum>(part.begin() + 32 * w, part.begin() + 32 * (w + 1)));
  }
  return threads == 32 ? warps[0] : butterfly(warps);
}

}  // namespace braid::cuda::math::order

#endif  // BRAID_BACKENDS_CUDA_MATH_REDUCTION_ORDER_H_
