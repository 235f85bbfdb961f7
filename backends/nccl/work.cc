// Waiting for an NCCL operation, and what a timeout reports and aborts (work.h).
#include "backends/nccl/work.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/progress.h"

namespace braid::nccl::internal {
namespace {

// How often the watchdog polls the operations ordered on the device (PyTorch's NCCL watchdog
// sleeps 100 ms between its polls too): a cudaEventQuery each, nothing the training thread
// waits for.
constexpr absl::Duration kWatchdogPeriod = absl::Milliseconds(100);

// What the watchdog found, said on stderr: nobody may be waiting on the host to hear it, and
// the abort it caused is what every later call on the communicator reports.
void Report(const absl::Status& st) {
  std::fprintf(stderr, "NCCL watchdog: %s\n", std::string(st.message()).c_str());
}

// Hands `op` to the state's watchdog (made on first use), due `timeout` from now. The closures
// hold the state by pointer: the watchdog is the state's and is stopped before it goes away.
void WatchLocked(State& s, std::shared_ptr<Op> op, absl::Duration timeout) {
  if (s.watchdog_stopped) return;  // the communicator is being destroyed; it waits for its ops
  if (s.watchdog == nullptr) s.watchdog = std::make_unique<Watchdog>(kWatchdogPeriod);
  State* state = &s;
  s.watchdog->Add({[state, op] {
                     absl::MutexLock lock(&state->mu);
                     const bool already = op->completed;
                     std::optional<absl::Status> done = PollLocked(*state, *op);
                     if (!done.has_value()) return false;
                     // An asynchronous NCCL or CUDA error this poll found (and aborted on).
                     if (!already && !done->ok() && !state->watchdog_reported) {
                       state->watchdog_reported = true;
                       Report(*done);
                     }
                     return true;
                   },
                   [state, op, timeout] {
                     absl::Status st = TimedOut(*state, *op, timeout);
                     absl::MutexLock lock(&state->mu);
                     if (!st.ok() && !state->watchdog_reported) {
                       state->watchdog_reported = true;
                       Report(st);
                     }
                   },
                   absl::Now() + timeout});
}

}  // namespace

absl::Status NcclWork::Wait() {
  const absl::Time start = absl::Now();
  absl::Duration nap = absl::ZeroDuration();
  while (true) {
    {
      absl::MutexLock lock(&state_->mu);
      std::optional<absl::Status> done = PollLocked(*state_, *op_);
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
  return TimedOut(*state_, *op_, timeout_);
}

bool NcclWork::IsCompleted() {
  absl::MutexLock lock(&state_->mu);
  if (!op_->launched && !op_->completed) return false;  // its group is still open
  return PollLocked(*state_, *op_).has_value();
}

absl::Status NcclWork::WaitOnDevice() {
  State& s = *state_;
  {
    absl::MutexLock lock(&s.mu);
    std::optional<absl::Status> done = PollLocked(s, *op_);
    if (done.has_value()) return *done;  // ended (or failed, or its group is still open)
    ScopedDevice device;
    absl::Status st = device.Enter(s.device_index);
    // The legacy default stream's wait is an action every blocking stream then waits for
    // (CUDA's legacy-stream rule), as the communicator's ordering of its calls relies on.
    if (st.ok()) {
      st = CudaStatus(cudaStreamWaitEvent(cudaStreamLegacy, op_->done->event, 0),
                      absl::StrCat("making the compute stream wait for NCCL ", Label(*op_)));
    }
    if (!st.ok()) {
      s.AbortLocked(std::string(st.message()));
      s.FailLocked(*op_, st);
      return st;
    }
    WatchLocked(s, op_, timeout_);
  }
  return absl::OkStatus();
}

std::string Label(const Op& op) {
  return op.seq >= 0 ? absl::StrCat(op.what, " #", op.seq) : op.what;
}

std::optional<absl::Status> PollLocked(State& s, Op& op) {
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
        "NCCL ", Label(op), " on ", s.Where(), ": the communicator was destroyed before it ended"));
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
        "NCCL ", Label(op), " in ", s.Describe(), " failed on rank ", s.rank, ": ",
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

absl::Status TimedOut(State& state, Op& op, absl::Duration timeout) {
  Store* store;
  std::string prefix;
  int size, rank;
  {
    absl::MutexLock lock(&state.mu);
    // It may have finished while we slept.
    std::optional<absl::Status> done = PollLocked(state, op);
    if (done.has_value()) return *done;
    store = state.store;
    prefix = state.prefix;
    size = state.size;
    rank = state.rank;
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
      if (op.seq >= 0 && p.seq < op.seq) behind_ranks.push_back(r);
    }
    if (op.seq < 0) {
      who = absl::StrCat("NCCL cannot tell whether rank ", op.peer,
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
  absl::MutexLock lock(&state.mu);
  std::optional<absl::Status> done = PollLocked(state, op);
  if (done.has_value()) return *done;
  absl::Status st = absl::DeadlineExceededError(
      absl::StrCat("NCCL ", Label(op), " in ", state.Describe(), " timed out after ",
                   absl::FormatDuration(timeout), " on rank ", rank,
                   " (cuda:", state.device_index, "): ", who,
                   " The communicator has been aborted (ncclCommAbort); create a new one to go "
                   "on. ",
                   state.RecentOps()));
  state.AbortLocked(absl::StrCat("timeout of ", Label(op)));
  op.completed = true;
  op.status = st;
  return st;
}

}  // namespace braid::nccl::internal
