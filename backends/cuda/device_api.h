// The few device operations the CUDA backend's host-side logic needs (memory, pinned host
// memory, streams, events, asynchronous copies), as an interface with two implementations:
//
//   - CudaDeviceApi (cuda_device_api.h, --config=cuda only): the CUDA runtime, one device.
//   - FakeDeviceApi (fake_device_api.h, every build): plain host memory, each stream an ordered
//     queue of pending operations that tests run step by step, events as recorded positions.
//
// The caching allocator, the pinned pool, the batch prefetcher and the tensor copies are written
// against this interface only, so their ordering and bookkeeping are tested on a machine without
// a GPU (the fake) and run unchanged on one (the runtime).
//
// Semantics are CUDA's, and the fake keeps them:
//   - work on one stream runs in the order it was enqueued;
//   - RecordEvent captures the stream's position at the call; QueryEvent says whether the stream
//     has passed it (an event never recorded counts as complete, as in CUDA);
//   - StreamWaitEvent makes the stream wait for the event's most recent record *at the time of
//     the call*: recording the event again later does not change what the wait waits for.
#ifndef BRAID_BACKENDS_CUDA_DEVICE_API_H_
#define BRAID_BACKENDS_CUDA_DEVICE_API_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace braid::cuda {

// Opaque handles: cudaStream_t / cudaEvent_t in the runtime implementation, the fake's own
// objects there. A null stream is CUDA's legacy default stream.
struct Stream {
  void* handle = nullptr;
  bool operator==(const Stream& o) const { return handle == o.handle; }
  bool operator!=(const Stream& o) const { return handle != o.handle; }
};
struct Event {
  void* handle = nullptr;
  bool operator==(const Event& o) const { return handle == o.handle; }
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
const char* CopyKindName(CopyKind kind);

// The element formats ConvertAsync converts between (core's kF32, kBF16, kF16; this header
// depends on nothing of core's).
enum class FloatFormat { kF32, kBF16, kF16 };
const char* FloatFormatName(FloatFormat f);

// Whether a new stream synchronises with the legacy default stream. The compute stream is
// blocking on purpose: the NCCL communicator orders its collectives after the caller's work by
// recording an event on the legacy default stream, which only waits for blocking streams.
enum class StreamKind { kBlocking, kNonBlocking };

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;

  // The CUDA device index this object works on ("cuda:N").
  virtual int device_index() const = 0;

  // Device memory. Malloc reports running out as RESOURCE_EXHAUSTED carrying the device's reason.
  virtual absl::StatusOr<void*> Malloc(size_t bytes) = 0;
  virtual absl::Status Free(void* ptr) = 0;

  // Page-locked host memory: host<->device copies from it are true DMA and asynchronous.
  virtual absl::StatusOr<void*> HostAllocPinned(size_t bytes) = 0;
  virtual absl::Status HostFreePinned(void* ptr) = 0;

  virtual absl::StatusOr<Stream> CreateStream(StreamKind kind) = 0;
  virtual absl::Status DestroyStream(Stream stream) = 0;

  virtual absl::StatusOr<Event> CreateEvent() = 0;
  virtual absl::Status DestroyEvent(Event event) = 0;
  virtual absl::Status RecordEvent(Event event, Stream stream) = 0;
  // True once the stream the event was last recorded on has passed it.
  virtual absl::StatusOr<bool> QueryEvent(Event event) = 0;
  virtual absl::Status StreamWaitEvent(Stream stream, Event event) = 0;

  // Enqueues a copy of `bytes` on `stream`. The caller keeps both buffers alive and unchanged
  // until the stream has passed the copy (an event, or a synchronisation, says when).
  virtual absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                                   Stream stream) = 0;

  // Enqueues on `stream` the conversion of `n` elements of device memory `src` (format `from`)
  // into device memory `dst` (format `to`), elementwise on the device, rounding to nearest even
  // exactly as core's FloatToBF16 / FloatToF16 do (backends/cuda/math/convert.h): a half tensor
  // up-cast to f32, or an f32 result rounded to half, never goes through host memory. `dst` and
  // `src` do not overlap; `from` == `to` is a plain copy.
  virtual absl::Status ConvertAsync(void* dst, FloatFormat to, const void* src, FloatFormat from,
                                    size_t n, Stream stream) = 0;

  // Block the host until the stream / event / whole device has caught up.
  virtual absl::Status SynchronizeStream(Stream stream) = 0;
  virtual absl::Status SynchronizeEvent(Event event) = 0;
  virtual absl::Status SynchronizeDevice() = 0;
};

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_DEVICE_API_H_
