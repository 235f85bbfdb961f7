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

ShmLink::~ShmLink() { Shutdown(); }

void ShmLink::Shutdown() {
  if (stop_.exchange(true)) return;
  std::thread opener;
  {
    absl::MutexLock lock(&send_mu_);
    if (out_ != nullptr) out_->Close();
    opener = std::move(opener_);
  }
  {
    absl::MutexLock lock(&recv_mu_);
    if (in_ != nullptr) {
      in_->Close();
      in_->RingDoorbell();  // wakes the doorbell thread, which sees stop_
    }
  }
  if (doorbell_.joinable()) doorbell_.join();
  if (opener.joinable()) opener.join();  // within one store wait (100 ms)
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
      if (!out_lost_.empty()) {
        op->Finish(absl::UnavailableError(absl::StrCat(op->what_, ": ", out_lost_)));
        return op;
      }
      if (out_ == nullptr && !opener_.joinable()) opener_ = std::thread([this] { OpenOut(); });
      sending_.push_back(op);
      ProgressSend();
      done = op->done_;
    }
    // The rest must go in as the peer makes room, whatever this rank does meanwhile (a TCP
    // transport sends in the background too).
    if (!done) op->WaitInBackground();
    return op;
  }
  if (absl::Status st = MakeIn(op->what_); !st.ok()) {
    absl::MutexLock lock(&recv_mu_);
    op->Finish(st);
    return op;
  }
  absl::MutexLock lock(&recv_mu_);
  // The oldest message kept aside with this tag is this Recv's.
  auto early =
      std::find_if(early_.begin(), early_.end(), [&](const Early& e) { return e.tag == tag; });
  if (early == early_.end()) {
    posted_.push_back(op);
    ProgressRecv();
    return op;
  }
  const bool being_read = incoming_.active && incoming_.early == &*early;
  if (early->data.size() != op->bytes_) {
    op->Finish(absl::InvalidArgumentError(
        absl::StrCat(op->what_, ": the message from ", core_->group.Rank(peer_), " with tag ", tag,
                     " has ", early->data.size(), " bytes, this Recv's tensor ", op->bytes_)));
    if (being_read) incoming_.early = nullptr;  // skip the rest of it
  } else if (being_read) {  // the rest goes straight into the tensor
    std::memcpy(op->data_, early->data.data(), incoming_.got);
    incoming_.early = nullptr;
    incoming_.op = op;
  } else {
    std::memcpy(op->data_, early->data.data(), op->bytes_);
    op->Finish(absl::OkStatus());
  }
  early_.erase(early);
  ProgressRecv();
  return op;
}

absl::Status ShmLink::MakeIn(const std::string& what) {
  absl::MutexLock make(&make_in_mu_);
  {
    absl::MutexLock lock(&recv_mu_);
    if (in_ != nullptr) return absl::OkStatus();
  }
  std::string name;
  absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Create(ring_bytes_, &name);
  absl::Status st = ring.status();
  if (st.ok()) st = core_->store->Set(RingKey(core_->group, peer_, core_->group.rank), name);
  if (!st.ok()) {
    std::string why = absl::StrCat("gloo ", what, " in ", core_->group.Describe(), " on ",
                                   core_->group.Rank(core_->group.rank),
                                   ": cannot set up shared memory with ", core_->group.Rank(peer_),
                                   ": ", st.message());
    core_->Break(why);
    return absl::Status(st.code(), why);
  }
  absl::MutexLock lock(&recv_mu_);
  in_ = std::move(*ring);
  doorbell_ = std::thread([this, in = in_.get()] { AnswerDoorbell(in); });
  return absl::OkStatus();
}

void ShmLink::OpenOut() {
  const std::string key = RingKey(core_->group, core_->group.rank, peer_);
  while (!stop_.load()) {
    // In slices: the store's client may serialize its requests.
    absl::StatusOr<std::string> name = core_->store->Get(key, absl::Milliseconds(100));
    if (!name.ok()) continue;  // not there yet (the Sends' own waits bound how long)
    absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Open(*name);
    absl::MutexLock lock(&send_mu_);
    if (!ring.ok()) {
      std::string why = absl::StrCat("cannot map the shared memory ", core_->group.Rank(peer_),
                                     " made for this rank: ", ring.status().message());
      core_->Break(why);
      out_lost_ = why;
      for (auto& op : sending_) {
        op->Finish(absl::UnavailableError(absl::StrCat(op->what_, ": ", why)));
      }
      sending_.clear();
      return;
    }
    out_ = std::move(*ring);
    ProgressSend();
    return;
  }
}

void ShmLink::AbandonOut(const absl::Status& st) {
  out_lost_ = absl::StrCat("an earlier Send to ", core_->group.Rank(peer_),
                           " ended part-way through its message (", st.message(), ")");
  if (out_ != nullptr) out_->Close();
  for (auto& op : sending_) {
    op->Finish(absl::UnavailableError(absl::StrCat(op->what_, ": ", out_lost_)));
  }
  sending_.clear();
}

void ShmLink::ProgressSend() {
  if (out_ == nullptr || !out_lost_.empty()) return;
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
  early_.clear();
  incoming_ = Incoming();
  corrupt_ = true;  // nothing more is read
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
  if (in_ == nullptr || corrupt_) return;
  for (;;) {
    if (!incoming_.active) {
      incoming_.frame_got += in_->Read(incoming_.frame_bytes + incoming_.frame_got,
                                       sizeof(Frame) - incoming_.frame_got);
      if (incoming_.frame_got < sizeof(Frame)) return;
      Frame f;
      std::memcpy(&f, incoming_.frame_bytes, sizeof(f));
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
  // Its waiter may be asleep on the ring while another thread (the doorbell's, a background
  // wait's) finished it.
  finished_.store(true);
  ShmRing* ring = send_ ? link_->out_.get() : link_->in_.get();
  if (ring == nullptr) return;
  if (send_) {
    ring->WakeWriters();
  } else {
    ring->WakeReaders();
  }
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
  if (send_) {
    if (moved_ > 0) {
      link_->AbandonOut(st);  // finishes this one too
      return status_;
    }
    auto& q = link_->sending_;
    q.erase(std::remove_if(q.begin(), q.end(), [&](const auto& o) { return o.get() == this; }),
            q.end());
  } else {
    // Out of the queue: nothing will write into its tensor any more.
    auto& q = link_->posted_;
    q.erase(std::remove_if(q.begin(), q.end(), [&](const auto& o) { return o.get() == this; }),
            q.end());
    if (link_->incoming_.op.get() == this) link_->incoming_.op = nullptr;  // skip the rest
  }
  Finish(st);
  return st;
}

void ShmOp::Sleep(absl::Duration slice, absl::Duration spin) {
  ShmRing* ring;  // lives as long as the link
  {
    absl::MutexLock lock(&mu());
    if (done_) return;
    ring = send_ ? link_->out_.get() : link_->in_.get();
    if (ring == nullptr) {
      // A Send before the peer's ring is known: the opener thread maps it (or fails the Send).
      auto mapped = [](ShmOp* op) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return op->done_ || op->link_->out_ != nullptr;
      };
      mu().AwaitWithTimeout(absl::Condition(+mapped, this), slice);
      return;
    }
  }
  if (send_) {
    ring->WaitWritable(slice, &finished_);
  } else {
    ring->WaitReadable(slice, spin, &finished_);
  }
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
    std::string gone;
    if (now >= deadline) {
      gone = "Timed out waiting for the peer's message or room";
    } else {
      ShmRing* ring;
      {
        absl::MutexLock lock(&mu());
        ring = send_ ? link_->out_.get() : link_->in_.get();
      }
      if (ring != nullptr && ring->PeerClosed()) {
        gone = "it closed its end (its communicator was destroyed, or broke mid-message)";
      } else if (now >= check_peer) {
        check_peer = now + kSlice;
        if (!link_->PeerAlive()) {
          gone = absl::StrCat("its process (pid ", link_->peer_pid_, ") has exited");
        }
      }
    }
    if (!gone.empty()) {
      if (Poll(&st)) return st;  // done meanwhile, or what the peer wrote before it went
      return Fail(gone, now - start);
    }
    Sleep(std::min(kSlice, deadline - now), spin);
    spin = absl::ZeroDuration();
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
