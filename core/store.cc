#include "core/store.h"

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"

namespace braid {

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key, absl::Duration timeout) {
  BRAID_RETURN_IF_ERROR(Wait({key}, timeout));
  std::lock_guard<std::mutex> lock(mu_);
  return data_[key];
}

absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  auto missing = [&] {
    std::vector<std::string> m;
    for (const auto& k : keys) {
      if (!data_.count(k)) m.push_back(k);
    }
    return m;
  };
  while (!missing().empty()) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !missing().empty()) {
      return absl::DeadlineExceededError(absl::StrCat("store: waited ", absl::FormatDuration(timeout),
                                                      " for key(s) ", absl::StrJoin(missing(), ", ")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> InMemoryStore::Add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &v)) {
      return absl::FailedPreconditionError(
          absl::StrCat("store: Add on key '", key, "' whose value is not an integer"));
    }
    v += delta;
    data_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

absl::StatusOr<std::string> InMemoryStore::CompareSet(const std::string& key,
                                                      const std::string& expected,
                                                      const std::string& desired) {
  std::string now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    std::string current = it == data_.end() ? "" : it->second;
    if (current == expected) data_[key] = desired;
    now = data_.count(key) ? data_[key] : "";
  }
  cv_.notify_all();
  return now;
}

absl::Status InMemoryStore::Delete(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  data_.erase(key);
  return absl::OkStatus();
}

absl::Status PrefixStore::Wait(const std::vector<std::string>& keys, absl::Duration t) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  return base_->Wait(full, t);
}

}  // namespace braid
