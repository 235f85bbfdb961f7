// The Journal: this rank's recent operations, for error messages. Separate because both the
// collectives' worker and the point-to-point waits record into it, and every failure message
// quotes it.
#ifndef BRAID_BACKENDS_GLOO_JOURNAL_H_
#define BRAID_BACKENDS_GLOO_JOURNAL_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace braid::gloo_backend::internal {

// The last 16 operations (thread-safe): queued, running, ok or failed, and for how long.
class Journal {
 public:
  uint64_t Add(std::string what);
  void Start(uint64_t id);
  void Finish(uint64_t id, bool ok);
  // "#0 AllReduce(sum, f32, 4 elements) 16 B: ok in 1.2ms; #1 ...", oldest first.
  std::string Recent() const;
  static std::string Round(absl::Duration d);

 private:
  enum class State { kQueued, kRunning, kOk, kFailed };
  struct Entry {
    uint64_t id;
    std::string what;
    State state;
    absl::Time issued, started;
    absl::Duration took;
  };
  Entry* Find(uint64_t id);

  mutable absl::Mutex mu_;
  uint64_t next_id_ = 0;
  std::deque<Entry> entries_;
};

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_JOURNAL_H_
