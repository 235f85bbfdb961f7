// A small key-value store for rendezvous: how ranks find each other and exchange addresses or
// NCCL unique ids before any collective exists. Implementations: the authenticated TCP store
// served by the launcher (backends/store), and an in-memory one for tests (below).
#ifndef BRAID_CORE_STORE_H_
#define BRAID_CORE_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace braid {

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until the key exists (DeadlineExceeded naming the key after `timeout`).
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // Adds to the integer stored at key (0 if absent) and returns the new value.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Sets key to `desired` if its value is `expected` ("" matches an absent key); returns the
  // value after the call.
  virtual absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                                 const std::string& desired) = 0;
  virtual absl::Status Delete(const std::string& key) = 0;
};

// A thread-safe in-process store, for tests and single-process runs.
class InMemoryStore final : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired) override;
  absl::Status Delete(const std::string& key) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

// Keys of `base` under "<prefix>/": one store serves several groups or jobs without collisions.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store* base) : prefix_(std::move(prefix) + "/"), base_(base) {}
  absl::Status Set(const std::string& k, const std::string& v) override { return base_->Set(prefix_ + k, v); }
  absl::StatusOr<std::string> Get(const std::string& k, absl::Duration t) override {
    return base_->Get(prefix_ + k, t);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration t) override;
  absl::StatusOr<int64_t> Add(const std::string& k, int64_t d) override { return base_->Add(prefix_ + k, d); }
  absl::StatusOr<std::string> CompareSet(const std::string& k, const std::string& e,
                                         const std::string& d) override {
    return base_->CompareSet(prefix_ + k, e, d);
  }
  absl::Status Delete(const std::string& k) override { return base_->Delete(prefix_ + k); }

 private:
  std::string prefix_;
  Store* base_;
};

}  // namespace braid

#endif  // BRAID_CORE_STORE_H_
