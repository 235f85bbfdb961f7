// The Gloo communicator's Send and Recv between two ranks of one host: a pair of shared-memory
// rings (shm_ring.h), one each way, instead of Gloo's loopback TCP. Same contract as the TCP
// path (core/communicator.h): posting never blocks, Works may be waited in any order, a dropped
// Work still completes, and messages between a pair of ranks with the same tag are received in
// the order they were sent.
//
// Set-up is lazy and needs no agreement beyond the host identity each rank publishes when the
// communicator is made (`<prefix>/shm_host/<rank>`): the first Recv from a peer makes the ring
// the peer writes into and publishes its name under `<prefix>/shm/<peer>-<this rank>`; the
// peer's Sends map it when they find the name (a Send posted earlier just waits, queued, as a
// TCP Send waits for its Recv).
//
// Framing: each message is a 16-byte frame (a check word, the tag, the byte count) and the
// bytes. A Send is copied into the ring when posted; what does not fit is written by a thread
// as room appears. The receiving side reads frames as they come, on the thread that waits for
// one of them: a message whose Recv is posted goes straight into that tensor; one that comes
// first is kept aside (a copy) until its Recv is posted. When a writer finds the ring full, it
// rings a doorbell that a thread of the reader's answers by reading on, so messages keep moving
// whatever each side waits for (as with TCP, whose transport threads do this all the time). In
// the common case, messages smaller than the ring's free room, neither thread ever runs.
//
// A wait ends at the communicator's timeout, when the peer's process has exited (checked every
// 100 ms), or when another operation broke the communicator.
#ifndef BRAID_BACKENDS_GLOO_SHM_LINK_H_
#define BRAID_BACKENDS_GLOO_SHM_LINK_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/gloo/core_state.h"
#include "backends/gloo/shm_ring.h"
#include "backends/gloo/work.h"
#include "core/store.h"
#include "core/tensor.h"

namespace braid::gloo_backend::internal {

class ShmOp;

class ShmLink : public std::enable_shared_from_this<ShmLink> {
 public:
  // `peer` is a rank of core's group on this host, whose process is `peer_pid`.
  ShmLink(std::shared_ptr<Core> core, int peer, pid_t peer_pid, size_t ring_bytes,
          absl::Duration spin);
  ~ShmLink();  // Shutdown()

  // Posts a Send (`send`) or Recv of `t`; the returned operation keeps `t` until it is done.
  // Fails (the operation is returned already failed) only if the ring cannot be made. A Send
  // that does not fit in the ring is finished by a thread of its own.
  std::shared_ptr<Flight> Post(bool send, const Tensor& t, int tag, std::string what,
                               uint64_t journal_id, absl::Duration timeout);

  // The communicator is gone: close both rings (the peer's waits on them end at once) and stop
  // this link's threads. Every operation must be done. Idempotent.
  void Shutdown();

  // When the communicator is made: this rank's host identity (ShmHostIdentity and the pid), or
  // nothing if `shm` is off or the host has no /dev/shm, which keeps every pair with it on TCP.
  static absl::Status Publish(braid::Store* store, const GroupInfo& g, bool shm);
  // At the first Send or Recv with `peer`: a link if both published the same identity, else
  // nullptr (TCP).
  static absl::StatusOr<std::shared_ptr<ShmLink>> ForPeer(std::shared_ptr<Core> core, int peer,
                                                          absl::Duration timeout);

  // The key a ring's name travels under.
  static std::string RingKey(const GroupInfo& g, int src, int dst);

 private:
  friend class ShmOp;

  struct Frame {
    uint32_t check;
    int32_t tag;
    uint64_t bytes;
  };
  static_assert(sizeof(Frame) == 16);

  // A message that came before its Recv was posted.
  struct Early {
    int tag;
    std::vector<unsigned char> data;
    bool complete = false;
  };

  // The message being read from the ring. Between messages `active` is false and the next
  // frame's bytes gather in `frame_bytes` (a writer may have put only part of it in so far).
  struct Incoming {
    bool active = false;
    unsigned char frame_bytes[sizeof(Frame)] = {};
    size_t frame_got = 0;
    Frame frame{};
    uint64_t got = 0;
    std::shared_ptr<ShmOp> op;  // its Recv, or
    Early* early = nullptr;     // kept aside, or neither: skipped (a size mismatch)
  };

  // Move what can move now; never block. Call holding the direction's mutex.
  void ProgressSend() ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  void ProgressRecv() ABSL_EXCLUSIVE_LOCKS_REQUIRED(recv_mu_);
  // Makes the inbound ring and publishes its name (once; not holding recv_mu_, since the store
  // may take a while).
  absl::Status MakeIn(const std::string& what);
  // The thread that maps the peer's ring once its name is in the store.
  void OpenOut();
  // A Send ended part-way through its message: nothing more may go into the ring, or the
  // reader would take the next frame for the rest of this message. Closes the ring (the peer's
  // Recv fails at once) and fails every queued Send with `st`.
  void AbandonOut(const absl::Status& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  // Gives `op` the message `frame` (its size must match).
  void Match(const std::shared_ptr<ShmOp>& op, const Frame& frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(recv_mu_);
  // A frame that is not one: the stream is lost, and so is the communicator.
  void Corrupt(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(recv_mu_);

  bool PeerAlive() const;

  // The thread that makes room in the inbound ring when the peer finds it full (see
  // ShmRing::WaitDoorbell): it reads into the posted Recvs, or sets messages aside.
  void AnswerDoorbell(ShmRing* in);

  const std::shared_ptr<Core> core_;
  const int peer_;
  const pid_t peer_pid_;
  const size_t ring_bytes_;
  const absl::Duration spin_;  // a Recv's poll before it sleeps (ShmRing::WaitReadable)

  absl::Mutex send_mu_;
  std::unique_ptr<ShmRing> out_ ABSL_GUARDED_BY(send_mu_);
  std::deque<std::shared_ptr<ShmOp>> sending_ ABSL_GUARDED_BY(send_mu_);  // front: in the ring
  std::string out_lost_ ABSL_GUARDED_BY(send_mu_);  // why nothing more may be written
  std::thread opener_ ABSL_GUARDED_BY(send_mu_);    // started by the first Send

  absl::Mutex make_in_mu_;  // one MakeIn at a time
  absl::Mutex recv_mu_;
  std::unique_ptr<ShmRing> in_ ABSL_GUARDED_BY(recv_mu_);
  std::deque<std::shared_ptr<ShmOp>> posted_ ABSL_GUARDED_BY(recv_mu_);  // Recvs not matched
  std::list<Early> early_ ABSL_GUARDED_BY(recv_mu_);
  Incoming incoming_ ABSL_GUARDED_BY(recv_mu_);
  bool corrupt_ ABSL_GUARDED_BY(recv_mu_) = false;
  std::thread doorbell_;  // started with in_

  std::atomic<bool> stop_{false};
};

// One posted Send or Recv over a ShmLink. Its state is guarded by its direction's mutex, except
// `finished_`, which a waiter's sleep watches (ShmRing::WaitReadable).
class ShmOp final : public Flight, public std::enable_shared_from_this<ShmOp> {
 public:
  ShmOp(std::shared_ptr<ShmLink> link, bool send, const Tensor& t, int tag, std::string what,
        uint64_t journal_id, absl::Duration timeout);

  absl::Status Wait(absl::Duration budget) override;
  bool IsCompleted() override;
  void Release() override;
  void Drain() override { (void)Wait(timeout_ + absl::Seconds(5)); }

 private:
  friend class ShmLink;

  absl::Mutex& mu() const;
  // Ends the operation (holding mu()): records the status, lets go of the tensor and wakes
  // whoever sleeps waiting for it.
  void Finish(absl::Status st);
  // Fails it and the communicator (not holding mu()).
  absl::Status Fail(const std::string& error, absl::Duration elapsed);
  // Ends it with `st` unless it is done, taking it off the link's queues (not holding mu()).
  absl::Status End(absl::Status st);
  // Progress under the lock; true once done (then *st is its status).
  bool Poll(absl::Status* st);
  // Sleeps up to `slice` for something that may let it progress.
  void Sleep(absl::Duration slice, absl::Duration spin);
  void WaitInBackground();

  const std::shared_ptr<ShmLink> link_;
  const bool send_;
  Tensor keep_;  // until done
  unsigned char* data_;
  const uint64_t bytes_;
  const int tag_;
  const std::string what_;
  const uint64_t journal_id_;
  const absl::Duration timeout_;
  uint64_t moved_ = 0;  // Send: frame and data bytes written so far
  bool done_ = false;
  std::atomic<bool> finished_{false};  // done_, for sleepers that do not hold the lock
  absl::Status status_;
  bool background_ = false;  // a thread is waiting for it (polled or dropped)
};

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_SHM_LINK_H_
