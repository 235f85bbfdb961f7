// What a test target promises about this machine's GPUs, for the cases that need GPUs (or need
// none). third_party/cuda/cuda.bzl's cuda_cc_test runs such cases in targets of their own, which
// Bazel skips where the machine lacks what they need (third_party/host), and sets:
//   BRAID_REQUIRE_GPU=N     (name_gpu: 1, name_multi_gpu: 2) the machine has N usable GPUs or
//                           more: a case that needs k of them fails, instead of skipping, when
//                           it finds fewer than min(k, N);
//   BRAID_REQUIRE_NO_GPU=1  (name_no_gpu) the machine has none: a case about the no-GPU path
//                           fails, instead of skipping, when it finds one.
// Unset, as when a binary built here runs unfiltered on a GPU machine without Bazel
// (docs/GPU.md), such cases skip saying why: gtest prints SKIPPED. A skip never reaches Bazel,
// which would show it as PASSED. Header-only, no CUDA: any test can include it.
#ifndef BRAID_BACKENDS_CUDA_GPU_TEST_ENV_H_
#define BRAID_BACKENDS_CUDA_GPU_TEST_ENV_H_

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"

namespace braid::gpu_test {

// BRAID_REQUIRE_GPU's N; 0 when unset or not a number.
inline int RequiredGpus() {
  const char* v = std::getenv("BRAID_REQUIRE_GPU");
  int n = 0;
  if (v == nullptr || !absl::SimpleAtoi(v, &n) || n < 0) return 0;
  return n;
}

// Whether a case that needs `needed` GPUs and found `found` must fail rather than skip.
inline bool MustFailWithGpus(int needed, int found) {
  return found < std::min(needed, RequiredGpus());
}

// Whether a case about the no-GPU path that found a GPU must fail rather than skip.
inline bool MustFailWithAGpu() {
  const char* v = std::getenv("BRAID_REQUIRE_NO_GPU");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace braid::gpu_test

#endif  // BRAID_BACKENDS_CUDA_GPU_TEST_ENV_H_
