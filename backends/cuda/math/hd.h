// BRAID_HD: marks per-element math that both nvcc (device and host code) and the host C++
// compiler build, so the CUDA kernels and the CPU tests run the very same source.
#ifndef BRAID_BACKENDS_CUDA_MATH_HD_H_
#define BRAID_BACKENDS_CUDA_MATH_HD_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BRAID_HD __host__ __device__ __forceinline__
#else
#define BRAID_HD inline
#endif

namespace braid::cuda::math {

// Bit casts usable on both sides (std::bit_cast is C++20; device code has intrinsics).
BRAID_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

BRAID_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

}  // namespace braid::cuda::math

#endif  // BRAID_BACKENDS_CUDA_MATH_HD_H_
