#include "models/data/distributed_sampler.h"

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/data/random.h"

namespace braid::data {

DistributedSampler::DistributedSampler(int64_t n, int rank, int world, DistributedSamplerOptions o)
    : dataset_size_(n), rank_(rank), world_(world), options_(o) {
  num_samples_ = options_.drop_last ? n / world : (n + world - 1) / world;
}

absl::StatusOr<DistributedSampler> DistributedSampler::Create(int64_t dataset_size, int rank,
                                                              int world_size,
                                                              DistributedSamplerOptions options) {
  if (dataset_size < 0 || world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedSampler: need dataset size >= 0 and 0 <= rank < world size; got size ",
        dataset_size, ", rank ", rank, ", world size ", world_size));
  }
  if (options.drop_last && dataset_size < world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: with drop_last, a data set of ", dataset_size,
                     " samples leaves nothing for ", world_size, " ranks; turn drop_last off"));
  }
  return DistributedSampler(dataset_size, rank, world_size, options);
}

std::vector<int64_t> DistributedSampler::EpochOrder(int64_t epoch) const {
  std::vector<int64_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle) {
    // Mix seed and epoch through the generator, so that neighbouring seeds or epochs give
    // unrelated permutations.
    SplitMix64 mix(options_.seed);
    SplitMix64 rng(mix.Next() ^ (uint64_t(epoch) * 0xD1B54A32D192ED03ull));
    for (int64_t i = dataset_size_ - 1; i > 0; --i) {
      std::swap(order[i], order[UniformBelow(rng, uint64_t(i) + 1)]);
    }
  }
  const int64_t total = num_samples_ * world_;
  if (total <= dataset_size_) {
    order.resize(total);
  } else {
    // Pad by cycling from the start (more than once when N < W).
    for (int64_t i = dataset_size_; i < total; ++i) {
      order.push_back(order[i % dataset_size_]);
    }
  }
  return order;
}

std::vector<int64_t> DistributedSampler::Indices(int64_t epoch) const {
  std::vector<int64_t> order = EpochOrder(epoch);
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = rank_; i < int64_t(order.size()); i += world_) mine.push_back(order[i]);
  return mine;
}

}  // namespace braid::data
