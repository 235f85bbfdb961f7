// The NCCL communicator's Work: waiting for an operation on the host or on the device, and what
// turns an operation past its timeout into an abort and an error naming the ranks behind. Separate from the
// communicator because it only needs the shared state (state.h), never the communicator.
#ifndef BRAID_BACKENDS_NCCL_WORK_H_
#define BRAID_BACKENDS_NCCL_WORK_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "backends/nccl/state.h"
#include "core/communicator.h"

namespace braid::nccl::internal {

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<State> state, std::shared_ptr<Op> op, absl::Duration timeout)
      : state_(std::move(state)), op_(std::move(op)), timeout_(timeout) {}

  absl::Status Wait() override;
  bool IsCompleted() override;
  // cudaStreamWaitEvent(legacy default stream, the operation's done event): every blocking
  // stream (the compute stream) runs later work after the operation, and the host goes on. The
  // operation is handed to the state's watchdog with a deadline of now + the timeout; past it,
  // the watchdog times it out exactly as Wait would (abort, the same error, also on stderr).
  absl::Status WaitOnDevice() override;

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<Op> op_;
  absl::Duration timeout_;
};

// "AllReduce(sum, f32, 1024 elements) #7" (point-to-point operations have no number).
std::string Label(const Op& op);

// The operation's final status, or nothing while it runs (NCCL's asynchronous errors and CUDA's
// errors abort the communicator and end it). Shared by Wait and the watchdog.
std::optional<absl::Status> PollLocked(State& s, Op& op);

// `op` is still running `timeout` after it was waited for: reads the other ranks' progress
// keys (outside the lock), then, unless it ended meanwhile, aborts the communicator and fails
// the operation with DEADLINE_EXCEEDED naming it, its group and the ranks behind.
absl::Status TimedOut(State& s, Op& op, absl::Duration timeout);

}  // namespace braid::nccl::internal

#endif  // BRAID_BACKENDS_NCCL_WORK_H_
