// The progress keys in the rendezvous store (progress.h).
#include "backends/nccl/progress.h"

#include <algorithm>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace braid::nccl::internal {
namespace {

// How long a timed-out rank spends reading the other ranks' progress keys, in all.
constexpr absl::Duration kProgressReadBudget = absl::Seconds(5);

}  // namespace

ProgressPublisher::ProgressPublisher(Store* store, std::string key)
    : store_(store), key_(std::move(key)) {
  thread_ = std::thread([this] { Run(); });
}

ProgressPublisher::~ProgressPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void ProgressPublisher::Publish(std::string value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = std::move(value);
  }
  cv_.notify_one();
}

void ProgressPublisher::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
    if (!pending_.has_value()) return;  // stopping, nothing left to write
    std::string value = std::move(*pending_);
    pending_.reset();
    lock.unlock();
    // A failed write only makes a later timeout message less precise.
    store_->Set(key_, value).IgnoreError();
    lock.lock();
  }
}

std::string ProgressKey(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, "progress/", rank);
}

std::vector<PeerProgress> ReadProgress(Store* store, const std::string& prefix, int size,
                                       int self) {
  std::vector<PeerProgress> out(size);
  const absl::Time deadline = absl::Now() + kProgressReadBudget;
  for (int r = 0; r < size; ++r) {
    if (r == self) continue;
    absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(10));
    absl::StatusOr<std::string> v =
        store->Get(ProgressKey(prefix, r), std::min(left, absl::Seconds(1)));
    if (!v.ok()) {
      out[r].error = std::string(v.status().message());
      continue;
    }
    std::string value = *v;
    size_t space = value.find(' ');
    std::string num = value.substr(0, space);
    if (!absl::SimpleAtoi(num, &out[r].seq)) {
      out[r].error = absl::StrCat("unreadable value '", value, "'");
      continue;
    }
    out[r].known = true;
    out[r].what = space == std::string::npos ? "" : value.substr(space + 1);
  }
  return out;
}

}  // namespace braid::nccl::internal
