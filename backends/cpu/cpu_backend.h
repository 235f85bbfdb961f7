// Braid's CPU backend: fills every slot of core/kernels.h for DeviceType::kCPU (link
// //backends/cpu; registration happens at static initialisation).
//
// Matrix products go to OpenBLAS; everything else is fused loops, hand-vectorised with AVX2+FMA
// when the CPU has it (chosen at run time, so binaries stay portable) and portable C++
// otherwise. Threads: BRAID_NUM_THREADS, else OMP_NUM_THREADS, else 1 for Braid's own kernels;
// OpenBLAS follows OPENBLAS_NUM_THREADS until SetNumThreads says otherwise. Every kernel is
// re-entrant (several cpu:N devices may run at once from their own threads; a caller that finds
// the pool busy runs its loop alone) and, matmul aside, gives the same bits for any thread count. The optimizer kernels flush subnormals to zero (see simd.h).
#ifndef BRAID_BACKENDS_CPU_CPU_BACKEND_H_
#define BRAID_BACKENDS_CPU_CPU_BACKEND_H_

namespace braid::cpu {

// Threads used by Braid's CPU kernels (the default pool).
int NumThreads();
// Sets the kernels' thread count and OpenBLAS's (overriding the environment). Call while no
// kernel is running (start-up, tests, benchmarks).
void SetNumThreads(int n);

// Whether the AVX2+FMA code paths are in use.
bool SimdEnabled();
// Forces the portable paths (false) or re-enables AVX2 where the CPU has it (true); for tests
// and benchmarks of the fallback. BRAID_CPU_SIMD=0 in the environment does the same at start.
void SetSimdEnabled(bool enabled);

}  // namespace braid::cpu

#endif  // BRAID_BACKENDS_CPU_CPU_BACKEND_H_
