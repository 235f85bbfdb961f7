// The NCCL communicator's Work: waiting for an operation, and the watchdog that turns a Wait
// past the timeout into an abort and an error naming the ranks behind. Separate from the
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

 private:
  // The operation's final status, or nothing while it runs.
  std::optional<absl::Status> PollLocked();

  std::string Label() const;

  absl::Status TimedOut();

  std::shared_ptr<State> state_;
  std::shared_ptr<Op> op_;
  absl::Duration timeout_;
};

}  // namespace braid::nccl::internal

#endif  // BRAID_BACKENDS_NCCL_WORK_H_
