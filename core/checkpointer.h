// Checkpointer: writes and reads a training run's state as sharded checkpoints. Each rank writes
// the chunks it holds (core/state_chunks.h) and any rank reads the elements its own chunks need,
// whichever layout wrote them: a checkpoint of DDP on 2 ranks loads into ZeRO-3 on 3, or one
// process. Implementations are plugins (plugins/checkpoint); the training program drives them.
#ifndef BRAID_CORE_CHECKPOINTER_H_
#define BRAID_CORE_CHECKPOINTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/communicator.h"
#include "core/state_chunks.h"

namespace braid {

struct CheckpointOptions {
  std::string dir;     // holds one folder per checkpoint, step_<N>
  int keep_last = 2;   // complete checkpoints kept (older ones deleted after a save)
  bool async = false;  // write on a background thread from a snapshot while training goes on
};

class Checkpointer {
 public:
  virtual ~Checkpointer() = default;
  // Collective over `world`. Writes `chunks` (those with write set) and `extra` (small strings:
  // the data position, the scheduler step; every rank's own) as checkpoint `step`. It exists only
  // once complete: written under a temporary name, flushed, renamed. With async, the chunks are
  // copied first and the writing goes on after Save returns; the next Save or Wait finishes it.
  virtual absl::Status Save(int64_t step, const std::vector<StateChunk>& chunks,
                            const std::map<std::string, std::string>& extra,
                            Communicator& world) = 0;
  // Finishes an asynchronous save (its error, if it failed). Collective.
  virtual absl::Status Wait() = 0;
  // Collective and cheap (one all-reduce of a flag while a save is pending): commits an
  // asynchronous save once every rank's background write has finished. Call it between steps.
  virtual absl::Status Poll(Communicator& world) = 0;
  // The newest complete checkpoint whose files are intact (checked against their checksums), or
  // nullopt when there is none. A damaged newer one is skipped with a warning naming the file.
  virtual absl::StatusOr<std::optional<int64_t>> Latest(Communicator& world) = 0;
  // Collective. Fills every chunk's local tensor from checkpoint `step` and returns this rank's
  // `extra`. A tensor the checkpoint lacks, or elements no saved chunk covers, is an error naming
  // the tensor.
  virtual absl::StatusOr<std::map<std::string, std::string>> Load(int64_t step,
                                                                   std::vector<StateChunk>& chunks,
                                                                   Communicator& world) = 0;
  // What the last Save blocked training for and what it wrote, for the summary.
  struct SaveStats {
    double blocked_s = 0, write_s = 0;
    int64_t bytes = 0;
  };
  virtual SaveStats last_save() const = 0;
};

using CheckpointerFactory =
    std::function<absl::StatusOr<std::unique_ptr<Checkpointer>>(const CheckpointOptions&)>;

}  // namespace braid

#endif  // BRAID_CORE_CHECKPOINTER_H_
