// The progress keys: how a timed-out rank learns which ranks are behind, since NCCL itself cannot
// tell. Separate from the communicator because it talks only to the rendezvous store (no CUDA,
// no NCCL) and runs its own thread.
#ifndef BRAID_BACKENDS_NCCL_PROGRESS_H_
#define BRAID_BACKENDS_NCCL_PROGRESS_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/store.h"

namespace braid::nccl::internal {

// Key `prefix + "progress/" + rank` holds "<seq> <description>": the last collective this rank
// started (-1 before the first). Written by a background thread, latest value wins, so that a
// collective never waits for a store round trip.
class ProgressPublisher {
 public:
  ProgressPublisher(Store* store, std::string key);
  ~ProgressPublisher();
  void Publish(std::string value);

 private:
  void Run();

  Store* store_;
  std::string key_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::string> pending_;
  bool stop_ = false;
  std::thread thread_;
};

std::string ProgressKey(const std::string& prefix, int rank);

struct PeerProgress {
  bool known = false;
  int64_t seq = -1;
  std::string what;   // the collective it last started
  std::string error;  // why it is unknown
};

// Reads every other rank's progress key, within kProgressReadBudget in all.
std::vector<PeerProgress> ReadProgress(Store* store, const std::string& prefix, int size, int self);

}  // namespace braid::nccl::internal

#endif  // BRAID_BACKENDS_NCCL_PROGRESS_H_
