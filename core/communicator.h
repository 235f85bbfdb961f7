// Communicator (process group): the collectives strategies use. Implementations: the
// in-process one here (ranks as threads, for tests), Gloo and NCCL in backends/.
//
// Every call returns a Work handle at once; the operation may run on the communicator's own
// thread so that strategies overlap communication with compute. Every Wait has a timeout, and a
// timeout is an error naming the operation, its sequence number and the ranks that did not come.
#ifndef BRAID_CORE_COMMUNICATOR_H_
#define BRAID_CORE_COMMUNICATOR_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor.h"

namespace braid {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* ReduceOpName(ReduceOp op);

// Which dtypes each reduction takes: the one rule every communicator (in-process, Gloo, NCCL)
// applies, so that all of them accept and refuse the same (op, dtype) pairs with the same
// message. PyTorch's rule: sum, max and min take every dtype (f32 bf16 f16 i32 i64 u8 i8); avg
// takes floating dtypes only (an integer average would round, and PyTorch refuses it). OK, or
// InvalidArgument "<where>: cannot reduce i32 with avg: avg needs a floating dtype, got i32 (...)"
// (no "<where>: " when `where` is empty).
absl::Status CheckReduction(ReduceOp op, DType dtype, const std::string& where = "");

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done or the timeout (the communicator's default when infinite is not given).
  virtual absl::Status Wait() = 0;
  virtual bool IsCompleted() = 0;
  // For a result only device work consumes: orders the device's compute work after the
  // operation without blocking the host (NCCL: the compute stream waits for the operation's
  // completion event), so the host goes on enqueueing while the collective runs. A host read of
  // the result still sees it, since reads go through that stream. Returns an error known now (a
  // refused or failed operation); one that comes later (a timeout, a peer's failure) is the
  // communicator's: its watchdog aborts it and says why, and every later call and Wait reports
  // it. The default, for communicators whose results land in host-visible memory (in-process,
  // Gloo), is Wait().
  virtual absl::Status WaitOnDevice() { return Wait(); }
};

// The per-rank block sizes of a ReduceScatter / AllGather buffer of `total` elements: `counts`
// when given (one non-negative count per rank, summing to total), else equal blocks. Errors
// begin with `where` ("AllGather on rank 1 of group 'x'"); every backend shares these rules.
absl::StatusOr<std::vector<int64_t>> BlockCounts(const std::string& where, int64_t total,
                                                 int size, const std::vector<int64_t>& counts);

// A finished Work carrying `status`, for synchronous implementations.
std::shared_ptr<Work> CompletedWork(absl::Status status = absl::OkStatus());

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "inprocess", "gloo", "nccl"

  // In place on every rank.
  virtual std::shared_ptr<Work> AllReduce(Tensor& t, ReduceOp op) = 0;
  // input: the concatenation of size() blocks, block r of counts[r] elements (empty counts:
  // equal blocks); output gets this rank's reduced block.
  virtual std::shared_ptr<Work> ReduceScatter(const Tensor& input, Tensor& output, ReduceOp op,
                                              const std::vector<int64_t>& counts = {}) = 0;
  // output = concatenation of every rank's input, rank order (counts as above).
  virtual std::shared_ptr<Work> AllGather(const Tensor& input, Tensor& output,
                                          const std::vector<int64_t>& counts = {}) = 0;
  virtual std::shared_ptr<Work> Broadcast(Tensor& t, int root) = 0;
  // The result lands in t on root; other ranks' t is left unspecified.
  virtual std::shared_ptr<Work> Reduce(Tensor& t, int root, ReduceOp op) = 0;
  // Point to point. Posting never blocks; a Send and a Recv match by (peer, tag), in issue order
  // per tag, whichever side posts first. Works may be waited for in any order (a pipeline's
  // stages wait for what they need next), and a Work dropped unwaited still completes: the
  // communicator keeps the tensor alive until then.
  virtual std::shared_ptr<Work> Send(const Tensor& t, int dst, int tag) = 0;
  virtual std::shared_ptr<Work> Recv(Tensor& t, int src, int tag) = 0;
  virtual std::shared_ptr<Work> Barrier() = 0;

  // A communicator over a subset of this one's ranks (given in this group's numbering, every
  // member passing the same list). Ranks not in the list must also call it and get nullptr.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks) = 0;

  void set_timeout(absl::Duration t) { timeout_ = t; }
  absl::Duration timeout() const { return timeout_; }

 protected:
  absl::Duration timeout_ = absl::Minutes(5);
};

class Store;

// What a communicator plugin needs to join a group.
struct CommunicatorOptions {
  int rank = 0;
  int size = 1;
  Store* store = nullptr;  // rendezvous, not owned; keys are namespaced by the caller
  Device device = Device::CPU();
  absl::Duration timeout = absl::Minutes(5);  // default for every collective
  // Backend-specific settings ("iface" -> "veth0", "hostname" -> "10.0.0.1").
  std::map<std::string, std::string> options;
};

using CommunicatorFactory =
    std::function<absl::StatusOr<std::unique_ptr<Communicator>>(const CommunicatorOptions&)>;

}  // namespace braid

#endif  // BRAID_CORE_COMMUNICATOR_H_
