// core's CopyAsync (core/async_copy.h) for CUDA devices, over the device's DeviceApi: the copy
// is a MemcpyAsync on the compute stream (CopyQueue::kCompute) or on the copy stream
// (kCopy), followed by an event recorded on that stream. A kCopy copy first makes the copy stream
// wait for an event recorded on the current stream at the call, because the copy reads or writes
// memory that work already enqueued there may still use (a freshly allocated buffer's previous
// owner, the gradient a kernel is producing); the current stream waits for the copy only when
// OrderBeforeCurrentStream says so. Events come from a per-device pool and go back to it when
// the InFlightCopy is destroyed (a later record does not change what an earlier wait waited for).
// Registered by InstallCudaBackend (install.h).
#ifndef BRAID_BACKENDS_CUDA_ASYNC_COPY_H_
#define BRAID_BACKENDS_CUDA_ASYNC_COPY_H_

#include <memory>

#include "core/async_copy.h"

namespace braid::cuda {

std::unique_ptr<InFlightCopy> CopyAsyncCuda(const Tensor& src, const Tensor& dst, CopyQueue queue);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_ASYNC_COPY_H_
