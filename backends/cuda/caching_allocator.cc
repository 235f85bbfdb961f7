#include "backends/cuda/caching_allocator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"

namespace braid::cuda {
namespace {

std::string Bytes(int64_t n) {
  if (n < (int64_t(1) << 20)) return absl::StrCat(n, " bytes");
  return absl::StrFormat("%.1f MiB (%d bytes)", double(n) / double(1 << 20), n);
}

}  // namespace

size_t CachingAllocator::RoundSize(size_t bytes) {
  if (bytes == 0) return kRound;  // every allocation gets a distinct, usable pointer
  return (bytes + kRound - 1) / kRound * kRound;
}

size_t CachingAllocator::SegmentSize(size_t rounded) {
  if (rounded <= kSmallLimit) return kSmallSegment;
  if (rounded < kLargeDirect) return kLargeSegment;
  return (rounded + kLargeRound - 1) / kLargeRound * kLargeRound;
}

CachingAllocator::CachingAllocator(Device device, DeviceApi* api,
                                   std::function<Stream()> current_stream)
    : device_(device), api_(api), current_stream_(std::move(current_stream)) {
  BRAID_CHECK(api_ != nullptr && current_stream_) << "CachingAllocator for " << device_;
}

CachingAllocator::~CachingAllocator() {
  // Errors are ignored here: at process exit the CUDA runtime may already be unloading.
  std::vector<Block*> heads;
  for (Pool* pool : {&small_, &large_}) {
    for (Block* b : *pool) {
      if (b->prev == nullptr) heads.push_back(b);
    }
  }
  for (auto& [p, b] : live_) {
    if (b->prev == nullptr) heads.push_back(b);
  }
  for (Block* head : heads) {
    (void)api_->Free(head->ptr);
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      if (b->pending) (void)api_->DestroyEvent(b->event);
      delete b;
      b = next;
    }
  }
  for (Event e : spare_events_) (void)api_->DestroyEvent(e);
}

void* CachingAllocator::Allocate(size_t bytes) {
  absl::StatusOr<void*> p = TryAllocate(bytes, current_stream_());
  BRAID_CHECK(p.ok()) << p.status().message();
  return *p;
}

void CachingAllocator::Deallocate(void* ptr, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    BRAID_CHECK(it != live_.end() && it->second->requested == bytes)
        << device_ << ": Deallocate(" << ptr << ", " << bytes
        << " bytes) does not match a live allocation of this allocator";
  }
  Free(ptr);
}

absl::StatusOr<void*> CachingAllocator::TryAllocate(size_t bytes, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEventsLocked();
  const size_t rounded = RoundSize(bytes);
  const bool small = rounded <= kSmallLimit;
  Block* b = FindFreeLocked(rounded, small, stream);
  if (b != nullptr) {
    PoolOf(b).erase(b);
    pending_.erase(b);
    ++stats_.cache_hits;
  } else {
    const size_t segment = SegmentSize(rounded);
    absl::StatusOr<void*> mem = api_->Malloc(segment);
    if (!mem.ok() && ReleaseFreeSegmentsLocked() > 0) mem = api_->Malloc(segment);
    if (!mem.ok()) {
      ++stats_.num_ooms;
      return absl::ResourceExhaustedError(absl::StrCat(
          "CUDA out of memory on ", device_.ToString(), ": asked for ", Bytes(int64_t(bytes)),
          " (a new segment of ", Bytes(int64_t(segment)), "); ", DescribeLocked(),
          ". The device said: ", mem.status().message(),
          ". Lower the batch size or sequence length, or use a strategy that shards the model."));
    }
    b = new Block;
    b->ptr = static_cast<char*>(*mem);
    b->size = segment;
    b->small = small;
    b->stream = stream;
    ++stats_.device_mallocs;
    ++stats_.segments;
    stats_.reserved_bytes += int64_t(segment);
    if (stats_.reserved_bytes > stats_.peak_reserved_bytes) {
      stats_.peak_reserved_bytes = stats_.reserved_bytes;
    }
  }
  SplitLocked(b, rounded);  // hands b's free-time event to the remainder, or releases it
  b->allocated = true;
  b->stream = stream;
  b->pending = b->untracked = false;
  b->requested = bytes;
  live_[b->ptr] = b;
  ++stats_.num_allocs;
  stats_.allocated_bytes += int64_t(b->size);
  RecordAlloc(bytes);
  return static_cast<void*>(b->ptr);
}

void CachingAllocator::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  BRAID_CHECK(it != live_.end()) << device_ << ": Free(" << ptr
                                 << ") of a pointer this allocator did not hand out (or freed twice)";
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  stats_.allocated_bytes -= int64_t(b->size);
  RecordFree(b->requested);
  b->free_seq = ++free_seq_;
  // The stream may still have work on the block queued: other streams must wait for this point.
  absl::StatusOr<Event> ev = GetEventLocked();
  if (ev.ok() && api_->RecordEvent(*ev, b->stream).ok()) {
    b->event = *ev;
    b->pending = true;
  } else {
    if (ev.ok()) spare_events_.push_back(*ev);
    b->untracked = true;  // never provably done: keep it for its own stream only
  }
  b = MergeLocked(b, nullptr);
  PoolOf(b).insert(b);
  if (b->pending) pending_.insert(b);
}

CachingAllocator::Block* CachingAllocator::FindFreeLocked(size_t rounded, bool small,
                                                          Stream stream) {
  Pool& pool = small ? small_ : large_;
  Block key;
  key.size = rounded;
  // Best fit among the blocks this stream may use: its own, or any whose last use is done.
  for (auto it = pool.lower_bound(&key); it != pool.end(); ++it) {
    if ((*it)->stream == stream || Idle(*it)) return *it;
  }
  return nullptr;
}

void CachingAllocator::SplitLocked(Block* b, size_t rounded) {
  const size_t rest = b->size - rounded;
  const bool split = b->small ? rest >= kRound : rest > kSmallLimit;
  if (!split) {
    ReleaseEventLocked(b);
    return;
  }
  Block* r = new Block;
  r->ptr = b->ptr + rounded;
  r->size = rest;
  r->small = b->small;
  // The remainder was free with b: it keeps b's stream and free-time event.
  r->stream = b->stream;
  r->event = b->event;
  r->pending = b->pending;
  r->untracked = b->untracked;
  r->free_seq = b->free_seq;
  b->pending = false;
  r->prev = b;
  r->next = b->next;
  if (b->next != nullptr) b->next->prev = r;
  b->next = r;
  b->size = rounded;
  PoolOf(r).insert(r);
  if (r->pending) pending_.insert(r);
}

void CachingAllocator::ReleaseEventLocked(Block* b) {
  if (b->pending) spare_events_.push_back(b->event);
  b->pending = false;
  b->event = Event{};
}

absl::StatusOr<Event> CachingAllocator::GetEventLocked() {
  if (!spare_events_.empty()) {
    Event e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  return api_->CreateEvent();
}

bool CachingAllocator::CanMerge(const Block* a, const Block* b) const {
  if (a == nullptr || b == nullptr || a->allocated || b->allocated) return false;
  // An idle block is safe for any stream; two blocks of one stream are safe for that stream.
  return Idle(a) || Idle(b) || a->stream == b->stream;
}

CachingAllocator::Block* CachingAllocator::MergeLocked(Block* b, std::set<Block*>* todo) {
  for (Block* n : {b->prev, b->next}) {
    if (!CanMerge(b, n)) continue;
    PoolOf(n).erase(n);
    pending_.erase(n);
    if (todo != nullptr) todo->erase(n);
    // The merged block's state: the non-idle side's; for two blocks of one stream the more
    // restrictive (untracked) or, both pending, the later event (it is later on that stream).
    Block* keep = b;
    Block* drop = n;
    if (Idle(b)) {
      std::swap(keep, drop);
    } else if (!Idle(n)) {
      if (n->untracked && !b->untracked) std::swap(keep, drop);
      if (b->pending && n->pending && n->free_seq > b->free_seq) std::swap(keep, drop);
    }
    Stream stream = keep->stream;
    Event event = keep->event;
    bool pending = keep->pending, untracked = keep->untracked || drop->untracked;
    int64_t seq = keep->free_seq;
    if (drop->pending) spare_events_.push_back(drop->event);
    if (untracked && pending) {
      spare_events_.push_back(event);
      pending = false;
    }
    Block* lo = n == b->prev ? n : b;
    Block* hi = n == b->prev ? b : n;
    lo->size += hi->size;
    lo->next = hi->next;
    if (hi->next != nullptr) hi->next->prev = lo;
    lo->stream = stream;
    lo->event = pending ? event : Event{};
    lo->pending = pending;
    lo->untracked = untracked;
    lo->free_seq = seq;
    if (todo != nullptr) todo->erase(hi);
    delete hi;
    b = lo;
  }
  return b;
}

void CachingAllocator::ProcessEventsLocked() {
  std::set<Block*> done;
  for (Block* b : pending_) {
    absl::StatusOr<bool> q = api_->QueryEvent(b->event);
    // A failing query leaves the block with its stream: safe, if wasteful.
    if (q.ok() && *q) done.insert(b);
  }
  for (Block* b : done) {
    pending_.erase(b);
    ReleaseEventLocked(b);
  }
  // Blocks that became idle may now merge with neighbours (a merge can swallow others in `done`).
  while (!done.empty()) {
    Block* b = *done.begin();
    done.erase(done.begin());
    PoolOf(b).erase(b);
    b = MergeLocked(b, &done);
    PoolOf(b).insert(b);
    if (b->pending) pending_.insert(b);
  }
}

size_t CachingAllocator::ReleaseFreeSegmentsLocked() {
  size_t released = 0;
  for (Pool* pool : {&small_, &large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev != nullptr || b->next != nullptr || !Idle(b)) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      BRAID_CHECK_OK(api_->Free(b->ptr));
      released += b->size;
      stats_.reserved_bytes -= int64_t(b->size);
      --stats_.segments;
      ++stats_.device_frees;
      delete b;
    }
  }
  return released;
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEventsLocked();
  ReleaseFreeSegmentsLocked();
}

std::string CachingAllocator::DescribeLocked() const {
  int64_t cached = stats_.reserved_bytes - stats_.allocated_bytes;
  return absl::StrCat("this allocator holds ", Bytes(stats().current_bytes), " in ", live_.size(),
                      " live tensors and has ", Bytes(stats_.reserved_bytes), " reserved in ",
                      stats_.segments, " segments, ", Bytes(cached),
                      " of it free in the cache but too small or still in use by another stream");
}

CachingAllocatorStats CachingAllocator::caching_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeakReserved() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

Stream CachingAllocator::StreamOf(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  BRAID_CHECK(it != live_.end()) << device_ << ": StreamOf(" << ptr
                                 << "): not a live allocation of this allocator";
  return it->second->stream;
}

}  // namespace braid::cuda
