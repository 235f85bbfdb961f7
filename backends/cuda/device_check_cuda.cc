// PrepareCudaDevice under --config=cuda: the device's runtime, made here, reports CUDA's reason.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device_check.h"
#include "backends/cuda/peak_flops.h"
#include "backends/cuda/prefetch.h"
#include "backends/cuda/runtime.h"
#include "core/check.h"

namespace braid::cuda {

absl::Status PrepareCudaDevice(Device device) {
  absl::StatusOr<DeviceRuntime*> rt = GetRuntime(device.index);
  absl::Status st = rt.ok() ? CudaStatus(cudaSetDevice(device.index), "cudaSetDevice")
                            : rt.status();
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("device \"", device.ToString(), "\": ",
                                              st.message()));
}

absl::StatusOr<double> DevicePeakFlops(Device device, DType dtype, std::string* basis) {
  BRAID_RETURN_IF_ERROR(PrepareCudaDevice(device));
  cudaDeviceProp prop;
  BRAID_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device.index),
                                   "cudaGetDeviceProperties"));
  int clock_khz = 0;  // cudaDeviceProp::clockRate is gone in CUDA 13: the attribute stays
  BRAID_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device.index), "cudaDeviceGetAttribute"));
  GpuProperties gpu{prop.name, prop.major, prop.minor, prop.multiProcessorCount, clock_khz};
  return PeakFlops(gpu, dtype, basis);
}

absl::StatusOr<HalfSupport> DeviceHalfSupport(Device device, std::string* basis) {
  BRAID_RETURN_IF_ERROR(PrepareCudaDevice(device));
  cudaDeviceProp prop;
  BRAID_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device.index),
                                   "cudaGetDeviceProperties"));
  if (basis != nullptr) {
    *basis = absl::StrCat(device.ToString(), " (", prop.name, ", compute capability ", prop.major,
                          ".", prop.minor, ")");
  }
  return HalfSupportOfCapability(prop.major, prop.minor);
}

absl::StatusOr<std::function<Batch()>> PrefetchBatches(Device device,
                                                       std::function<Batch()> next_on_host) {
  BRAID_RETURN_IF_ERROR(PrepareCudaDevice(device));
  BatchProducer produce = [next_on_host = std::move(next_on_host)]() -> std::optional<std::vector<Tensor>> {
    Batch b = next_on_host();
    return std::vector<Tensor>{b.inputs, b.targets};
  };
  absl::StatusOr<std::unique_ptr<BatchPrefetcher>> p = BatchPrefetcher::Create(&RuntimeOf(device), produce);
  if (!p.ok()) return p.status();
  std::shared_ptr<BatchPrefetcher> prefetcher = std::move(*p);
  return std::function<Batch()>([prefetcher, device]() {
    absl::StatusOr<std::optional<std::vector<Tensor>>> next = prefetcher->Next();
    BRAID_CHECK(next.ok() && next->has_value())
        << "prefetching a batch to " << device.ToString() << ": "
        << (next.ok() ? std::string("the data ended") : next.status().ToString());
    return Batch{(**next)[0], (**next)[1]};
  });
}

}  // namespace braid::cuda
