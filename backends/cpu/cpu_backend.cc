#include "backends/cpu/cpu_backend.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

#include "backends/cpu/simd.h"
#include "backends/cpu/thread_pool.h"

namespace braid::cpu {

namespace {

bool CpuHasAvx2() {
#if BRAID_HAVE_X86
  __builtin_cpu_init();  // may run before other static constructors
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool SimdFromEnv() {
  const char* v = std::getenv("BRAID_CPU_SIMD");
  return !(v != nullptr && std::strcmp(v, "0") == 0);
}

}  // namespace

namespace internal {
std::atomic<bool> g_use_avx2{CpuHasAvx2() && SimdFromEnv()};
}  // namespace internal

int NumThreads() { return DefaultPool().num_threads(); }

void SetNumThreads(int n) {
  SetDefaultPoolThreads(n);
  openblas_set_num_threads(n);
}

bool SimdEnabled() { return UseAvx2(); }

void SetSimdEnabled(bool enabled) {
  internal::g_use_avx2.store(enabled && CpuHasAvx2(), std::memory_order_relaxed);
}

}  // namespace braid::cpu
