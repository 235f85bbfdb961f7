#include "backends/gloo/store_adapter.h"

#include <gloo/common/error.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace braid::gloo_backend {

namespace {

[[noreturn]] void Throw(const absl::Status& status) {
  throw ::gloo::IoException(absl::StrCat("braid store: ", status.ToString()));
}

}  // namespace

absl::Status WaitInSlices(braid::Store* store, const std::vector<std::string>& keys,
                          absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::Status s = store->Wait(keys, std::min(left, absl::Milliseconds(100)));
    if (s.ok() || s.code() != absl::StatusCode::kDeadlineExceeded) return s;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("waited ", absl::FormatDuration(timeout), " in all: ", s.message()));
    }
  }
}

GlooStoreAdapter::GlooStoreAdapter(braid::Store* store, std::string prefix,
                                   absl::Duration default_timeout)
    : store_(store), prefix_(std::move(prefix)), default_timeout_(default_timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->Set(Key(key), std::string(data.begin(), data.end()));
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::Status waited = WaitInSlices(store_, {Key(key)}, default_timeout_);
  if (!waited.ok()) Throw(waited);
  absl::StatusOr<std::string> v = store_->Get(Key(key), absl::Seconds(10));
  if (!v.ok()) Throw(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(default_timeout_)));
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(Key(k));
  absl::Status s = WaitInSlices(store_, full, absl::Milliseconds(timeout.count()));
  if (!s.ok()) Throw(s);
}

}  // namespace braid::gloo_backend
