// Putting the NCCL communicator's operations on its stream: ordering after the caller's stream,
// enqueueing NCCL's call, the completion event a Work waits for, and NCCL groups (GroupStart /
// GroupEnd). Separate from the operations (collectives.cc) because every operation shares it.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "backends/nccl/communicator_impl.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/work.h"

namespace braid::nccl::internal {

std::shared_ptr<Work> NcclCommunicatorImpl::Issue(const std::string& what, size_t bytes, int peer,
                                                  std::vector<Tensor> tensors,
                                                  const Launch& launch) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto op = std::make_shared<Op>();
  op->what = what;
  op->peer = peer;
  if (peer < 0) {
    op->seq = s.next_seq++;
    s.Log(absl::StrCat("#", op->seq, " ", what, " ", bytes, " B"));
  } else {
    s.Log(absl::StrCat(what, " ", bytes, " B"));
  }
  if (s.aborted) return CompletedWork(s.AbortedError(what));
  if (peer < 0 && s.publisher != nullptr) s.publisher->Publish(absl::StrCat(op->seq, " ", what));
  const std::string label = op->seq >= 0 ? absl::StrCat(what, " #", op->seq) : what;

  ScopedDevice device;
  absl::Status st = device.Enter(s.device_index);
  s.ReapLocked();
  // Everything the caller launched before this call (on the legacy default stream, which
  // also waits for every blocking stream) comes first.
  if (st.ok())
    st = CudaStatus(cudaEventRecord(s.ready, cudaStreamLegacy),
                    "cudaEventRecord on the caller's stream");
  if (st.ok())
    st = CudaStatus(cudaStreamWaitEvent(s.stream, s.ready, 0),
                    "cudaStreamWaitEvent on the communicator's stream");
  if (!st.ok()) return CompletedWork(st);

  ncclResult_t r = s.SettleLocked(launch(s.comm, s.stream), s.comm, absl::Now() + timeout());
  if (r == ncclInProgress) {
    std::string msg =
        absl::StrCat("NCCL ", label, " on ", s.Where(), " could not be enqueued within ",
                     absl::FormatDuration(timeout()),
                     " (NCCL was still connecting to its peers); the "
                     "communicator has been aborted. ",
                     s.RecentOps());
    s.AbortLocked(absl::StrCat("enqueue timeout of ", label));
    op->keep_alive = std::move(tensors);
    s.FailLocked(*op, absl::DeadlineExceededError(msg));
    return CompletedWork(op->status);
  }
  if (r != ncclSuccess) {
    absl::Status err = (IsFatal(r) ? absl::UnavailableError : absl::InvalidArgumentError)(
        absl::StrCat("NCCL ", label, " on ", s.Where(), ": ", NcclMessage(r, s.comm),
                     IsFatal(r) ? "; the communicator has been aborted" : ""));
    if (IsFatal(r)) {
      s.AbortLocked(std::string(err.message()));
      op->keep_alive = std::move(tensors);
      s.FailLocked(*op, err);
    }
    return CompletedWork(err);
  }
  op->keep_alive = std::move(tensors);
  if (s.group_depth > 0) {
    s.unlaunched.push_back(op);
  } else {
    st = RecordDoneLocked({op});
    if (!st.ok()) return CompletedWork(st);
  }
  return std::make_shared<NcclWork>(state_, op, timeout());
}

absl::Status NcclCommunicatorImpl::RecordDoneLocked(const std::vector<std::shared_ptr<Op>>& ops) {
  State& s = *state_;
  auto done = std::make_shared<Event>();
  done->device = s.device_index;
  absl::Status st = CudaStatus(cudaEventCreateWithFlags(&done->event, cudaEventDisableTiming),
                               "cudaEventCreateWithFlags");
  if (st.ok())
    st = CudaStatus(cudaEventRecord(done->event, s.stream),
                    "cudaEventRecord on the communicator's stream");
  if (!st.ok()) {
    // The operations are on the stream but cannot be tracked: treat the device as broken.
    s.AbortLocked(std::string(st.message()));
    for (const auto& op : ops) s.FailLocked(*op, st);
    return st;
  }
  for (const auto& op : ops) {
    op->done = done;
    op->launched = true;
    s.in_flight.push_back(op);
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicatorImpl::GroupStart() {
  absl::MutexLock lock(&state_->mu);
  if (state_->aborted) return state_->AbortedError("GroupStart");
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) {
    return absl::InternalError(
        absl::StrCat("ncclGroupStart on ", state_->Where(), ": ", NcclMessage(r, state_->comm)));
  }
  ++state_->group_depth;
  return absl::OkStatus();
}

absl::Status NcclCommunicatorImpl::GroupEnd() {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (s.group_depth == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL GroupEnd on ", s.Where(), " without a matching GroupStart"));
  }
  ScopedDevice device;
  device.Enter(s.device_index).IgnoreError();
  ncclResult_t r = ncclGroupEnd();
  if (--s.group_depth > 0) {
    // An inner group: NCCL launches at the outermost end.
    if (r == ncclSuccess) return absl::OkStatus();
  } else if (!s.aborted) {
    r = s.SettleLocked(r, s.comm, absl::Now() + timeout());
  } else {
    // Aborted while the group was open (AbortLocked deferred it): the group is closed now.
    s.AbortCommLocked();
  }
  std::vector<std::shared_ptr<Op>> ops;
  if (s.group_depth == 0) ops.swap(s.unlaunched);
  std::vector<std::string> names;
  for (const auto& op : ops) {
    names.push_back(op->seq >= 0 ? absl::StrCat(op->what, " #", op->seq) : op->what);
  }
  const std::string group_ops =
      absl::StrCat("group of ", ops.size(), " operation(s) [", absl::StrJoin(names, ", "), "]");
  if (s.aborted) {
    absl::Status err = s.AbortedError(group_ops);
    for (const auto& op : ops) s.FailLocked(*op, err);
    return err;
  }
  if (r != ncclSuccess) {
    absl::Status err;
    if (r == ncclInProgress) {
      err = absl::DeadlineExceededError(absl::StrCat(
          "NCCL ", group_ops, " on ", s.Where(), " could not be launched within ",
          absl::FormatDuration(timeout()), "; the communicator has been aborted. ", s.RecentOps()));
      s.AbortLocked(absl::StrCat("launch timeout of the ", group_ops));
    } else {
      err = (IsFatal(r) ? absl::UnavailableError : absl::InvalidArgumentError)(
          absl::StrCat("NCCL ", group_ops, " on ", s.Where(), ": ", NcclMessage(r, s.comm)));
      if (IsFatal(r)) s.AbortLocked(std::string(err.message()));
    }
    for (const auto& op : ops) s.FailLocked(*op, err);
    return err;
  }
  if (ops.empty()) return absl::OkStatus();
  return RecordDoneLocked(ops);
}

}  // namespace braid::nccl::internal
