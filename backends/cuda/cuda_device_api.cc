#include "backends/cuda/cuda_device_api.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "backends/cuda/convert.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device.h"
#include "core/check.h"

namespace braid::cuda {
namespace {

cudaStream_t S(Stream s) { return static_cast<cudaStream_t>(s.handle); }
cudaEvent_t E(Event e) { return static_cast<cudaEvent_t>(e.handle); }

// Every call runs on this object's device and leaves the thread's current device as it was:
// the allocator may be called from any thread (a tensor freed by a communicator's thread).
class OnDevice {
 public:
  explicit OnDevice(int index) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != index) {
      switched_ = cudaSetDevice(index) == cudaSuccess;
    }
  }
  ~OnDevice() {
    if (switched_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

class CudaDeviceApi final : public DeviceApi {
 public:
  explicit CudaDeviceApi(int index) : index_(index) {}
  int device_index() const override { return index_; }

  absl::StatusOr<void*> Malloc(size_t bytes) override {
    OnDevice on(index_);
    void* p = nullptr;
    BRAID_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&p, bytes), absl::StrCat("cudaMalloc(", bytes, " bytes)")));
    return p;
  }
  absl::Status Free(void* ptr) override {
    OnDevice on(index_);
    return CudaStatus(cudaFree(ptr), "cudaFree");
  }
  absl::StatusOr<void*> HostAllocPinned(size_t bytes) override {
    OnDevice on(index_);
    void* p = nullptr;
    // Portable: usable by every device's copies, not only this one's.
    BRAID_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&p, bytes, cudaHostAllocPortable),
                                     absl::StrCat("cudaHostAlloc(", bytes, " bytes)")));
    return p;
  }
  absl::Status HostFreePinned(void* ptr) override {
    return CudaStatus(cudaFreeHost(ptr), "cudaFreeHost");
  }
  absl::StatusOr<Stream> CreateStream(StreamKind kind) override {
    OnDevice on(index_);
    cudaStream_t s = nullptr;
    unsigned flags = kind == StreamKind::kBlocking ? cudaStreamDefault : cudaStreamNonBlocking;
    BRAID_RETURN_IF_ERROR(
        CudaStatus(cudaStreamCreateWithFlags(&s, flags), "cudaStreamCreateWithFlags"));
    return Stream{s};
  }
  absl::Status DestroyStream(Stream stream) override {
    OnDevice on(index_);
    return CudaStatus(cudaStreamDestroy(S(stream)), "cudaStreamDestroy");
  }
  absl::StatusOr<Event> CreateEvent() override {
    OnDevice on(index_);
    cudaEvent_t e = nullptr;
    // No timing: cheaper to record and query, and all the allocator and prefetcher need.
    BRAID_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                     "cudaEventCreateWithFlags"));
    return Event{e};
  }
  absl::Status DestroyEvent(Event event) override {
    return CudaStatus(cudaEventDestroy(E(event)), "cudaEventDestroy");
  }
  absl::Status RecordEvent(Event event, Stream stream) override {
    OnDevice on(index_);
    return CudaStatus(cudaEventRecord(E(event), S(stream)), "cudaEventRecord");
  }
  absl::StatusOr<bool> QueryEvent(Event event) override {
    cudaError_t r = cudaEventQuery(E(event));
    if (r == cudaErrorNotReady) return false;
    BRAID_RETURN_IF_ERROR(CudaStatus(r, "cudaEventQuery"));
    return true;
  }
  absl::Status StreamWaitEvent(Stream stream, Event event) override {
    OnDevice on(index_);
    return CudaStatus(cudaStreamWaitEvent(S(stream), E(event), 0), "cudaStreamWaitEvent");
  }
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                           Stream stream) override {
    OnDevice on(index_);
    // Device to device goes by cudaMemcpyDefault: with unified addressing it also copies
    // between two GPUs (peer memory), which the plain device-to-device kind does not promise.
    cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                       : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                         : cudaMemcpyDefault;
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, k, S(stream)),
                      absl::StrCat("cudaMemcpyAsync (", CopyKindName(kind), ", ", bytes,
                                   " bytes)"));
  }
  absl::Status ConvertAsync(void* dst, FloatFormat to, const void* src, FloatFormat from,
                            size_t n, Stream stream) override {
    OnDevice on(index_);
    return CudaStatus(LaunchConvert(dst, int(to), src, int(from), int64_t(n), S(stream)),
                      absl::StrCat("dtype conversion kernel (", FloatFormatName(from), " -> ",
                                   FloatFormatName(to), ", ", n, " elements)"));
  }
  absl::Status SynchronizeStream(Stream stream) override {
    return CudaStatus(cudaStreamSynchronize(S(stream)),
                      "cudaStreamSynchronize (also reports earlier asynchronous errors)");
  }
  absl::Status SynchronizeEvent(Event event) override {
    return CudaStatus(cudaEventSynchronize(E(event)), "cudaEventSynchronize");
  }
  absl::Status SynchronizeDevice() override {
    OnDevice on(index_);
    return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

 private:
  const int index_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceApi>> MakeCudaDeviceApi(int index) {
  BRAID_ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  if (index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda:", index, " does not exist: this process sees ", count,
        " CUDA device(s) (CUDA_VISIBLE_DEVICES applies); use cuda:0 .. cuda:", count - 1));
  }
  return std::unique_ptr<DeviceApi>(new CudaDeviceApi(index));
}

}  // namespace braid::cuda
