// The NCCL communicator: braid::Communicator over NCCL for tensors on one CUDA device per rank.
// Built only with --config=cuda, as the plugin libbraid_nccl.so, which registers it as "nccl".
//
// Joining: every rank calls the factory with the same size and store; rank 0 creates the NCCL
// unique id and publishes it in the rendezvous store, the others read it from there. Each rank
// owns one CUDA device (CommunicatorOptions::device, cuda:N); NCCL refuses two ranks of one
// communicator on the same GPU, so a single-GPU machine can only run world size 1.
//
// Ordering: each communicator has its own CUDA stream. A call records an event on the caller's
// stream and makes the communicator's stream wait for it, so the collective sees everything the
// caller launched before it. The caller's stream is, for now, the LEGACY DEFAULT stream
// (cudaStreamLegacy), which also orders every blocking stream of the process; Braid's CUDA
// backend has no "current stream" yet. A Work records an event on the communicator's stream;
// Wait polls that event (and NCCL's asynchronous error state) until it completes or the timeout
// passes; WaitOnDevice makes the legacy default stream wait for it (cudaStreamWaitEvent) and
// returns, the communicator's watchdog thread then applying the same timeout. The tensors of an operation are kept alive by the communicator until it completes,
// even when its Work is dropped.
//
// Timeouts: a Wait that times out aborts the NCCL communicator (ncclCommAbort: every later call
// on it fails; make a new one) and returns DEADLINE_EXCEEDED naming the operation, its sequence
// number and group, and the ranks that have not started it. NCCL itself cannot tell which rank
// is missing: each rank publishes, through the store and off the hot path, the last collective
// it started ("<prefix>/progress/<rank>"), and a timed-out rank reads the others' keys to name
// the ranks behind. The error also lists this rank's recent operations (op, bytes, sequence).
// Communicator creation is bounded by the same timeout (NCCL's non-blocking mode).
//
// Operations and types: f32, bf16, f16, i32, i64, u8 and i8 device tensors. AllReduce, Reduce and
// ReduceScatter take sum, avg (NCCL's ncclAvg; floating dtypes only, as with the other
// backends), max and min. Equal-block ReduceScatter/AllGather are ncclReduceScatter /
// ncclAllGather; uneven blocks (per-rank counts) are one NCCL group of per-rank ncclReduce /
// ncclBroadcast calls, one per block with that block's rank as root: correct for any counts
// (zeros included), slower than the equal-block collectives for many ranks. Barrier is an
// allreduce of one f32 on the device (it orders GPU work; Wait on it to synchronise the host).
// NewGroup is ncclCommSplit (no new unique id needed). Send/Recv: NCCL matches a pair of ranks'
// sends and receives in issue order; `tag` is only logged. A Send and a Recv that must progress
// together (an exchange between two ranks) belong in one GroupGuard, or they may deadlock.
//
// Options (CommunicatorOptions::options; unknown keys are an error, to catch typos):
//   group_name           name used in errors (default "world")
//   iface                network interface NCCL bootstraps over; sets NCCL_SOCKET_IFNAME,
//                        which NCCL reads once per process (a different value already in the
//                        environment is an error)
//   nccl_blocking        1: blocking NCCL calls (creation no longer bounded by the timeout; a
//                        fallback switch should non-blocking mode misbehave)
//   nccl_grouped_blocks  1: equal blocks take the uneven-block path too (lets one GPU test it)
// The store must be thread-safe (a background thread publishes progress) and outlive the
// communicator and every group made from it. World size 1 may pass no store.
#ifndef BRAID_BACKENDS_NCCL_NCCL_COMMUNICATOR_H_
#define BRAID_BACKENDS_NCCL_NCCL_COMMUNICATOR_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/communicator.h"

namespace braid::nccl {

// What the "nccl" communicator is, beyond braid::Communicator. Callers that do not link the
// plugin reach it through From() and these virtual functions, so no NCCL or CUDA header is needed.
class NcclCommunicator : public Communicator {
 public:
  // `comm` as an NCCL communicator, or nullptr when it is another backend (or null).
  static NcclCommunicator* From(Communicator* comm) {
    return comm != nullptr && comm->name() == "nccl" ? static_cast<NcclCommunicator*>(comm)
                                                     : nullptr;
  }

  // The CUDA device every tensor passed to this communicator must be on.
  virtual Device device() const = 0;
  // The sequence number the next collective will get (collectives are numbered from 0 in the
  // order they are issued; point-to-point operations are not numbered).
  virtual int64_t next_sequence_number() const = 0;
  // True once the communicator was aborted (after a timeout or an NCCL error).
  virtual bool aborted() const = 0;

  // Use GroupGuard rather than these two.
  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd() = 0;
};

// Batches this communicator's calls into one NCCL group (ncclGroupStart/ncclGroupEnd) on the
// calling thread: nothing is launched until End() (or the destructor), which launches them all
// at once, e.g. several small allreduces fused, or a Send and a Recv that must run together.
// Every rank must issue the same grouped collectives. A Work from inside the group cannot be
// waited for before End(); if the launch fails, End() and those Works report why. Guards nest.
//
//   {
//     nccl::GroupGuard group(*nccl::NcclCommunicator::From(comm));
//     auto a = comm->Send(x, peer, 0);
//     auto b = comm->Recv(y, peer, 0);
//   }  // launched here
//   a->Wait(); b->Wait();
class GroupGuard {
 public:
  explicit GroupGuard(NcclCommunicator& comm) : comm_(&comm), status_(comm.GroupStart()) {}
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;
  // A launch error is not lost: every Work of the group carries it.
  ~GroupGuard() { End().IgnoreError(); }

  // Launches the group. Idempotent: later calls return the first result.
  absl::Status End() {
    if (!ended_) {
      ended_ = true;
      // A failed start opened no group, so there is nothing to end.
      if (status_.ok()) status_ = comm_->GroupEnd();
    }
    return status_;
  }

 private:
  NcclCommunicator* comm_;
  absl::Status status_;
  bool ended_ = false;
};

// The factory registered as "nccl" (see the top of this file for what `options` must hold).
// Errors: INVALID_ARGUMENT for bad options (a CPU device, a rank out of range, no store),
// UNAVAILABLE with CUDA's reason when there is no usable GPU, DEADLINE_EXCEEDED when the other
// ranks do not join within options.timeout, naming the ones the store says are missing.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    const CommunicatorOptions& options);

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_NCCL_COMMUNICATOR_H_
