#include "backends/cuda/install.h"

#include <memory>
#include <utility>

#include "backends/cuda/async_copy.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/kernels.h"
#include "core/pinned_host.h"

namespace braid::cuda {
namespace {

FloatFormat Format(DType t) {
  switch (t) {
    case DType::kBF16: return FloatFormat::kBF16;
    case DType::kF16: return FloatFormat::kF16;
    default: return FloatFormat::kF32;
  }
}

void CopyBytes(DeviceRuntime& rt, void* dst, const void* src, size_t bytes, CopyKind kind,
               bool sync) {
  if (bytes == 0) return;
  Stream s = rt.current_stream();
  BRAID_CHECK_OK(rt.api().MemcpyAsync(dst, src, bytes, kind, s));
  if (sync) BRAID_CHECK_OK(rt.api().SynchronizeStream(s));
}

// Page-locked host memory for offloaded state (ZeRO's pin_memory, core/pinned_host.h): copies
// between it and the device are DMAs. Not pooled, unlike the batch staging buffers
// (pinned_pool.h): offloaded state is allocated once and lives for the run.
class PinnedHostAllocator final : public Allocator {
 public:
  explicit PinnedHostAllocator(DeviceApi* api) : api_(api) {}
  void* Allocate(size_t bytes) override {
    absl::StatusOr<void*> p = api_->HostAllocPinned(bytes == 0 ? 1 : bytes);
    BRAID_CHECK(p.ok()) << "out of pinned host memory: asked for " << bytes << " bytes while holding "
                        << stats().current_bytes << " (" << p.status().message()
                        << "); set pin_memory false to offload into pageable memory";
    RecordAlloc(bytes);
    return *p;
  }
  void Deallocate(void* ptr, size_t bytes) override {
    RecordFree(bytes);
    BRAID_CHECK_OK(api_->HostFreePinned(ptr));
  }

 private:
  DeviceApi* const api_;
};

}  // namespace

void CopyTensorCuda(const Tensor& src, Tensor& dst) {
  const bool src_dev = src.device().type == DeviceType::kCUDA;
  const bool dst_dev = dst.device().type == DeviceType::kCUDA;
  BRAID_CHECK(src.numel() == dst.numel()) << "copy from " << src.DescribeForError() << " into "
                                          << dst.DescribeForError() << ": element counts differ";
  if (!src_dev) {  // host -> device
    Tensor h = src.dtype() == dst.dtype() ? src : src.To(dst.dtype());
    CopyBytes(RuntimeOf(dst.device()), dst.raw_data(), h.raw_data(), dst.nbytes(),
              CopyKind::kHostToDevice, /*sync=*/true);
    return;
  }
  if (!dst_dev) {  // device -> host
    if (src.dtype() == dst.dtype()) {
      CopyBytes(RuntimeOf(src.device()), dst.raw_data(), src.raw_data(), dst.nbytes(),
                CopyKind::kDeviceToHost, true);
      return;
    }
    Tensor h = Tensor::Empty(src.shape(), src.dtype(), dst.device());
    CopyBytes(RuntimeOf(src.device()), h.raw_data(), src.raw_data(), h.nbytes(),
              CopyKind::kDeviceToHost, true);
    dst.CopyFrom(h);  // converts on the host
    return;
  }
  if (src.dtype() != dst.dtype()) {  // device -> device, two dtypes: a conversion kernel
    BRAID_CHECK(IsFloating(src.dtype()) && IsFloating(dst.dtype()))
        << "copy from " << src.DescribeForError() << " into " << dst.DescribeForError()
        << ": the device converts only between f32, bf16 and f16";
    Tensor from = src;
    if (src.device() != dst.device()) from = src.To(dst.device());  // same dtype, then convert
    DeviceRuntime& rt = RuntimeOf(dst.device());
    if (dst.numel() == 0) return;
    BRAID_CHECK_OK(rt.api().ConvertAsync(dst.raw_data(), Format(dst.dtype()), from.raw_data(),
                                         Format(from.dtype()), size_t(dst.numel()),
                                         rt.current_stream()));
    return;
  }
  if (src.raw_data() == dst.raw_data()) return;
  if (src.device() != dst.device()) {
    DeviceRuntime& from = RuntimeOf(src.device());
    BRAID_CHECK_OK(from.api().SynchronizeStream(from.current_stream()));
  }
  CopyBytes(RuntimeOf(dst.device()), dst.raw_data(), src.raw_data(), dst.nbytes(),
            CopyKind::kDeviceToDevice, false);
}

void InstallCudaBackend(DeviceApiFactory factory) {
  SetDeviceApiFactory(std::move(factory));
  RegisterAllocatorFactory(DeviceType::kCUDA, [](Device d) -> std::unique_ptr<Allocator> {
    DeviceRuntime* rt = &RuntimeOf(d);  // fails fast, with CUDA's reason, without a device
    return std::make_unique<CachingAllocator>(d, &rt->api(),
                                              [rt] { return rt->current_stream(); });
  });
  kernels::copy.Register(DeviceType::kCUDA, &CopyTensorCuda);
  RegisterAsyncCopy(DeviceType::kCUDA, &CopyAsyncCuda);
  RegisterPinnedHostAllocator(DeviceType::kCUDA, [](Device compute) -> std::unique_ptr<Allocator> {
    // Portable pinned memory (cudaHostAllocPortable): the first device that asks pins it for all.
    return std::make_unique<PinnedHostAllocator>(&RuntimeOf(compute).api());
  });
}

}  // namespace braid::cuda
