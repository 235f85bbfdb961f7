// Where the training program's batches come from: the token samplers (random windows or
// sequential) or MNIST, sharded by the strategy's data-parallel rank. Split from trainer.cc.
#ifndef BRAID_LAUNCHER_BATCH_SOURCES_H_
#define BRAID_LAUNCHER_BATCH_SOURCES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/batch.h"
#include "core/config/train_config.pb.h"
#include "core/module.h"

namespace braid::launcher {

// Where batches come from: one of the token samplers or MNIST.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch Next() = 0;
  virtual int64_t TokensPerBatch() const = 0;  // tokens (or samples) one batch carries
  // A held-out evaluation after training, as a summary fragment ("" when the data has none).
  virtual bool has_evaluation() const { return false; }
  virtual std::string Evaluate(Module& model) { return ""; }
};

// `dp_rank` of `dp_size`: this rank's place in the data-parallel group (the strategy says).
// Batches are made on `device`.
absl::StatusOr<std::unique_ptr<BatchSource>> BuildData(const config::TrainConfig& cfg, Module& model,
                                                       int dp_rank, int dp_size, Device device);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_BATCH_SOURCES_H_
