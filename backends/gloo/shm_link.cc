// ShmLink and ShmOp: posting, the send queue, matching received frames to posted Recvs, and the
// bounded waits (timeout, a peer that exits, a communicator broken meanwhile).
#include "backends/gloo/shm_link.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace braid::gloo_backend::internal {

namespace {

constexpr uint32_t kFrameCheck = 0xb7a1d5e3u;
// How long a wait sleeps before it looks at the clock, the peer's process and the
// communicator's health again.
constexpr absl::Duration kSlice = absl::Milliseconds(100);

}  // namespace

// ---- ShmLink -----------------------------------------------------------------------------------

ShmLink::ShmLink(std::shared_ptr<Core> core, int peer, pid_t peer_pid, size_t ring_bytes,
                 absl::Duration spin)
    : core_(std::move(core)),
      peer_(peer),
      peer_pid_(peer_pid),
      ring_bytes_(ring_bytes),
      spin_(spin) {}

std::string ShmLink::RingKey(const GroupInfo& g, int src, int dst) {
  return absl::StrCat(g.prefix, "/shm/", src, "-", dst);
}

namespace {

std::string HostKey(const GroupInfo& g, int rank) {
  return absl::StrCat(g.prefix, "/shm_host/", rank);
}

}  // namespace

absl::Status ShmLink::Publish(braid::Store* store, const GroupInfo& g, bool shm) {
  const std::string identity = shm ? ShmHostIdentity() : "";
  return store->Set(HostKey(g, g.rank),
                    identity.empty() ? std::string() : absl::StrCat(identity, "|", getpid()));
}

absl::StatusOr<std::shared_ptr<ShmLink>> ShmLink::ForPeer(std::shared_ptr<Core> core, int peer,
                                                          absl::Duration timeout) {
  const GroupInfo& g = core->group;
  absl::StatusOr<std::string> mine = core->store->Get(HostKey(g, g.rank), timeout);
  absl::StatusOr<std::string> theirs = core->store->Get(HostKey(g, peer), timeout);
  if (!mine.ok() || !theirs.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "gloo communicator ", g.Rank(g.rank), " of ", g.Describe(),
        ": cannot read the host identities from the store: ",
        (mine.ok() ? theirs : mine).status().message()));
  }
  // "<identity>|<pid>"; an empty value never matches.
  const size_t bar = theirs->rfind('|');
  int64_t pid = 0;
  if (mine->empty() || bar == std::string::npos ||
      mine->substr(0, mine->rfind('|')) != theirs->substr(0, bar) ||
      !absl::SimpleAtoi(theirs->substr(bar + 1), &pid)) {
    return std::shared_ptr<ShmLink>();
  }
  const Settings& s = core->settings;
  const size_t ring_bytes = s.shm_ring_bytes;
  const absl::Duration spin =
      s.shm_spin_us >= 0 ? absl::Microseconds(s.shm_spin_us) : ShmSpinAuto();
  return std::make_shared<ShmLink>(std::move(core), peer, pid_t(pid), ring_bytes, spin);
}

ShmLink::~ShmLink() {
  {
    absl::MutexLock lock(&send_mu_);
    if (out_ != nullptr) out_->Close();
  }
  if (doorbell_.joinable()) {
    stop_.store(true);
    {
      absl::MutexLock lock(&recv_mu_);
      in_->RingDoorbell();
    }
    doorbell_.join();
  }
  absl::MutexLock lock(&recv_mu_);
  if (in_ != nullptr) in_->Close();
}

void ShmLink::AnswerDoorbell(ShmRing* in) {
  uint32_t seen = 0;
  for (;;) {
    const uint32_t now = in->WaitDoorbell(seen, absl::Seconds(10));
    if (stop_.load()) return;
    if (now == seen) continue;
    seen = now;
    absl::MutexLock lock(&recv_mu_);
    ProgressRecv();
  }
}

bool ShmLink::PeerAlive() const {
  if (kill(peer_pid_, 0) != 0 && errno == ESRCH) return false;
  // An exited process stays a zombie until its parent reaps it ("pid (name) Z ...").
  std::ifstream stat(absl::StrCat("/proc/", peer_pid_, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ||
         (line[paren + 2] != 'Z' && line[paren + 2] != 'X');
}

std::shared_ptr<Flight> ShmLink::Post(bool send, const Tensor& t, int tag, std::string what,
                                      uint64_t journal_id, absl::Duration timeout) {
  auto op = std::make_shared<ShmOp>(shared_from_this(), send, t, tag, std::move(what), journal_id,
                                    timeout);
  if (send) {
    bool done;
    {
      absl::MutexLock lock(&send_mu_);
      sending_.push_back(op);
      ProgressSend();
      done = op->done_;
    }
    // The rest must go in as the peer makes room, whatever this rank does meanwhile (a TCP
    // transport sends in the background too).
    if (!done) op->WaitInBackground();
    return op;
  }
  absl::MutexLock lock(&recv_mu_);
  if (in_ == nullptr) {
    std::string name;
    absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Create(ring_bytes_, &name);
    absl::Status st = ring.status();
    if (st.ok()) st = core_->store->Set(RingKey(core_->group, peer_, core_->group.rank), name);
    if (!st.ok()) {
      std::string why = absl::StrCat(
          "gloo ", op->what_, " in ", core_->group.Describe(), " on ",
          core_->group.Rank(core_->group.rank), ": cannot set up shared memory with ",
          core_->group.Rank(peer_), ": ", st.message());
      core_->Break(why);
      op->Finish(absl::Status(st.code(), why));
      return op;
    }
    in_ = std::move(*ring);
    doorbell_ = std::thread([this, in = in_.get()] { AnswerDoorbell(in); });
  }
  // The oldest message kept aside with this tag is this Recv's.
  auto early =
      std::find_if(early_.begin(), early_.end(), [&](const Early& e) { return e.tag == tag; });
  if (early == early_.end()) {
    posted_.push_back(op);
  } else if (early->data.size() != op->bytes_) {
    op->Finish(absl::InvalidArgumentError(
        absl::StrCat(op->what_, ": the message from ", core_->group.Rank(peer_), " with tag ", tag,
                     " has ", early->data.size(), " bytes, this Recv's tensor ", op->bytes_)));
    if (early->complete) {
      early_.erase(early);
    } else {  // it is being read: drop the rest of it
      incoming_.early = nullptr;
      early_.erase(early);
    }
  } else {
    std::memcpy(op->data_, early->data.data(), early->complete ? op->bytes_ : incoming_.got);
    if (early->complete) {
      op->Finish(absl::OkStatus());
    } else {  // it is being read: the rest goes straight into the tensor
      incoming_.early = nullptr;
      incoming_.op = op;
    }
    early_.erase(early);
  }
  ProgressRecv();
  return op;
}

bool ShmLink::OpenOut(absl::Duration wait) {
  if (out_ != nullptr) return true;
  absl::StatusOr<std::string> name = core_->store->Get(RingKey(core_->group, core_->group.rank,
                                                                peer_), wait);
  if (!name.ok()) return false;
  absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Open(*name);
  if (!ring.ok()) {
    std::string why = absl::StrCat("cannot map the shared memory ",
                                   core_->group.Rank(peer_), " made for this rank: ",
                                   ring.status().message());
    core_->Break(why);
    for (auto& op : sending_) {
      op->Finish(absl::UnavailableError(absl::StrCat(op->what_, ": ", why)));
    }
    sending_.clear();
    return false;
  }
  out_ = std::move(*ring);
  return true;
}

void ShmLink::ProgressSend() {
  if (sending_.empty() || !OpenOut(absl::ZeroDuration())) return;
  while (!sending_.empty()) {
    ShmOp& op = *sending_.front();
    if (op.moved_ < sizeof(Frame)) {
      Frame f{kFrameCheck, op.tag_, op.bytes_};
      op.moved_ += out_->Write(reinterpret_cast<const unsigned char*>(&f) + op.moved_,
                               sizeof(Frame) - op.moved_);
      if (op.moved_ < sizeof(Frame)) return;
    }
    const uint64_t sent = op.moved_ - sizeof(Frame);
    op.moved_ += out_->Write(op.data_ + sent, op.bytes_ - sent);
    if (op.moved_ < sizeof(Frame) + op.bytes_) return;
    op.Finish(absl::OkStatus());
    sending_.pop_front();
  }
}

void ShmLink::Corrupt(const std::string& why) {
  std::string msg = absl::StrCat("the shared-memory stream from ", core_->group.Rank(peer_),
                                 " is corrupt (", why, ")");
  core_->Break(msg);
  if (incoming_.op) incoming_.op->Finish(absl::InternalError(msg));
  for (auto& op : posted_) op->Finish(absl::InternalError(absl::StrCat(op->what_, ": ", msg)));
  posted_.clear();
  incoming_ = Incoming();
}

void ShmLink::Match(const std::shared_ptr<ShmOp>& op, const Frame& frame) {
  if (op->bytes_ == frame.bytes) {
    incoming_.op = op;
    return;
  }
  // Skip the message (the stream stays in step); only this Recv fails.
  op->Finish(absl::InvalidArgumentError(absl::StrCat(
      op->what_, ": the message from ", core_->group.Rank(peer_), " with tag ", frame.tag, " has ",
      frame.bytes, " bytes, this Recv's tensor ", op->bytes_)));
}

void ShmLink::ProgressRecv() {
  if (in_ == nullptr) return;
  for (;;) {
    if (!incoming_.active) {
      if (in_->Readable() < sizeof(Frame)) return;
      Frame f;
      in_->Read(&f, sizeof(f));
      if (f.check != kFrameCheck) return Corrupt("a frame without its check word");
      incoming_ = Incoming();
      incoming_.active = true;
      incoming_.frame = f;
      auto posted = std::find_if(posted_.begin(), posted_.end(),
                                 [&](const auto& op) { return op->tag_ == f.tag; });
      if (posted != posted_.end()) {
        std::shared_ptr<ShmOp> op = *posted;
        posted_.erase(posted);
        Match(op, f);
      } else {
        early_.push_back(Early{f.tag, std::vector<unsigned char>(f.bytes), false});
        incoming_.early = &early_.back();
      }
    }
    const uint64_t want = incoming_.frame.bytes - incoming_.got;
    if (want > 0) {
      unsigned char* to = incoming_.op    ? incoming_.op->data_ + incoming_.got
                          : incoming_.early ? incoming_.early->data.data() + incoming_.got
                                            : nullptr;
      size_t n = in_->Read(to, want);
      incoming_.got += n;
      if (n < want) return;
    }
    if (incoming_.op) incoming_.op->Finish(absl::OkStatus());
    if (incoming_.early) incoming_.early->complete = true;
    incoming_ = Incoming();
  }
}

// ---- ShmOp -------------------------------------------------------------------------------------

ShmOp::ShmOp(std::shared_ptr<ShmLink> link, bool send, const Tensor& t, int tag, std::string what,
             uint64_t journal_id, absl::Duration timeout)
    : link_(std::move(link)),
      send_(send),
      keep_(t),
      data_(static_cast<unsigned char*>(t.raw_data())),
      bytes_(t.nbytes()),
      tag_(tag),
      what_(std::move(what)),
      journal_id_(journal_id),
      timeout_(timeout) {}

absl::Mutex& ShmOp::mu() const { return send_ ? link_->send_mu_ : link_->recv_mu_; }

void ShmOp::Finish(absl::Status st) {
  if (done_) return;
  link_->core_->journal.Finish(journal_id_, st.ok());
  status_ = std::move(st);
  done_ = true;
  keep_ = Tensor();
  data_ = nullptr;
}

bool ShmOp::Poll(absl::Status* st) {
  absl::MutexLock lock(&mu());
  if (!done_) {
    if (send_) {
      link_->ProgressSend();
    } else {
      link_->ProgressRecv();
    }
  }
  if (done_) *st = status_;
  return done_;
}

absl::Status ShmOp::Fail(const std::string& error, absl::Duration elapsed) {
  return End(link_->core_->P2pFailed(what_, link_->peer_, absl::StrCat("Shared memory: ", error),
                                     elapsed, timeout_));
}

absl::Status ShmOp::End(absl::Status st) {
  absl::MutexLock lock(&mu());
  if (done_) return status_;
  // Out of the link's queues: nothing will write into or read from its tensor any more.
  auto& queue = send_ ? link_->sending_ : link_->posted_;
  queue.erase(std::remove_if(queue.begin(), queue.end(),
                             [&](const auto& o) { return o.get() == this; }),
              queue.end());
  if (!send_ && link_->incoming_.op.get() == this) link_->incoming_.op = nullptr;  // skip the rest
  Finish(st);
  return st;
}

absl::Status ShmOp::Wait(absl::Duration budget) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + std::min(budget, timeout_);
  absl::Time check_peer = start + kSlice;  // a process check costs a few syscalls: not each time
  absl::Duration spin = link_->spin_;     // the first sleep only
  absl::Status st;
  for (;;) {
    if (Poll(&st)) return st;
    // Another operation failed meanwhile: the stream may be cut mid-message.
    if (!link_->core_->Broken().empty()) return End(link_->core_->BrokenError(what_));
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return Fail("Timed out waiting for the peer's message or room", now - start);
    }
    ShmRing* ring;  // lives as long as the link
    {
      absl::MutexLock lock(&mu());
      ring = send_ ? link_->out_.get() : link_->in_.get();
    }
    std::string gone;
    if (ring != nullptr && ring->PeerClosed()) {
      gone = "it closed its end (it destroyed its communicator)";
    } else if (now >= check_peer) {
      check_peer = now + kSlice;
      if (!link_->PeerAlive()) {
        gone = absl::StrCat("its process (pid ", link_->peer_pid_, ") has exited");
      }
    }
    if (!gone.empty()) {
      if (Poll(&st)) return st;  // what it wrote before it went
      return Fail(gone, now - start);
    }
    const absl::Duration slice = std::min(kSlice, deadline - now);
    if (!send_) {
      ring->WaitReadable(slice, spin);
      spin = absl::ZeroDuration();
    } else if (ring != nullptr) {
      ring->WaitWritable(slice);
    } else {
      // The peer has not posted a Recv from this rank yet: wait for its ring's name.
      absl::StatusOr<std::string> name = link_->core_->store->Get(
          ShmLink::RingKey(link_->core_->group, link_->core_->group.rank, link_->peer_), slice);
      (void)name;  // Poll maps it
    }
  }
}

bool ShmOp::IsCompleted() {
  absl::Status st;
  if (Poll(&st)) return true;
  WaitInBackground();  // so that a timeout or a dead peer still ends it
  return false;
}

void ShmOp::Release() {
  absl::Status st;
  if (!Poll(&st)) WaitInBackground();
}

void ShmOp::WaitInBackground() {
  {
    absl::MutexLock lock(&mu());
    if (done_ || background_) return;
    background_ = true;
  }
  link_->core_->p2p_threads.Start([self = shared_from_this()] {
    (void)self->Wait(self->timeout_);
  });
}

}  // namespace braid::gloo_backend::internal
