// The state a communicator shares with its Works: its log, failures, reaping and aborts
// (state.h).
#include "backends/nccl/state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "backends/nccl/errors.h"

namespace braid::nccl::internal {
namespace {

// Recent operations kept per communicator for timeout errors.
constexpr size_t kLogLength = 16;

}  // namespace

Event::~Event() {
  if (event == nullptr) return;
  ScopedDevice d;
  d.Enter(device).IgnoreError();
  cudaEventDestroy(event);
}

State::~State() {
  StopWatchdog();
  JoinAborter();
  ScopedDevice d;
  d.Enter(device_index).IgnoreError();
  if (ready != nullptr) cudaEventDestroy(ready);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void State::StopWatchdog() {
  std::unique_ptr<Watchdog> dog;
  {
    absl::MutexLock lock(&mu);
    watchdog_stopped = true;
    dog = std::move(watchdog);
  }
  dog.reset();  // joins its thread, outside the lock its sweeps take
}

std::string State::Describe() const {
  return absl::StrCat("group '", group_name, "' (", size, size == 1 ? " rank" : " ranks", ")");
}

std::string State::Where() const {
  return absl::StrCat("rank ", rank, " of ", Describe(), " on cuda:", device_index);
}

void State::Log(std::string entry) {
  log.push_back(std::move(entry));
  if (log.size() > kLogLength) log.pop_front();
}

std::string State::RecentOps() const {
  return absl::StrCat("recent operations on rank ", rank,
                      ", newest last: ", log.empty() ? "(none)" : absl::StrJoin(log, ", "));
}

absl::Status State::AbortedError(const std::string& what) const {
  return absl::FailedPreconditionError(absl::StrCat("NCCL ", what, " on ", Where(),
                                                    ": the communicator was aborted (",
                                                    abort_reason, "); create a new communicator"));
}

void State::FailLocked(Op& op, const absl::Status& status) {
  op.completed = true;
  op.status = status;
  for (Tensor& t : op.keep_alive) zombies.push_back(std::move(t));
  op.keep_alive.clear();
}

void State::ReapLocked() {
  while (!in_flight.empty()) {
    Op& op = *in_flight.front();
    if (cudaEventQuery(op.done->event) != cudaSuccess) break;
    op.completed = true;  // keeps an abort error set earlier
    op.keep_alive.clear();
    in_flight.pop_front();
  }
}

void State::AbortLocked(const std::string& reason) {
  if (aborted) return;
  aborted = true;
  abort_reason = reason;
  ScopedDevice device;
  device.Enter(device_index).IgnoreError();
  ReapLocked();
  for (auto& op : in_flight) {
    op->completed = true;
    op->status = AbortedError(op->what);
  }
  // Calls recorded in an open NCCL group still refer to the communicator: GroupEnd launches
  // them and then aborts it.
  if (group_depth == 0) AbortCommLocked();
}

void State::AbortCommLocked() {
  if (comm == nullptr) return;
  ncclComm_t c = comm;
  comm = nullptr;
  const int device = device_index;
  aborter = std::thread([c, device] {
    cudaSetDevice(device);
    ncclCommAbort(c);
  });
}

bool State::StreamIdleLocked(absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (true) {
    cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady || absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
}

ncclResult_t State::SettleLocked(ncclResult_t r, ncclComm_t c, absl::Time deadline) {
  absl::Duration nap = absl::Microseconds(1);
  while (r == ncclInProgress) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(c, &state);
    if (q != ncclSuccess) return q;
    if (state != ncclInProgress) return state;
    if (absl::Now() >= deadline) return ncclInProgress;
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
  return r;
}

}  // namespace braid::nccl::internal
