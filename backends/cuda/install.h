// Wires the CUDA backend into core for DeviceType::kCUDA: each device's DeviceApi (from
// `factory`), its caching allocator (what core's GetAllocator(cuda:N), and so every tensor's
// storage and GetMemoryStats, use), the copy kernel behind Tensor::To / CopyFrom between the
// host and a CUDA device, and core's CopyAsync for CUDA devices (async_copy.h).
//
// Called once per process before any cuda tensor exists: by //backends/cuda:backend's static
// initialiser with the CUDA runtime (--config=cuda), or by a test with the fake device.
#ifndef BRAID_BACKENDS_CUDA_INSTALL_H_
#define BRAID_BACKENDS_CUDA_INSTALL_H_

#include "backends/cuda/runtime.h"
#include "core/tensor.h"

namespace braid::cuda {

void InstallCudaBackend(DeviceApiFactory factory);

// kernels::copy for kCUDA: host->device, device->host and device->device, any dtype.
//   - With the host on either side the copy is enqueued on the device's current stream and the
//     stream synchronised before returning, because the host tensor may be freed or written the
//     moment this returns (a pageable buffer the device would still read). Batches take the
//     asynchronous path instead: pinned buffers and the copy stream (prefetch.h).
//   - dtype conversion happens on the host side of a copy with the host on one side
//     (host->device: converted before; device->host: after). Device->device with two dtypes
//     (mixed precision's up-casts and roundings, the half fallbacks' conversions) is one
//     conversion kernel on the destination's current stream (DeviceApi::ConvertAsync): no host
//     memory, no synchronisation.
//   - Device->device on two GPUs: the source device's current stream is synchronised first,
//     then the copy runs on the destination's current stream.
// CUDA failures here are fatal (the kernel table's functions return nothing), with CUDA's reason.
void CopyTensorCuda(const Tensor& src, Tensor& dst);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_INSTALL_H_
