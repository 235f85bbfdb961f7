// Where the training program's batches come from: the loader the dataset's registration supplies
// (DatasetSpec::open), for this rank's share by the strategy's data-parallel rank. The program
// names no dataset.
#ifndef BRAID_LAUNCHER_BATCH_SOURCES_H_
#define BRAID_LAUNCHER_BATCH_SOURCES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/batch_source.h"
#include "launcher/config/train_config.pb.h"
#include "core/module.h"

namespace braid::launcher {

// Where batches come from: the dataset's own loader (core/batch_source.h).
using BatchSource = ::braid::BatchSource;

// `dp_rank` of `dp_size`: this rank's place in the data-parallel group (the strategy says).
// Batches are made on `device`.
absl::StatusOr<std::unique_ptr<BatchSource>> BuildData(const config::TrainConfig& cfg, Module& model,
                                                       int dp_rank, int dp_size, Device device);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_BATCH_SOURCES_H_
