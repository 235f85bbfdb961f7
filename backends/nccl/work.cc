// Waiting for an NCCL operation, and what a timeout reports and aborts (work.h).
#include "backends/nccl/work.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/progress.h"

namespace braid::nccl::internal {

absl::Status NcclWork::Wait() {
  const absl::Time start = absl::Now();
  absl::Duration nap = absl::ZeroDuration();
  while (true) {
    {
      absl::MutexLock lock(&state_->mu);
      std::optional<absl::Status> done = PollLocked();
      if (done.has_value()) return *done;
    }
    if (absl::Now() - start >= timeout_) break;
    // Short waits first: most collectives finish in microseconds to milliseconds.
    if (nap == absl::ZeroDuration()) {
      std::this_thread::yield();
      nap = absl::Microseconds(5);
    } else {
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(2));
    }
  }
  return TimedOut();
}

bool NcclWork::IsCompleted() {
  absl::MutexLock lock(&state_->mu);
  if (!op_->launched && !op_->completed) return false;  // its group is still open
  return PollLocked().has_value();
}

std::optional<absl::Status> NcclWork::PollLocked() {
  State& s = *state_;
  Op& op = *op_;
  if (op.completed) return op.status;
  if (!op.launched) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL ", op.what, " on ", s.Where(),
        " was issued inside an open GroupGuard and is launched when the group ends: End() the "
        "group before waiting for its operations"));
  }
  if (s.aborted) {
    // AbortLocked completes every launched operation; this is only a safety net.
    op.completed = true;
    op.status = s.AbortedError(op.what);
    return op.status;
  }
  cudaError_t q = cudaEventQuery(op.done->event);
  if (q == cudaErrorNotReady && s.comm == nullptr) {
    // Destroyed while this was running: the destructor waited, and gave up.
    op.completed = true;
    op.status = absl::CancelledError(absl::StrCat(
        "NCCL ", Label(), " on ", s.Where(), ": the communicator was destroyed before it ended"));
    return op.status;
  }
  if (q == cudaSuccess) {
    s.ReapLocked();
    op.completed = true;
    return op.status;
  }
  if (q != cudaErrorNotReady) {
    absl::Status st = CudaStatus(q, absl::StrCat("waiting for NCCL ", op.what, " on ", s.Where()));
    s.AbortLocked(std::string(st.message()));
    op.completed = true;
    op.status = st;
    return st;
  }
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(s.comm, &async);
  if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress) r = async;
  if (r != ncclSuccess) {
    absl::Status st = absl::UnavailableError(absl::StrCat(
        "NCCL ", Label(), " in ", s.Describe(), " failed on rank ", s.rank, ": ",
        NcclMessage(r, s.comm),
        ". NCCL reports an asynchronous error (a peer exited, or the network or a GPU failed); "
        "the communicator has been aborted. ",
        s.RecentOps()));
    s.AbortLocked(std::string(st.message()));
    op.completed = true;
    op.status = st;
    return st;
  }
  return std::nullopt;
}

std::string NcclWork::Label() const {
  return op_->seq >= 0 ? absl::StrCat(op_->what, " #", op_->seq) : op_->what;
}

absl::Status NcclWork::TimedOut() {
  Store* store;
  std::string prefix;
  int size, rank;
  {
    absl::MutexLock lock(&state_->mu);
    // It may have finished while we slept.
    std::optional<absl::Status> done = PollLocked();
    if (done.has_value()) return *done;
    store = state_->store;
    prefix = state_->prefix;
    size = state_->size;
    rank = state_->rank;
  }
  // Outside the lock: the store may be slow, and the communicator's thread may go on.
  std::string who;
  if (size == 1) {
    who =
        "this is a group of one rank, so the hang is on this GPU (work queued before it on "
        "the caller's stream that does not finish?).";
  } else if (store == nullptr) {
    who = "no store to ask which ranks have started it; NCCL cannot tell which is missing.";
  } else {
    std::vector<PeerProgress> progress = ReadProgress(store, prefix, size, rank);
    std::vector<std::string> unknown, states;
    std::vector<int> behind_ranks;
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const PeerProgress& p = progress[r];
      if (!p.known) {
        unknown.push_back(absl::StrCat("rank ", r, " (", p.error, ")"));
        continue;
      }
      std::string last =
          p.seq < 0 ? std::string("nothing yet") : absl::StrCat("#", p.seq, " ", p.what);
      states.push_back(absl::StrCat("rank ", r, ": ", last));
      if (op_->seq >= 0 && p.seq < op_->seq) behind_ranks.push_back(r);
    }
    if (op_->seq < 0) {
      who = absl::StrCat("NCCL cannot tell whether rank ", op_->peer,
                         " posted the matching operation. Last collective each rank started, "
                         "per the store's progress keys: ",
                         states.empty() ? "(none readable)" : absl::StrJoin(states, "; "), ".");
    } else if (!behind_ranks.empty()) {
      who = absl::StrCat("rank(s) ", absl::StrJoin(behind_ranks, ","),
                         " have not started it, per the progress keys in the rendezvous store "
                         "(NCCL itself cannot tell which rank is missing). Last collective "
                         "each rank started: ",
                         absl::StrJoin(states, "; "), ".");
    } else if (unknown.empty()) {
      who = absl::StrCat(
          "every rank has started it, per the progress keys in the rendezvous "
          "store, so the hang is inside NCCL: a peer's GPU, or the network "
          "between ranks; NCCL cannot tell which rank. Last collective each "
          "rank started: ",
          absl::StrJoin(states, "; "), ".");
    } else {
      who = "";
    }
    if (!unknown.empty()) {
      who = absl::StrCat(who, who.empty() ? "" : " ",
                         "NCCL cannot tell which rank is missing, and the progress keys of ",
                         absl::StrJoin(unknown, ", "), " could not be read.");
    }
  }
  absl::MutexLock lock(&state_->mu);
  std::optional<absl::Status> done = PollLocked();
  if (done.has_value()) return *done;
  absl::Status st = absl::DeadlineExceededError(
      absl::StrCat("NCCL ", Label(), " in ", state_->Describe(), " timed out after ",
                   absl::FormatDuration(timeout_), " on rank ", rank,
                   " (cuda:", state_->device_index, "): ", who,
                   " The communicator has been aborted (ncclCommAbort); create a new one to go "
                   "on. ",
                   state_->RecentOps()));
  state_->AbortLocked(absl::StrCat("timeout of ", Label()));
  op_->completed = true;
  op_->status = st;
  return st;
}

}  // namespace braid::nccl::internal
