// The f32 axpby kernel's launcher, for callers that already hold device memory.
#ifndef BRAID_BACKENDS_CUDA_AXPBY_H_
#define BRAID_BACKENDS_CUDA_AXPBY_H_

#include <cstdint>

#include <cuda_runtime_api.h>

namespace braid::cuda {

// Enqueues y[i] = a * x[i] + b * y[i], i in [0, n), on `stream`; x and y are device pointers
// that are either equal or do not overlap. With b == 0, y is only written. Any alignment works;
// when x and y are both 16-byte aligned the kernel moves four floats per load and store.
// Returns the launch's error (cudaSuccess once enqueued); errors while running surface at the
// next synchronisation, as usual in CUDA.
cudaError_t LaunchAxpbyF32(float a, const float* x, float b, float* y, int64_t n,
                           cudaStream_t stream);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_AXPBY_H_
