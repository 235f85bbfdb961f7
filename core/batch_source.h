// BatchSource: where a training program's batches come from, one data-parallel rank's share of a
// dataset. A dataset's registration (DatasetSpec::open, core/registry.h) opens one, so the
// training program reads every dataset through this interface and knows none by name.
#ifndef BRAID_CORE_BATCH_SOURCE_H_
#define BRAID_CORE_BATCH_SOURCE_H_

#include <cstdint>
#include <string>

#include "core/batch.h"
#include "core/device.h"
#include "core/module.h"

namespace braid {

namespace config {
class Sections;  // core/config/sections.proto
}  // namespace config

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next micro-batch of this rank's share.
  virtual Batch Next() = 0;
  // The tokens (or samples, for a dataset of samples) one batch carries: the throughput's unit.
  virtual int64_t TokensPerBatch() const = 0;
  // A held-out evaluation after training, as a summary fragment ("test accuracy 97.1% ..."); a
  // dataset without one keeps the defaults.
  virtual bool has_evaluation() const { return false; }
  virtual std::string Evaluate(Module& model) { return ""; }
};

// What a dataset's loader is opened with.
struct BatchSourceRequest {
  const config::Sections* config = nullptr;  // validated; its data section names the dataset
  int64_t batch = 1;    // samples per micro-batch (train_micro_batch_size_per_gpu)
  int64_t context = 1;  // tokens per sample (ModelSpec::context); 1 for a model of samples
  int dp_rank = 0;      // this rank's place in the data-parallel group (the strategy says)
  int dp_size = 1;
  Device device = Device::CPU();  // where the batches are made
};

}  // namespace braid

#endif  // BRAID_CORE_BATCH_SOURCE_H_
