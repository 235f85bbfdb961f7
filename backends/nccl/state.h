// What a communicator and its Works share: the NCCL handle, the stream, the operations in flight
// and the abort machinery. Separate from the communicator because Works (work.h) hold it too and
// may outlive the communicator.
#ifndef BRAID_BACKENDS_NCCL_STATE_H_
#define BRAID_BACKENDS_NCCL_STATE_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/nccl/progress.h"
#include "backends/nccl/watchdog.h"
#include "core/store.h"
#include "core/tensor.h"

namespace braid::nccl::internal {

// A CUDA event, shared by the operations of one group launch.
struct Event {
  cudaEvent_t event = nullptr;
  int device = 0;
  ~Event();
};

// One operation as its Work and the communicator see it.
struct Op {
  int64_t seq = -1;             // collectives only
  std::string what;             // "AllReduce(sum, f32, 1024 elements)"
  int peer = -1;                // point-to-point only
  std::shared_ptr<Event> done;  // recorded on the communicator's stream at launch
  bool launched = false;        // false while its group is still open
  bool completed = false;
  absl::Status status;             // of a completed operation
  std::vector<Tensor> keep_alive;  // the operation's tensors, until it completes
};

// What a communicator and its Works share. Works hold it, so a Work may outlive its
// communicator (it then reports what happened before the communicator went away).
struct State {
  absl::Mutex mu;
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  int device_index = 0;
  int rank = 0;
  int size = 1;
  std::string group_name;
  bool blocking = false;
  bool grouped_blocks = false;  // always take the uneven-block path (tests)
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the caller's stream before each operation
  Store* store = nullptr;       // null for a store-less world of one, or once destroyed
  std::string prefix;           // of this group's store keys
  std::unique_ptr<ProgressPublisher> publisher;

  int64_t next_seq = 0;
  int num_children = 0;
  int group_depth = 0;
  bool aborted = false;
  std::string abort_reason;
  std::deque<std::string> log;
  std::deque<std::shared_ptr<Op>> in_flight;    // launched, in stream order
  std::vector<std::shared_ptr<Op>> unlaunched;  // issued inside the open group
  // Tensors of operations that failed after NCCL may have queued work on the stream: held
  // until the communicator is destroyed with an idle stream.
  std::vector<Tensor> zombies;
  std::thread aborter;  // runs ncclCommAbort
  // Times out the operations ordered on the device (Work::WaitOnDevice), which no host Wait
  // watches; made at the first. Stopped (and never made again) when the communicator is
  // destroyed, before its store may go away.
  std::unique_ptr<Watchdog> watchdog;
  bool watchdog_stopped = false;
  bool watchdog_reported = false;  // it said why it aborted, once

  ~State();

  // Stops the watchdog: call without holding `mu` (a sweep in progress takes it).
  void StopWatchdog();

  void JoinAborter() {
    if (aborter.joinable()) aborter.join();
  }

  std::string Describe() const;
  std::string Where() const;
  void Log(std::string entry);
  std::string RecentOps() const;
  absl::Status AbortedError(const std::string& what) const;

  // Fails `op` with `status`. Its tensors stay alive until the stream is known to be idle,
  // because NCCL may have queued work on them before the failure.
  void FailLocked(Op& op, const absl::Status& status);

  // Releases the tensors of the operations at the front of the stream's queue that the stream
  // has passed (they complete in stream order). Only the stream's progress frees tensors: an
  // aborted operation's kernel may still run until it sees the abort.
  void ReapLocked();

  // Aborts the NCCL communicator (after a timeout or an NCCL/CUDA error). Operations that had
  // already finished keep their result; every other one fails saying why.
  void AbortLocked(const std::string& reason);

  // On its own thread: ncclCommAbort may wait for kernels queued behind the caller's work,
  // and a timeout must return when it expires, not when the GPU gets there.
  void AbortCommLocked();

  // Waits up to `limit` for the stream to run dry.
  bool StreamIdleLocked(absl::Duration limit);

  // With a non-blocking communicator, a call may return ncclInProgress: NCCL is still working
  // on it in the background and no other call may be made until it settles. Polls until it
  // does, or until `deadline` (then returns ncclInProgress).
  ncclResult_t SettleLocked(ncclResult_t r, ncclComm_t c, absl::Time deadline);
};

}  // namespace braid::nccl::internal

#endif  // BRAID_BACKENDS_NCCL_STATE_H_
