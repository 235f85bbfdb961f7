#include "backends/cuda/pinned_pool.h"

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace braid::cuda {

size_t PinnedHostPool::RoundSize(size_t bytes) {
  size_t n = 4096;
  while (n < bytes) n <<= 1;
  return n;
}

PinnedHostPool::~PinnedHostPool() {
  // Errors ignored: at process exit the CUDA runtime may already be unloading.
  for (auto& [p, b] : buffers_) {
    if (b.event.handle != nullptr) {
      if (b.pending) (void)api_->SynchronizeEvent(b.event);
      (void)api_->DestroyEvent(b.event);
    }
    (void)api_->HostFreePinned(p);
  }
}

absl::StatusOr<void*> PinnedHostPool::Allocate(size_t bytes) {
  const size_t size = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto [lo, hi] = free_.equal_range(size);
  for (auto it = lo; it != hi; ++it) {
    Buffer& b = buffers_.at(it->second);
    if (b.pending) {
      absl::StatusOr<bool> done = api_->QueryEvent(b.event);
      if (!done.ok() || !*done) continue;  // the device still reads it
      b.pending = false;
    }
    void* p = it->second;
    free_.erase(it);
    b.in_use = true;
    return p;
  }
  absl::StatusOr<void*> p = api_->HostAllocPinned(size);
  if (!p.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot pin ", size, " bytes of host memory for a host-to-device copy (", buffers_.size(),
        " pinned buffers held): ", p.status().message(),
        ". Check `ulimit -l` (locked memory) and the machine's free memory."));
  }
  ++host_allocs_;
  Buffer& b = buffers_[*p];
  b.size = size;
  b.in_use = true;
  return *p;
}

absl::Status PinnedHostPool::Free(void* ptr, Stream last_use) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = buffers_.find(ptr);
  BRAID_CHECK(it != buffers_.end() && it->second.in_use)
      << "PinnedHostPool::Free of a buffer it did not hand out (or freed twice)";
  Buffer& b = it->second;
  if (b.event.handle == nullptr) {
    BRAID_ASSIGN_OR_RETURN(b.event, api_->CreateEvent());
  }
  BRAID_RETURN_IF_ERROR(api_->RecordEvent(b.event, last_use));
  b.pending = true;
  b.in_use = false;
  free_.emplace(b.size, ptr);
  return absl::OkStatus();
}

absl::Status PinnedHostPool::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end();) {
    Buffer& b = buffers_.at(it->second);
    if (b.pending) {
      BRAID_ASSIGN_OR_RETURN(bool done, api_->QueryEvent(b.event));
      if (!done) {
        ++it;
        continue;
      }
    }
    if (b.event.handle != nullptr) BRAID_RETURN_IF_ERROR(api_->DestroyEvent(b.event));
    BRAID_RETURN_IF_ERROR(api_->HostFreePinned(it->second));
    buffers_.erase(it->second);
    it = free_.erase(it);
  }
  return absl::OkStatus();
}

int64_t PinnedHostPool::host_allocs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return host_allocs_;
}

int64_t PinnedHostPool::cached_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(free_.size());
}

int64_t PinnedHostPool::in_use_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(buffers_.size() - free_.size());
}

}  // namespace braid::cuda
