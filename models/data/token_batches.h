// The token datasets' loader for the training program (DatasetSpec::open of "moby-dick" and
// "tokens"): windows of `context` tokens from a flat token file or a prepared data set's training
// split, drawn by the reference run's random sampler or read in order by the sequential loader,
// each rank its own share.
#ifndef BRAID_MODELS_DATA_TOKEN_BATCHES_H_
#define BRAID_MODELS_DATA_TOKEN_BATCHES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/batch_source.h"

namespace braid::data {

// data.path, or when it is empty the file `standard` names under the data folders (FindDataFile;
// "" when the dataset has no standard file and validation has required a path). data.path must
// exist when `standard` is empty; a prepared data set's ids are checked against
// model.vocab_size.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenTokenBatches(const BatchSourceRequest& request,
                                                              const std::string& standard);

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_TOKEN_BATCHES_H_
