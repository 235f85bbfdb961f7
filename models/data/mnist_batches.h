// MNIST's loader for the training program (DatasetSpec::open of dataset "mnist"): this rank's
// share of the training digits through the distributed sampler, and the held-out test accuracy
// after training.
#ifndef BRAID_MODELS_DATA_MNIST_BATCHES_H_
#define BRAID_MODELS_DATA_MNIST_BATCHES_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/batch_source.h"

namespace braid::data {

absl::StatusOr<std::unique_ptr<BatchSource>> OpenMnistBatches(const BatchSourceRequest& request);

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_MNIST_BATCHES_H_
