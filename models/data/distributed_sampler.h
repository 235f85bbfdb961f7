// Which samples of a data set each rank sees in an epoch (like PyTorch's DistributedSampler).
// Every rank computes the same epoch order from (seed, epoch) alone, so no communication is
// needed; ranks then take interleaved positions of it.
#ifndef BRAID_MODELS_DATA_DISTRIBUTED_SAMPLER_H_
#define BRAID_MODELS_DATA_DISTRIBUTED_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace braid::data {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  // Shards must be equal so that every rank runs the same number of steps (a collective waits
  // for all ranks). With drop_last the epoch drops its last N mod W samples; otherwise it is
  // padded by repeating samples from its start, so up to W-1 samples are seen twice.
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // Needs N >= 0, W >= 1, 0 <= rank < W; with drop_last, N >= W (else no rank gets a sample).
  static absl::StatusOr<DistributedSampler> Create(int64_t dataset_size, int rank, int world_size,
                                                   DistributedSamplerOptions options = {});

  // Sample indices of this rank for `epoch`: position rank, rank + W, rank + 2W, ... of the
  // epoch order. Ranks' positions are disjoint and together cover the (padded or cut) epoch.
  std::vector<int64_t> Indices(int64_t epoch) const;
  // The whole epoch order before sharding (length W * num_samples()), the same on every rank.
  std::vector<int64_t> EpochOrder(int64_t epoch) const;
  int64_t num_samples() const { return num_samples_; }  // per rank, every epoch

 private:
  DistributedSampler(int64_t n, int rank, int world, DistributedSamplerOptions o);

  int64_t dataset_size_;
  int rank_;
  int world_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
};

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_DISTRIBUTED_SAMPLER_H_
