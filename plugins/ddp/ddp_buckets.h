// How the "ddp" strategy groups gradients into buckets: a pure function of sizes and an order,
// kept apart from the strategy so that it can be tested on its own.
#ifndef BRAID_PLUGINS_DDP_DDP_BUCKETS_H_
#define BRAID_PLUGINS_DDP_DDP_BUCKETS_H_

#include <cstdint>
#include <vector>

namespace braid::ddp {

struct BucketableParam {
  int64_t bytes = 0;
  // Parameters with different keys (dtype and device) never share a flat buffer.
  int key = 0;
};

// Walks `order` (indices into `params`; every index exactly once) and fills one open bucket per
// key: a parameter joins its key's open bucket unless that would take it past the cap, in which
// case the open bucket is closed and a new one started (so a parameter larger than the cap gets
// a bucket to itself). The first bucket of each key is capped at `first_cap_bytes`, the others
// at `cap_bytes`: a small first bucket starts communication early in the backward pass.
// Buckets come back sorted by the position of their first parameter in `order`, each listing its
// parameters in `order`'s order, so reducing them in sequence follows `order`.
std::vector<std::vector<int>> AssignBuckets(const std::vector<BucketableParam>& params,
                                            const std::vector<int>& order, int64_t first_cap_bytes,
                                            int64_t cap_bytes);

}  // namespace braid::ddp

#endif  // BRAID_PLUGINS_DDP_DDP_BUCKETS_H_
