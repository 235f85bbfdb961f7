// The collectives as they run on the Gloo communicator's worker thread, one at a time, with the
// state only that thread touches (the running operation's timeout, scratch memory). Separate
// from the communicator, which checks arguments, queues the calls and reports their results.
#ifndef BRAID_BACKENDS_GLOO_COLLECTIVES_H_
#define BRAID_BACKENDS_GLOO_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "backends/gloo/core_state.h"
#include "backends/gloo/reduce_kernels.h"
#include "backends/gloo/ring.h"
#include "core/communicator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace braid::gloo_backend::internal {

// Each Run* throws on transport errors (Gloo's exceptions), for the caller to turn into a status.
// The arguments have been checked; `seq` is the collective's sequence number (its Gloo tag).
class Collectives {
 public:
  explicit Collectives(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  // The timeout of the collectives run from now on (set before each one).
  void set_op_timeout(absl::Duration timeout) { op_timeout_ = timeout; }

  void RunAllReduce(const Tensor& t, ReduceOp op, int64_t seq);
  void RunReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op,
                        const std::vector<int64_t>& counts, int64_t seq);
  void RunAllGather(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                    bool equal, int64_t seq);
  void RunBroadcast(const Tensor& tensor, int root, int64_t seq);
  void RunReduce(const Tensor& t, int root, ReduceOp op, int64_t seq);
  void RunBarrier(int64_t seq);

 private:
  int rank() const { return core_->group.rank; }
  int size() const { return core_->group.size; }

  ReduceFn Fn(DType t, ReduceOp op);
  void AllReduceNative(void* data, size_t n, DType t, ReduceOp op, int64_t seq);
  void DirectAllReduce(char* data, size_t bytes, size_t elem, ReduceFn fn, int64_t seq);

  std::shared_ptr<Core> core_;
  absl::Duration op_timeout_;
  Scratch upcast_in_, upcast_out_, ring_;
};

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_COLLECTIVES_H_
