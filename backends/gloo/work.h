// The Gloo communicator's Work handles: GlooWork for the collectives (finished by the worker
// thread) and P2pWork for Sends and Recvs (completed by whoever waits first, see P2pOp).
// Separate from the communicator because they outlive it: a caller may hold a Work after the
// communicator is gone.
#ifndef BRAID_BACKENDS_GLOO_WORK_H_
#define BRAID_BACKENDS_GLOO_WORK_H_

#include <gloo/transport/unbound_buffer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/gloo/core_state.h"
#include "core/communicator.h"
#include "core/tensor.h"

namespace braid::gloo_backend::internal {

// ---- Work ------------------------------------------------------------------------------------

class GlooWork final : public Work {
 public:
  GlooWork(std::shared_ptr<Core> core, std::string what, absl::Duration budget)
      : core_(std::move(core)), what_(std::move(what)), budget_(budget) {}

  absl::Status Wait() override { return WaitFor(budget_); }

  absl::Status WaitFor(absl::Duration budget);

  bool IsCompleted() override;

  void Finish(absl::Status status);

 private:
  std::shared_ptr<Core> core_;
  const std::string what_;
  const absl::Duration budget_;
  absl::Mutex mu_;
  bool done_ = false;
  absl::Status status_;
};

// ---- Send and Recv in flight -----------------------------------------------------------------

// A posted Send or Recv, over TCP (P2pOp) or shared memory (ShmOp, shm_link.h).
class Flight {
 public:
  virtual ~Flight() = default;
  virtual absl::Status Wait(absl::Duration budget) = 0;
  virtual bool IsCompleted() = 0;
  // The Work was dropped: the operation must still complete, and its memory outlive it.
  virtual void Release() = 0;
  // For the communicator's destructor: every operation ends (by its timeout at the latest)
  // before the connections close.
  virtual void Drain() = 0;
};

// One Send or Recv after it was posted. Whoever first waits for it blocks on the transport's
// buffer itself, so the transport's thread wakes that caller directly when the message is in.
// (It used to be a thread per operation, waiting from the start: a second wake-up per message.
// With every core computing, the scheduler queued that thread behind a computing rank for a
// time slice while the waker's core went idle: 2-8 ms per message in a 2-stage pipeline's
// trace, issue 11.) A thread waits instead only when the result is polled (IsCompleted) or the
// Work is dropped unwaited: the transport still reads from or writes into the tensor's memory,
// which `keep` holds until then.
class P2pOp final : public Flight, public std::enable_shared_from_this<P2pOp> {
 public:
  P2pOp(std::shared_ptr<Core> core, std::unique_ptr<::gloo::transport::UnboundBuffer> buf,
        Tensor keep, bool send, int peer, std::string what, uint64_t id, absl::Duration timeout)
      : core_(std::move(core)), buf_(std::move(buf)), keep_(std::move(keep)), send_(send),
        peer_(peer), what_(std::move(what)), id_(id), timeout_(timeout) {}

  absl::Status Wait(absl::Duration budget) override;
  bool IsCompleted() override;
  void Release() override;
  void Drain() override { (void)Wait(timeout_ + absl::Seconds(5)); }

 private:
  // Called holding mu_.
  void WaitInBackground() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // On the claiming thread only.
  absl::Status Block();

  std::shared_ptr<Core> core_;
  // Only the claiming thread touches it before done_.
  std::unique_ptr<::gloo::transport::UnboundBuffer> buf_;
  Tensor keep_;
  const bool send_;
  const int peer_;
  const std::string what_;
  const uint64_t id_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  bool claimed_ = false;  // GUARDED_BY(mu_): a thread blocks (or blocked) on the transport
  bool done_ = false;     // GUARDED_BY(mu_)
  absl::Status status_;   // GUARDED_BY(mu_)
};

class P2pWork final : public Work {
 public:
  P2pWork(std::shared_ptr<Flight> op, absl::Duration budget)
      : op_(std::move(op)), budget_(budget) {}
  ~P2pWork() override { op_->Release(); }
  absl::Status Wait() override { return op_->Wait(budget_); }
  bool IsCompleted() override { return op_->IsCompleted(); }

 private:
  std::shared_ptr<Flight> op_;
  const absl::Duration budget_;
};

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_WORK_H_
