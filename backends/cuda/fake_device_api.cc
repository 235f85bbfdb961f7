#include "backends/cuda/fake_device_api.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/cuda/math/convert.h"
#include "core/check.h"

namespace braid::cuda {
namespace {
static_assert(int(FloatFormat::kF32) == int(math::Format::kF32) &&
              int(FloatFormat::kBF16) == int(math::Format::kBF16) &&
              int(FloatFormat::kF16) == int(math::Format::kF16));

std::string Ptr(const void* p) { return absl::StrFormat("%p", p); }

// Device memory of every fake device in the process: a device-to-device copy between two of
// them (peer memory, through CUDA's unified addressing on a real GPU) must see both.
std::mutex& AllDevicesMu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<uintptr_t, size_t>& AllDeviceAllocs() {
  static auto* m = new std::map<uintptr_t, size_t>;
  return *m;
}
}  // namespace

FakeDeviceApi::FakeDeviceApi(Options options) : options_(options) {}

FakeDeviceApi::~FakeDeviceApi() {
  {
    std::lock_guard<std::mutex> all(AllDevicesMu());
    for (auto& [p, n] : device_allocs_) AllDeviceAllocs().erase(p);
  }
  for (auto& [p, n] : device_allocs_) std::free(reinterpret_cast<void*>(p));
  for (auto& [p, n] : pinned_allocs_) std::free(reinterpret_cast<void*>(p));
}

bool FakeDeviceApi::Inside(const std::map<uintptr_t, size_t>& allocs, const void* p,
                           size_t bytes) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = allocs.upper_bound(a);
  if (it == allocs.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

absl::StatusOr<void*> FakeDeviceApi::Malloc(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++malloc_calls_;
  if (device_in_use_ + bytes > options_.capacity_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "fake cuda:", options_.device_index, " out of memory: ", bytes, " bytes asked, ",
        options_.capacity_bytes - device_in_use_, " free of ", options_.capacity_bytes));
  }
  // 256-byte alignment, as cudaMalloc guarantees (at least).
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  BRAID_CHECK(p != nullptr) << "fake device: host allocation of " << bytes << " bytes failed";
  device_allocs_[reinterpret_cast<uintptr_t>(p)] = bytes;
  device_in_use_ += bytes;
  {
    std::lock_guard<std::mutex> all(AllDevicesMu());
    AllDeviceAllocs()[reinterpret_cast<uintptr_t>(p)] = bytes;
  }
  return p;
}

absl::Status FakeDeviceApi::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = device_allocs_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == device_allocs_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake device: Free of ", Ptr(ptr), ", which is not a live device allocation"));
  }
  // cudaFree synchronises the device before it returns the memory; so does the fake.
  syncs_.push_back("free");
  RunAllLocked();
  device_in_use_ -= it->second;
  device_allocs_.erase(it);
  {
    std::lock_guard<std::mutex> all(AllDevicesMu());
    AllDeviceAllocs().erase(reinterpret_cast<uintptr_t>(ptr));
  }
  std::free(ptr);
  return absl::OkStatus();
}

absl::StatusOr<void*> FakeDeviceApi::HostAllocPinned(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
  BRAID_CHECK(p != nullptr) << "fake device: pinned allocation of " << bytes << " bytes failed";
  pinned_allocs_[reinterpret_cast<uintptr_t>(p)] = bytes;
  return p;
}

absl::Status FakeDeviceApi::HostFreePinned(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pinned_allocs_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == pinned_allocs_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake device: HostFreePinned of ", Ptr(ptr), ", which is not pinned memory"));
  }
  // cudaFreeHost synchronises the device too; recorded as such (the fake's callers free pinned
  // buffers only once their copies completed, so nothing needs to run here).
  syncs_.push_back("free_pinned");
  pinned_allocs_.erase(it);
  std::free(ptr);
  return absl::OkStatus();
}

absl::StatusOr<Stream> FakeDeviceApi::CreateStream(StreamKind) {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = std::make_unique<StreamState>();
  s->id = next_stream_id_++;
  void* h = s.get();
  streams_[h] = std::move(s);
  return Stream{h};
}

absl::Status FakeDeviceApi::DestroyStream(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(stream.handle);
  if (it == streams_.end()) return absl::InvalidArgumentError("fake device: unknown stream");
  // CUDA lets a stream be destroyed with work pending (the work still runs): run it now.
  DrainLocked(it->second.get());
  streams_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<Event> FakeDeviceApi::CreateEvent() {
  std::lock_guard<std::mutex> lock(mu_);
  auto e = std::make_unique<EventState>();
  e->id = next_event_id_++;
  void* h = e.get();
  events_[h] = std::move(e);
  return Event{h};
}

absl::Status FakeDeviceApi::DestroyEvent(Event event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event.handle);
  if (it == events_.end()) return absl::InvalidArgumentError("fake device: unknown event");
  // Pending operations may still point at it (CUDA allows destroying a recorded event): keep
  // the state alive by running what refers to it first.
  RunAllLocked();
  events_.erase(it);
  return absl::OkStatus();
}

FakeDeviceApi::StreamState* FakeDeviceApi::StreamLocked(Stream s) {
  if (s.handle == nullptr) return &default_stream_;
  auto it = streams_.find(s.handle);
  BRAID_CHECK(it != streams_.end()) << "fake device: unknown or destroyed stream " << s.handle;
  return it->second.get();
}

FakeDeviceApi::EventState* FakeDeviceApi::EventLocked(Event e) {
  auto it = events_.find(e.handle);
  BRAID_CHECK(it != events_.end()) << "fake device: unknown or destroyed event " << e.handle;
  return it->second.get();
}

absl::Status FakeDeviceApi::RecordEvent(Event event, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  EventState* e = EventLocked(event);
  Op op{Op::kRecord};
  op.event = e;
  op.generation = ++e->recorded;
  StreamState* s = StreamLocked(stream);
  s->ops.push_back(op);
  issued_.push_back(absl::StrCat(s->id, ":record:e", e->id));
  RunEagerLocked();
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeDeviceApi::QueryEvent(Event event) {
  std::lock_guard<std::mutex> lock(mu_);
  EventState* e = EventLocked(event);
  return e->completed >= e->recorded;
}

absl::Status FakeDeviceApi::StreamWaitEvent(Stream stream, Event event) {
  std::lock_guard<std::mutex> lock(mu_);
  EventState* e = EventLocked(event);
  Op op{Op::kWait};
  op.event = e;
  op.generation = e->recorded;  // the record current at this call, not any later one
  StreamState* s = StreamLocked(stream);
  s->ops.push_back(op);
  issued_.push_back(absl::StrCat(s->id, ":wait:e", e->id));
  RunEagerLocked();
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                                        Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  bool dst_dev = kind != CopyKind::kDeviceToHost, src_dev = kind != CopyKind::kHostToDevice;
  bool dst_ok, src_ok;
  {
    std::lock_guard<std::mutex> all(AllDevicesMu());
    dst_ok = Inside(AllDeviceAllocs(), dst, bytes) == dst_dev;
    src_ok = Inside(AllDeviceAllocs(), src, bytes) == src_dev;
  }
  if (bytes > 0 && (!dst_ok || !src_ok)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fake device: ", CopyKindName(kind), " copy of ", bytes, " bytes from ", Ptr(src), " to ",
        Ptr(dst), ": the pointers are not ", src_dev ? "device" : "host", " and ",
        dst_dev ? "device" : "host", " memory of that size"));
  }
  Op op{Op::kCopy};
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  op.copy_kind = kind;
  StreamState* s = StreamLocked(stream);
  s->ops.push_back(op);
  issued_.push_back(absl::StrCat(s->id, ":", CopyKindName(kind), ":", bytes));
  RunEagerLocked();
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::ConvertAsync(void* dst, FloatFormat to, const void* src,
                                         FloatFormat from, size_t n, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t dst_bytes = n * size_t(math::FormatSize(math::Format(int(to))));
  const size_t src_bytes = n * size_t(math::FormatSize(math::Format(int(from))));
  bool ok;
  {
    std::lock_guard<std::mutex> all(AllDevicesMu());
    ok = Inside(AllDeviceAllocs(), dst, dst_bytes) && Inside(AllDeviceAllocs(), src, src_bytes);
  }
  if (n > 0 && !ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fake device: conversion of ", n, " elements ", FloatFormatName(from), " -> ",
        FloatFormatName(to), " from ", Ptr(src), " to ", Ptr(dst),
        ": the pointers are not device memory of that size"));
  }
  Op op{Op::kConvert};
  op.dst = dst;
  op.src = src;
  op.bytes = n;
  op.from = from;
  op.to = to;
  StreamLocked(stream)->ops.push_back(op);
  RunEagerLocked();
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::SynchronizeStream(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  StreamState* s = StreamLocked(stream);
  syncs_.push_back(absl::StrCat("stream:", s->id));
  DrainLocked(s);
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::SynchronizeEvent(Event event) {
  std::lock_guard<std::mutex> lock(mu_);
  EventState* e = EventLocked(event);
  syncs_.push_back("event");
  // Only the streams' progress completes an event; running everything reaches it.
  if (e->completed < e->recorded) RunAllLocked();
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::SynchronizeDevice() {
  std::lock_guard<std::mutex> lock(mu_);
  syncs_.push_back("device");
  RunAllLocked();
  return absl::OkStatus();
}

bool FakeDeviceApi::StepLocked(StreamState* s) {
  if (s->ops.empty()) return false;
  Op& op = s->ops.front();
  switch (op.kind) {
    case Op::kWait:
      if (op.event->completed < op.generation) return false;
      break;
    case Op::kRecord:
      op.event->completed = op.generation;
      break;
    case Op::kCopy:
      if (op.bytes > 0) std::memmove(op.dst, op.src, op.bytes);
      log_.push_back(absl::StrCat(s->id, ":", CopyKindName(op.copy_kind), ":", op.bytes));
      break;
    case Op::kConvert:
      math::DispatchFormats(math::Format(int(op.from)), math::Format(int(op.to)),
                            [&](auto f, auto t) {
                              for (size_t i = 0; i < op.bytes; ++i) {
                                math::ConvertOne<decltype(f)::value, decltype(t)::value>(
                                    op.src, op.dst, int64_t(i));
                              }
                            });
      log_.push_back(absl::StrCat(s->id, ":convert:", FloatFormatName(op.from), "->",
                                  FloatFormatName(op.to), ":", op.bytes));
      break;
  }
  s->ops.pop_front();
  return true;
}

void FakeDeviceApi::RunAllLocked() {
  bool progress = true;
  while (progress) {
    progress = false;
    while (StepLocked(&default_stream_)) progress = true;
    for (auto& [h, s] : streams_) {
      while (StepLocked(s.get())) progress = true;
    }
  }
  // A wait whose event is recorded later on a stream that never runs it cannot happen in CUDA
  // (the wait takes the record current at the call); anything left is a fake bug.
  size_t left = default_stream_.ops.size();
  for (auto& [h, s] : streams_) left += s->ops.size();
  BRAID_CHECK(left == 0) << "fake device: " << left << " operations can never run";
}

void FakeDeviceApi::DrainLocked(StreamState* s) {
  while (!s->ops.empty()) {
    if (StepLocked(s)) continue;
    // Blocked on a wait: advance every other stream by one operation, then try again, so
    // that the others run only as far as s needs (a test can then see what is still queued).
    bool progress = false;
    if (&default_stream_ != s) progress |= StepLocked(&default_stream_);
    for (auto& [h, other] : streams_) {
      if (other.get() != s) progress |= StepLocked(other.get());
    }
    BRAID_CHECK(progress) << "fake device: stream " << s->id << " waits on an event no stream "
                          << "will reach";
  }
}

void FakeDeviceApi::RunEagerLocked() {
  if (options_.eager) RunAllLocked();
}

bool FakeDeviceApi::Step(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  return StepLocked(StreamLocked(stream));
}

void FakeDeviceApi::Drain(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked(StreamLocked(stream));
}

void FakeDeviceApi::RunAll() {
  std::lock_guard<std::mutex> lock(mu_);
  RunAllLocked();
}

size_t FakeDeviceApi::Pending(Stream stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  return const_cast<FakeDeviceApi*>(this)->StreamLocked(stream)->ops.size();
}

int FakeDeviceApi::StreamId(Stream stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  return const_cast<FakeDeviceApi*>(this)->StreamLocked(stream)->id;
}

std::vector<std::string> FakeDeviceApi::log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

void FakeDeviceApi::ClearLog() {
  std::lock_guard<std::mutex> lock(mu_);
  log_.clear();
}

std::vector<std::string> FakeDeviceApi::issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_;
}

void FakeDeviceApi::ClearIssued() {
  std::lock_guard<std::mutex> lock(mu_);
  issued_.clear();
}

std::vector<std::string> FakeDeviceApi::syncs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return syncs_;
}

void FakeDeviceApi::ClearSyncs() {
  std::lock_guard<std::mutex> lock(mu_);
  syncs_.clear();
}

size_t FakeDeviceApi::device_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_in_use_;
}

int64_t FakeDeviceApi::malloc_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return malloc_calls_;
}

int64_t FakeDeviceApi::live_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(streams_.size());
}

int64_t FakeDeviceApi::live_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(events_.size());
}

bool FakeDeviceApi::IsPinned(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  return Inside(pinned_allocs_, p, 1);
}

void FakeDeviceApi::set_capacity(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.capacity_bytes = bytes;
}

}  // namespace braid::cuda
