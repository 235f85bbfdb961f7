// The reduce-scatter written here rather than taken from Gloo (see "Algorithms" in
// gloo_communicator.h for why), and the grow-only scratch memory it and the up-casts reuse.
// Separate from the communicator: a self-contained algorithm over Gloo's unbound buffers.
#ifndef BRAID_BACKENDS_GLOO_RING_H_
#define BRAID_BACKENDS_GLOO_RING_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/gloo/reduce_kernels.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace braid::gloo_backend::internal {

// Grow-only scratch memory, used by the worker thread only.
class Scratch {
 public:
  template <typename T>
  T* Get(size_t n) {
    size_t bytes = n * sizeof(T);
    if (bytes > size_) {
      data_.reset(new char[bytes]);
      size_ = bytes;
    }
    return reinterpret_cast<T*>(data_.get());
  }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
};

// Rank r of the group ends with block r of the element-wise reduction (fn) of every rank's
// `in` in `out`; block q is counts[q] elements of `elem` bytes.
//
// A ring of n-1 steps: at step s rank r sends block (r-s-1) mod n to rank r+1 and receives block
// (r-s-2) mod n from rank r-1, which it reduces with its own copy of that block; what it reduced
// at step s is what it sends at step s+1, and at the last step it receives its own block. Blocks
// travel in segments, so reducing one segment overlaps receiving the next, and each segment is
// sent on as soon as it is reduced. Messages between two ranks share one slot: the transport
// matches them in posting order, which is the same on both sides.
void RingReduceScatter(::gloo::Context& ctx, const char* in, char* out,
                       const std::vector<int64_t>& counts, size_t elem, ReduceFn fn, uint64_t slot,
                       std::chrono::milliseconds timeout, size_t segment_bytes, Scratch& scratch);

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_RING_H_
