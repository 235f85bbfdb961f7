// A CPU stand-in for one CUDA device, for testing host-side logic without a GPU.
//
// Device and pinned memory are plain host memory the fake keeps track of (so a copy whose kind
// does not match its pointers, a double free, or a free of a foreign pointer fails the test at
// once). Each stream is a queue of pending operations (copies, event records, event waits) that
// nothing runs until the test says so, which is how a test holds a "GPU" mid-step and checks that
// nothing ran out of order:
//
//   fake.Step(s)    runs the next operation of stream s if it may run (a wait whose event has
//                   not completed blocks its stream);
//   fake.Drain(s)   runs s to empty; when a wait blocks it, other streams advance one
//                   operation at a time until it can go on (so they run no further than needed);
//   fake.RunAll()   runs everything.
//
// Synchronize* calls Drain/RunAll, as a host blocked on the GPU would see; Free runs everything
// first, as cudaFree synchronises the device. Each of those is recorded in syncs(). With
// `eager = true` every operation runs as soon as it is enqueued and its waits allow it: a GPU
// infinitely faster than the host, for tests that only care about results.
//
// Every executed copy is appended to log() as "<stream id>:<kind>:<bytes>", in execution order;
// a conversion (ConvertAsync, run with the kernels' own math/convert.h) as
// "<stream id>:convert:<from>-><to>:<elements>".
// Thread-safe.
#ifndef BRAID_BACKENDS_CUDA_FAKE_DEVICE_API_H_
#define BRAID_BACKENDS_CUDA_FAKE_DEVICE_API_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/device_api.h"

namespace braid::cuda {

class FakeDeviceApi final : public DeviceApi {
 public:
  struct Options {
    int device_index = 0;
    size_t capacity_bytes = size_t(1) << 30;  // device memory; Malloc beyond it fails
    bool eager = false;
  };
  explicit FakeDeviceApi(Options options);
  FakeDeviceApi() : FakeDeviceApi(Options{}) {}
  ~FakeDeviceApi() override;

  int device_index() const override { return options_.device_index; }
  absl::StatusOr<void*> Malloc(size_t bytes) override;
  absl::Status Free(void* ptr) override;
  absl::StatusOr<void*> HostAllocPinned(size_t bytes) override;
  absl::Status HostFreePinned(void* ptr) override;
  absl::StatusOr<Stream> CreateStream(StreamKind kind) override;
  absl::Status DestroyStream(Stream stream) override;
  absl::StatusOr<Event> CreateEvent() override;
  absl::Status DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status StreamWaitEvent(Stream stream, Event event) override;
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                           Stream stream) override;
  absl::Status ConvertAsync(void* dst, FloatFormat to, const void* src, FloatFormat from,
                            size_t n, Stream stream) override;
  absl::Status SynchronizeStream(Stream stream) override;
  absl::Status SynchronizeEvent(Event event) override;
  absl::Status SynchronizeDevice() override;

  // ---- Test controls ----
  bool Step(Stream stream);  // false if the stream is empty or blocked on a wait
  void Drain(Stream stream);  // fails the test (BRAID_CHECK) on a wait nothing can satisfy
  void RunAll();
  size_t Pending(Stream stream) const;
  // The small number the log uses for a stream (1, 2, ... in creation order; 0 = default).
  int StreamId(Stream stream) const;
  std::vector<std::string> log() const;
  void ClearLog();
  // Every time the host blocked on the device, in order: "stream:<id>" (SynchronizeStream),
  // "event" (SynchronizeEvent), "device" (SynchronizeDevice), and the calls that synchronise
  // the device implicitly in CUDA: "free" (cudaFree), "free_pinned" (cudaFreeHost). A
  // device-to-host copy the host waits for (Tensor::item(), ToFloatVector, a host tensor's
  // CopyFrom) shows as the SynchronizeStream after it. How a test counts a training step's
  // host synchronisations (docs/GPU.md, "Synchronisation points").
  std::vector<std::string> syncs() const;
  void ClearSyncs();
  // Every copy, event record and event wait in the order the host enqueued them (not run):
  // "<stream id>:<kind>:<bytes>" for a copy, "<stream id>:record:e<event id>",
  // "<stream id>:wait:e<event id>" (event ids 1, 2, ... in creation order). How a test sees that
  // a copy was issued ahead of its use and that a stream, not the host, waits for it
  // (core/async_copy.h).
  std::vector<std::string> issued() const;
  void ClearIssued();

  size_t device_bytes_in_use() const;
  int64_t malloc_calls() const;
  int64_t live_streams() const;
  int64_t live_events() const;
  bool IsPinned(const void* p) const;  // inside a live pinned allocation
  void set_capacity(size_t bytes);

 private:
  struct EventState {
    int id = 0;             // issued()'s number for it
    int64_t recorded = 0;   // how many times recorded
    int64_t completed = 0;  // how many of those records the stream has passed
  };
  struct Op {
    enum Kind { kCopy, kConvert, kRecord, kWait } kind;
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;  // kConvert: the element count
    CopyKind copy_kind = CopyKind::kHostToDevice;
    FloatFormat from = FloatFormat::kF32, to = FloatFormat::kF32;  // kConvert
    EventState* event = nullptr;
    int64_t generation = 0;  // kRecord: the record's number; kWait: the record waited for
  };
  struct StreamState {
    int id = 0;
    std::deque<Op> ops;
  };

  StreamState* StreamLocked(Stream s);
  EventState* EventLocked(Event e);
  bool StepLocked(StreamState* s);
  void DrainLocked(StreamState* s);
  void RunAllLocked();
  void RunEagerLocked();
  // [p, p + bytes) inside one live allocation of `allocs`?
  static bool Inside(const std::map<uintptr_t, size_t>& allocs, const void* p, size_t bytes);

  Options options_;
  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> device_allocs_, pinned_allocs_;
  size_t device_in_use_ = 0;
  int64_t malloc_calls_ = 0;
  int next_stream_id_ = 1;
  int next_event_id_ = 1;
  StreamState default_stream_;
  std::map<void*, std::unique_ptr<StreamState>> streams_;
  std::map<void*, std::unique_ptr<EventState>> events_;
  std::vector<std::string> log_;
  std::vector<std::string> syncs_;
  std::vector<std::string> issued_;
};

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_FAKE_DEVICE_API_H_
