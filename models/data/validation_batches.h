// The held-out batches a language model is evaluated on during training (the config's `eval`
// section): a fixed set, the same every time it is asked for, so validation losses from
// different steps (and different runs, layouts and strategies) are comparable.
#ifndef BRAID_MODELS_DATA_VALIDATION_BATCHES_H_
#define BRAID_MODELS_DATA_VALIDATION_BATCHES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/batch.h"
#include "models/data/token_data.h"

namespace braid::data {

// `count` batches of `batch` windows of `context` tokens from `tokens` (a validation split's
// stream): inputs i32 [batch, context] and targets the same windows shifted by one. The
// count x batch windows start at evenly spaced offsets from the first token to the last window
// that fits, in order (batch 0's rows first), so they cover the whole stream whatever its size;
// a stream too short for that many disjoint windows gives overlapping ones. Needs a stream of
// more than `context` tokens (InvalidArgument naming it otherwise) and count, batch, context >= 1.
absl::StatusOr<std::vector<Batch>> ValidationBatches(const TokenFile& tokens, int64_t count,
                                                     int64_t batch, int64_t context,
                                                     Device device = Device::CPU());

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_VALIDATION_BATCHES_H_
