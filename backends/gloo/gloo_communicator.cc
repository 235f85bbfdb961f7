#include "backends/gloo/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/gloo/reduce_kernels.h"
#include "backends/gloo/store_adapter.h"
#include "core/store.h"

namespace braid::gloo_backend {
namespace {

using ::gloo::transport::UnboundBuffer;

// Slot prefixes of our own transfers. Gloo's collectives use 0x01..0x08 (gloo/types.h); the
// prefix keeps our reduce-scatter and point-to-point messages apart from theirs on shared pairs.
constexpr uint8_t kReduceScatterSlotPrefix = 0x21;
constexpr uint8_t kP2pSlotPrefix = 0x22;
constexpr uint8_t kDirectAllreduceSlotPrefix = 0x23;

constexpr size_t kLogLength = 16;

// ---- Settings -------------------------------------------------------------------------------

enum class AllreduceAlgorithm { kAuto, kRing, kBcube, kDirect };

struct Settings {
  std::string hostname = "127.0.0.1";
  std::string iface;
  std::string group_name = "world";
  std::string store_prefix = "gloo";
  absl::Duration heartbeat = absl::Seconds(1);
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::kAuto;
  // Direct exchange (one message to every peer) while (size - 1) * bytes stays under this.
  size_t direct_max_bytes = 256 << 10;
  // Then Gloo's bcube (recursive halving/doubling: few, large messages) up to this size, and
  // its ring (many segments, which pipelines the reduction with the transfer) above it.
  size_t bcube_max_bytes = 4 << 20;
  size_t segment_bytes = 4 << 20;
};

absl::Status ParseSize(const std::string& key, const std::string& value, int64_t min,
                       int64_t* out) {
  if (!absl::SimpleAtoi(value, out) || *out < min) {
    return absl::InvalidArgumentError(absl::StrCat("gloo communicator option ", key, "='", value,
                                                   "' must be an integer >= ", min));
  }
  return absl::OkStatus();
}

absl::StatusOr<Settings> ParseSettings(const std::map<std::string, std::string>& options) {
  Settings s;
  bool hostname_given = false;
  for (const auto& [key, value] : options) {
    int64_t n = 0;
    if (key == "hostname") {
      s.hostname = value;
      hostname_given = true;
    } else if (key == "iface") {
      s.iface = value;
    } else if (key == "group_name") {
      s.group_name = value;
    } else if (key == "store_prefix") {
      s.store_prefix = value;
    } else if (key == "heartbeat_ms") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 10, &n));
      s.heartbeat = absl::Milliseconds(n);
    } else if (key == "allreduce_algorithm") {
      if (value == "auto") {
        s.allreduce = AllreduceAlgorithm::kAuto;
      } else if (value == "ring") {
        s.allreduce = AllreduceAlgorithm::kRing;
      } else if (value == "bcube") {
        s.allreduce = AllreduceAlgorithm::kBcube;
      } else if (value == "direct") {
        s.allreduce = AllreduceAlgorithm::kDirect;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("gloo communicator option allreduce_algorithm='", value,
                         "': use auto, ring, bcube or direct"));
      }
    } else if (key == "bcube_max_bytes") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 0, &n));
      s.bcube_max_bytes = size_t(n);
    } else if (key == "direct_max_bytes") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 0, &n));
      s.direct_max_bytes = size_t(n);
    } else if (key == "segment_bytes") {
      BRAID_RETURN_IF_ERROR(ParseSize(key, value, 64, &n));
      s.segment_bytes = size_t(n);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown gloo communicator option '", key,
                       "' (known: hostname, iface, group_name, store_prefix, heartbeat_ms, "
                       "allreduce_algorithm, direct_max_bytes, bcube_max_bytes, segment_bytes)"));
    }
  }
  if (hostname_given && !s.iface.empty()) {
    return absl::InvalidArgumentError(
        "gloo communicator options: give either hostname or iface, not both");
  }
  return s;
}

std::chrono::milliseconds Ms(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// ---- Group identity -------------------------------------------------------------------------

struct GroupInfo {
  std::string name;    // "world", "world/g3"
  std::string prefix;  // store namespace: "gloo", "gloo/g3"
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks;  // member r's rank in the root communicator

  bool IsWorld() const {
    for (int r = 0; r < size; ++r) {
      if (world_ranks[r] != r) return false;
    }
    return true;
  }
  std::string Describe() const {
    if (IsWorld()) return absl::StrCat("group '", name, "' (", size, " ranks)");
    return absl::StrCat("group '", name, "' (", size, " ranks: world ranks ",
                        absl::StrJoin(world_ranks, ","), ")");
  }
  std::string Rank(int r) const {
    if (IsWorld()) return absl::StrCat("rank ", r);
    return absl::StrCat("rank ", r, " (world rank ", world_ranks[r], ")");
  }
};

// ---- Journal: this rank's recent operations, for error messages ------------------------------

class Journal {
 public:
  uint64_t Add(std::string what) {
    absl::MutexLock lock(&mu_);
    uint64_t id = next_id_++;
    entries_.push_back(Entry{id, std::move(what), State::kQueued, absl::Now(), absl::Time()});
    if (entries_.size() > kLogLength) entries_.pop_front();
    return id;
  }
  void Start(uint64_t id) {
    absl::MutexLock lock(&mu_);
    if (Entry* e = Find(id)) {
      e->state = State::kRunning;
      e->started = absl::Now();
    }
  }
  void Finish(uint64_t id, bool ok) {
    absl::MutexLock lock(&mu_);
    if (Entry* e = Find(id)) {
      e->state = ok ? State::kOk : State::kFailed;
      e->took = absl::Now() - e->started;
    }
  }
  // "#0 AllReduce(sum, f32, 4 elements) 16 B: ok in 1.2ms; #1 ...", oldest first.
  std::string Recent() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> parts;
    absl::Time now = absl::Now();
    for (const Entry& e : entries_) {
      switch (e.state) {
        case State::kQueued:
          parts.push_back(absl::StrCat(e.what, ": queued ", Round(now - e.issued), " ago"));
          break;
        case State::kRunning:
          parts.push_back(absl::StrCat(e.what, ": running for ", Round(now - e.started)));
          break;
        case State::kOk:
          parts.push_back(absl::StrCat(e.what, ": ok in ", Round(e.took)));
          break;
        case State::kFailed:
          parts.push_back(absl::StrCat(e.what, ": FAILED after ", Round(e.took)));
          break;
      }
    }
    return parts.empty() ? std::string("(none)") : absl::StrJoin(parts, "; ");
  }
  static std::string Round(absl::Duration d) {
    if (d < absl::Microseconds(100)) return "<100us";
    return absl::FormatDuration(absl::Trunc(d, absl::Microseconds(100)));
  }

 private:
  enum class State { kQueued, kRunning, kOk, kFailed };
  struct Entry {
    uint64_t id;
    std::string what;
    State state;
    absl::Time issued, started;
    absl::Duration took;
  };
  Entry* Find(uint64_t id) {
    for (Entry& e : entries_) {
      if (e.id == id) return &e;
    }
    return nullptr;
  }

  mutable absl::Mutex mu_;
  uint64_t next_id_ = 0;
  std::deque<Entry> entries_;
};

// ---- Progress records: what each rank publishes on its heartbeat -----------------------------

struct Progress {
  int64_t started = -1;   // the last collective this rank started (-1: none)
  int64_t finished = -1;  // the last one it finished
  bool failed = false;    // its communicator is broken
  int64_t unix_ms = 0;    // when it was published
  std::string what;       // the last started collective, or a note
  std::string why;        // why its communicator failed, or that it was destroyed
};

std::string EncodeProgress(const Progress& p) {
  return absl::StrCat(p.started, " ", p.finished, " ", p.failed ? 1 : 0, " ", p.unix_ms, " ",
                      p.what, "\t", p.why);
}

bool DecodeProgress(const std::string& s, Progress* p) {
  std::vector<std::string> f = absl::StrSplit(s, absl::MaxSplits(' ', 4));
  int failed = 0;
  if (f.size() != 5 || !absl::SimpleAtoi(f[0], &p->started) ||
      !absl::SimpleAtoi(f[1], &p->finished) || !absl::SimpleAtoi(f[2], &failed) ||
      !absl::SimpleAtoi(f[3], &p->unix_ms)) {
    return false;
  }
  p->failed = failed != 0;
  std::vector<std::string> notes = absl::StrSplit(f[4], absl::MaxSplits('\t', 1));
  p->what = notes[0];
  p->why = notes.size() > 1 ? notes[1] : "";
  return true;
}

// ---- Threads started on demand -----------------------------------------------------------------

// Each ends on its own (a finished one is joined at the next Start) or is joined by JoinAll.
class ThreadSet {
 public:
  void Start(std::function<void()> fn) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread t([fn = std::move(fn), done] {
      fn();
      done->store(true);
    });
    absl::MutexLock lock(&mu_);
    if (closed_) {  // nothing will join it; it ends by its operation's timeout at the latest
      t.detach();
      return;
    }
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (it->second->load()) {
        it->first.join();
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
    threads_.emplace_back(std::move(t), std::move(done));
  }

  void JoinAll() {
    absl::MutexLock lock(&mu_);
    for (auto& [t, done] : threads_) t.join();
    threads_.clear();
    closed_ = true;
  }

 private:
  absl::Mutex mu_;
  bool closed_ = false;  // GUARDED_BY(mu_)
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> threads_;  // GUARDED_BY(mu_)
};

// ---- Core: the state the worker threads and Work handles share ------------------------------

struct Core {
  GroupInfo group;
  Settings settings;
  braid::Store* store = nullptr;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::Context> context;
  Journal journal;
  ThreadSet p2p_threads;  // waits for Sends and Recvs polled or dropped unwaited (P2pOp)

  absl::Mutex mu;
  int64_t started = -1;      // GUARDED_BY(mu)
  int64_t finished = -1;     // GUARDED_BY(mu)
  std::string started_what;  // GUARDED_BY(mu)
  std::string broken;        // GUARDED_BY(mu): the first failure; empty while healthy
  std::string final_note;    // GUARDED_BY(mu): published once the communicator is destroyed

  std::mutex beat_mu;
  std::condition_variable beat_cv;
  bool beat_dirty = false;  // GUARDED_BY(beat_mu): progress changed since it was published
  bool beat_stop = false;   // GUARDED_BY(beat_mu)

  std::string ProgressKey(int r) const { return absl::StrCat(group.prefix, "/progress/", r); }

  void Started(int64_t seq, const std::string& what) {
    {
      absl::MutexLock lock(&mu);
      started = seq;
      started_what = what;
    }
    // Tell the heartbeat (once per batch of starts: it publishes at most every 100 ms).
    std::lock_guard<std::mutex> lock(beat_mu);
    if (!beat_dirty) {
      beat_dirty = true;
      beat_cv.notify_one();
    }
  }

  // The heartbeat thread: publishes progress every settings.heartbeat (liveness) and soon after
  // a collective starts (so a peer's diagnosis sees where this rank is), at most every 100 ms.
  void HeartbeatLoop() {
    const auto period = absl::ToChronoNanoseconds(settings.heartbeat);
    const auto min_gap = std::chrono::milliseconds(100);
    std::unique_lock<std::mutex> lock(beat_mu);
    auto last = std::chrono::steady_clock::now();
    while (!beat_stop) {
      auto now = std::chrono::steady_clock::now();
      if (now >= last + period || (beat_dirty && now >= last + min_gap)) {
        beat_dirty = false;
        lock.unlock();
        PublishProgress();
        lock.lock();
        last = std::chrono::steady_clock::now();
        continue;
      }
      beat_cv.wait_until(lock, beat_dirty ? last + min_gap : last + period);
    }
  }
  void StopHeartbeat() {
    std::lock_guard<std::mutex> lock(beat_mu);
    beat_stop = true;
    beat_cv.notify_one();
  }
  void Finished(int64_t seq) {
    absl::MutexLock lock(&mu);
    finished = seq;
  }
  std::string Broken() {
    absl::MutexLock lock(&mu);
    return broken;
  }
  void Break(const std::string& why) {
    absl::MutexLock lock(&mu);
    if (broken.empty()) broken = why;
  }

  void PublishProgress() {
    Progress p;
    {
      absl::MutexLock lock(&mu);
      p.started = started;
      p.finished = finished;
      p.failed = !broken.empty();
      p.why = final_note.empty() ? broken : final_note;
      p.what = started_what.empty() ? "(none)" : started_what;
    }
    p.unix_ms = absl::ToUnixMillis(absl::Now());
    // Best effort: a store error here surfaces as a stale record in some later diagnosis.
    store->Set(ProgressKey(group.rank), EncodeProgress(p)).IgnoreError();
  }

  static std::string Why(const Progress& p) {
    if (p.why.empty()) return "";
    return absl::StrCat(p.failed ? ", and has failed: " : ", ", p.why);
  }

  // Which ranks have not reached collective `seq` (called after it failed on this rank).
  std::string WhoDidNotArrive(int64_t seq, const std::string& what) {
    PublishProgress();
    // Peers that arrived publish within one heartbeat; those that failed too, at once.
    absl::SleepFor(std::min(settings.heartbeat + absl::Milliseconds(250), absl::Seconds(3)));
    std::vector<int> missing, arrived = {group.rank};
    std::vector<std::string> notes;
    int64_t now_ms = absl::ToUnixMillis(absl::Now());
    for (int q = 0; q < group.size; ++q) {
      if (q == group.rank) continue;
      absl::StatusOr<std::string> v = store->Get(ProgressKey(q), absl::Milliseconds(50));
      Progress p;
      if (!v.ok() || !DecodeProgress(*v, &p)) {
        missing.push_back(q);
        notes.push_back(absl::StrCat(group.Rank(q), " never published its progress"));
        continue;
      }
      double silent_s = double(now_ms - p.unix_ms) / 1000.0;
      std::string heard = absl::StrFormat("%.1fs ago%s", std::max(0.0, silent_s),
                                          silent_s > 3 * absl::ToDoubleSeconds(settings.heartbeat)
                                              ? ", silent since: exited, killed or hung?"
                                              : "");
      if (p.started < seq) {
        missing.push_back(q);
        notes.push_back(absl::StrCat(group.Rank(q), " last reported (", heard, ") ",
                                     p.started < 0 && p.what == "(none)"
                                         ? std::string("no collective started")
                                         : absl::StrCat("being at ", p.what),
                                     Why(p)));
      } else {
        arrived.push_back(q);
        if (p.started == seq && p.what != what) {
          notes.push_back(absl::StrCat(group.Rank(q), " is at ", p.what, " while this rank is at ",
                                       what, ": the ranks issued different collectives"));
        } else if (p.failed) {
          notes.push_back(absl::StrCat(group.Rank(q), " reached it and failed too (reported ",
                                       heard, "): ", p.why));
        }
      }
    }
    std::sort(arrived.begin(), arrived.end());
    std::string who;
    if (!missing.empty()) {
      std::vector<int> world;
      for (int q : missing) world.push_back(group.world_ranks[q]);
      who = absl::StrCat(
          "rank(s) ", absl::StrJoin(missing, ","), " did not arrive",
          group.IsWorld() ? "" : absl::StrCat(" (world rank(s) ", absl::StrJoin(world, ","), ")"),
          "; arrived: ", absl::StrJoin(arrived, ","));
    } else {
      who = "every rank arrived (the transport failed, or a peer failed first)";
    }
    if (!notes.empty()) absl::StrAppend(&who, " [", absl::StrJoin(notes, "; "), "]");
    return who;
  }

  // The status of a collective that threw `error` after `elapsed` (the transport is now closed).
  absl::Status CollectiveFailed(int64_t seq, const std::string& what, const std::string& error,
                                absl::Duration elapsed, absl::Duration timeout) {
    bool timed_out = elapsed >= timeout - absl::Milliseconds(50) ||
                     error.find("Timed out") != std::string::npos ||
                     error.find("timeout") != std::string::npos;
    Break(absl::StrCat(what, " failed: ", FirstLine(error)));
    std::string who = WhoDidNotArrive(seq, what);
    std::string msg = absl::StrCat(
        "gloo ", what, " in ", group.Describe(), " failed on ", group.Rank(group.rank), " after ",
        Journal::Round(elapsed),
        timed_out ? absl::StrCat(" (timeout ", absl::FormatDuration(timeout), ")") : std::string(),
        ": ", who, ". Gloo: ", FirstLine(error),
        ". Recent operations on this rank, oldest first: ", journal.Recent());
    return timed_out ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
  }

  absl::Status P2pFailed(const std::string& what, int peer, const std::string& error,
                         absl::Duration elapsed, absl::Duration timeout) {
    bool timed_out =
        elapsed >= timeout - absl::Milliseconds(50) || error.find("Timed out") != std::string::npos;
    Break(absl::StrCat(what, " failed: ", FirstLine(error)));
    PublishProgress();
    std::string peer_state = "its progress is unknown";
    absl::StatusOr<std::string> v = store->Get(ProgressKey(peer), absl::Milliseconds(50));
    Progress p;
    if (v.ok() && DecodeProgress(*v, &p)) {
      peer_state = absl::StrFormat("it last reported (%.1fs ago) %s%s",
                                   double(absl::ToUnixMillis(absl::Now()) - p.unix_ms) / 1000.0,
                                   p.started < 0 && p.what == "(none)"
                                       ? std::string("no collective started")
                                       : absl::StrCat("being at collective ", p.what),
                                   Why(p));
    }
    std::string msg =
        absl::StrCat("gloo ", what, " in ", group.Describe(), " failed on ", group.Rank(group.rank),
                     " after ", Journal::Round(elapsed),
                     timed_out ? " (timed out: the peer has not posted the matching "
                                 "operation)"
                               : "",
                     ": peer ", group.Rank(peer), ": ", peer_state, ". Gloo: ", FirstLine(error),
                     ". Recent operations on this rank, oldest first: ", journal.Recent());
    return timed_out ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
  }

  absl::Status BrokenError(const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat("gloo ", what, " in ", group.Describe(), " on ", group.Rank(group.rank),
                     ": this communicator is unusable since an earlier operation failed (",
                     Broken(), "); make a new communicator"));
  }

  static std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }
};

// ---- Work ------------------------------------------------------------------------------------

class GlooWork final : public Work {
 public:
  GlooWork(std::shared_ptr<Core> core, std::string what, absl::Duration budget)
      : core_(std::move(core)), what_(std::move(what)), budget_(budget) {}

  absl::Status Wait() override { return WaitFor(budget_); }

  absl::Status WaitFor(absl::Duration budget) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&done_), budget)) return status_;
    }
    // The operation itself is bounded by the timeout, so this means it has not even started
    // (queued behind a slow one) or is stuck outside Gloo's control.
    return absl::DeadlineExceededError(
        absl::StrCat("gloo ", what_, " in ", core_->group.Describe(), " on ",
                     core_->group.Rank(core_->group.rank), ": not finished after waiting ",
                     absl::FormatDuration(budget),
                     ". Recent operations on this rank, oldest first: ", core_->journal.Recent()));
  }

  bool IsCompleted() override {
    absl::MutexLock lock(&mu_);
    return done_;
  }

  void Finish(absl::Status status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    done_ = true;
  }

 private:
  std::shared_ptr<Core> core_;
  const std::string what_;
  const absl::Duration budget_;
  absl::Mutex mu_;
  bool done_ = false;
  absl::Status status_;
};

// ---- Send and Recv in flight -----------------------------------------------------------------

// One Send or Recv after it was posted. Whoever first waits for it blocks on the transport's
// buffer itself, so the transport's thread wakes that caller directly when the message is in.
// (It used to be a thread per operation, waiting from the start: a second wake-up per message.
// With every core computing, the scheduler queued that thread behind a computing rank for a
// time slice while the waker's core went idle: 2-8 ms per message in a 2-stage pipeline's
// trace, issue 11.) A thread waits instead only when the result is polled (IsCompleted) or the
// Work is dropped unwaited: the transport still reads from or writes into the tensor's memory,
// which `keep` holds until then.
class P2pOp : public std::enable_shared_from_this<P2pOp> {
 public:
  P2pOp(std::shared_ptr<Core> core, std::unique_ptr<UnboundBuffer> buf, Tensor keep, bool send,
        int peer, std::string what, uint64_t id, absl::Duration timeout)
      : core_(std::move(core)), buf_(std::move(buf)), keep_(std::move(keep)), send_(send),
        peer_(peer), what_(std::move(what)), id_(id), timeout_(timeout) {}

  absl::Status Wait(absl::Duration budget) {
    {
      absl::MutexLock lock(&mu_);
      if (done_) return status_;
      if (claimed_) {  // another thread is on the transport: wait for its result
        if (mu_.AwaitWithTimeout(absl::Condition(&done_), budget)) return status_;
        return absl::DeadlineExceededError(absl::StrCat(
            "gloo ", what_, " in ", core_->group.Describe(), ": not finished after waiting ",
            absl::FormatDuration(budget),
            ". Recent operations on this rank, oldest first: ", core_->journal.Recent()));
      }
      claimed_ = true;
    }
    return Block();
  }

  bool IsCompleted() {
    absl::MutexLock lock(&mu_);
    if (!done_ && !claimed_) WaitInBackground();
    return done_;
  }

  // The Work was dropped: the memory must outlive the transfer.
  void Release() {
    absl::MutexLock lock(&mu_);
    if (!done_ && !claimed_) WaitInBackground();
  }

  // For the communicator's destructor: every operation ends (by its timeout at the latest)
  // before the connections close.
  void Drain() { (void)Wait(timeout_ + absl::Seconds(5)); }

 private:
  // Called holding mu_.
  void WaitInBackground() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    claimed_ = true;
    core_->p2p_threads.Start([self = shared_from_this()] { (void)self->Block(); });
  }

  // On the claiming thread only.
  absl::Status Block() {
    const absl::Time start = absl::Now();
    absl::Status st;
    try {
      if (send_) {
        buf_->waitSend(Ms(timeout_));
      } else {
        buf_->waitRecv(Ms(timeout_));
      }
    } catch (const std::exception& e) {
      st = core_->P2pFailed(what_, peer_, e.what(), absl::Now() - start, timeout_);
    }
    core_->journal.Finish(id_, st.ok());
    absl::MutexLock lock(&mu_);
    status_ = st;
    done_ = true;
    buf_.reset();
    keep_ = Tensor();
    return st;
  }

  std::shared_ptr<Core> core_;
  std::unique_ptr<UnboundBuffer> buf_;  // only the claiming thread touches it before done_
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
  P2pWork(std::shared_ptr<P2pOp> op, absl::Duration budget) : op_(std::move(op)), budget_(budget) {}
  ~P2pWork() override { op_->Release(); }
  absl::Status Wait() override { return op_->Wait(budget_); }
  bool IsCompleted() override { return op_->IsCompleted(); }

 private:
  std::shared_ptr<P2pOp> op_;
  const absl::Duration budget_;
};

// ---- A thread running posted functions in order (drained on destruction) ---------------------

class SerialThread {
 public:
  SerialThread() : thread_([this] { Loop(); }) {}
  ~SerialThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

// ---- Helpers -----------------------------------------------------------------------------

// An element of N bytes: Gloo's templated setters only look at sizeof(T).
template <size_t N>
struct Elem {
  char b[N];
};

template <typename F>
void WithElemSize(size_t size, F&& f) {
  switch (size) {
    case 1:
      return f(Elem<1>{});
    case 2:
      return f(Elem<2>{});
    case 4:
      return f(Elem<4>{});
    case 8:
      return f(Elem<8>{});
  }
  BRAID_CHECK(false) << "gloo communicator: element size " << size;
}

char* Bytes(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

std::string Elements(const Tensor& t) {
  return absl::StrCat(DTypeName(t.dtype()), ", ", t.numel(), " elements");
}

// Grow-only scratch memory, used by the worker thread only.
class Scratch {
 public:
  template <typename T>
  T* Get(size_t n) {
    size_t bytes = n * sizeof(T);
    if (bytes > size_) {
      data_.reset(new char[bytes]);
      size_ = bytes;
    }
    return reinterpret_cast<T*>(data_.get());
  }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
};

// Rank r of the group ends with block r of the element-wise reduction (fn) of every rank's
// `in` in `out`; block q is counts[q] elements of `elem` bytes.
//
// A ring of n-1 steps: at step s rank r sends block (r-s-1) mod n to rank r+1 and receives block
// (r-s-2) mod n from rank r-1, which it reduces with its own copy of that block; what it reduced
// at step s is what it sends at step s+1, and at the last step it receives its own block. Blocks
// travel in segments, so reducing one segment overlaps receiving the next, and each segment is
// sent on as soon as it is reduced. Messages between two ranks share one slot: the transport
// matches them in posting order, which is the same on both sides.
void RingReduceScatter(::gloo::Context& ctx, const char* in, char* out,
                       const std::vector<int64_t>& counts, size_t elem, ReduceFn fn, uint64_t slot,
                       std::chrono::milliseconds timeout, size_t segment_bytes, Scratch& scratch) {
  const int n = ctx.size, r = ctx.rank;
  std::vector<size_t> offset(n + 1, 0);  // in bytes
  size_t max_block = 0;
  for (int q = 0; q < n; ++q) {
    offset[q + 1] = offset[q] + size_t(counts[q]) * elem;
    max_block = std::max(max_block, size_t(counts[q]) * elem);
  }
  auto bytes_of = [&](int q) { return offset[q + 1] - offset[q]; };
  if (n == 1) {
    std::memcpy(out, in + offset[r], bytes_of(r));
    return;
  }
  if (max_block == 0) return;
  const size_t seg = std::max(elem, segment_bytes / elem * elem);
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  const int right = mod(r + 1), left = mod(r - 1);

  char* base = scratch.Get<char>(4 * max_block);
  char* recv_mem[2] = {base, base + max_block};
  char* acc_mem[2] = {base + 2 * max_block, base + 3 * max_block};
  std::unique_ptr<UnboundBuffer> in_buf = ctx.createUnboundBuffer(const_cast<char*>(in), offset[n]);
  std::unique_ptr<UnboundBuffer> recv_buf[2], acc_buf[2];
  for (int i = 0; i < 2; ++i) {
    recv_buf[i] = ctx.createUnboundBuffer(recv_mem[i], max_block);
    acc_buf[i] = ctx.createUnboundBuffer(acc_mem[i], max_block);
  }

  auto post_recvs = [&](int s) {
    size_t bytes = bytes_of(mod(r - s - 2));
    for (size_t o = 0; o < bytes; o += seg) {
      recv_buf[s % 2]->recv(left, slot, o, std::min(seg, bytes - o));
    }
  };

  // Step 0 sends come straight from the input.
  int in_sends = 0;
  {
    int b = mod(r - 1);
    size_t bytes = bytes_of(b);
    for (size_t o = 0; o < bytes; o += seg, ++in_sends) {
      in_buf->send(right, slot, offset[b] + o, std::min(seg, bytes - o));
    }
  }
  post_recvs(0);
  int acc_sends[2] = {0, 0};
  for (int s = 0; s < n - 1; ++s) {
    const bool last = s == n - 2;
    if (!last) post_recvs(s + 1);
    char* dst = last ? out : acc_mem[s % 2];
    if (!last) {
      // acc[s % 2] still feeds the sends posted two steps ago.
      for (; acc_sends[s % 2] > 0; --acc_sends[s % 2]) acc_buf[s % 2]->waitSend(timeout);
    }
    const int b = mod(r - s - 2);
    const size_t bytes = bytes_of(b);
    const char* mine = in + offset[b];
    for (size_t o = 0; o < bytes; o += seg) {
      size_t len = std::min(seg, bytes - o);
      recv_buf[s % 2]->waitRecv(timeout);
      fn(dst + o, mine + o, recv_mem[s % 2] + o, len / elem);
      if (!last) {
        acc_buf[s % 2]->send(right, slot, o, len);
        ++acc_sends[s % 2];
      }
    }
  }
  for (; in_sends > 0; --in_sends) in_buf->waitSend(timeout);
  for (int i = 0; i < 2; ++i) {
    for (; acc_sends[i] > 0; --acc_sends[i]) acc_buf[i]->waitSend(timeout);
  }
}

// Per-process count of communicators made per store prefix (see store_prefix in the header).
std::string InstancePrefix(const std::string& prefix) {
  static std::mutex mu;
  static std::map<std::string, int>* counts = new std::map<std::string, int>();
  std::lock_guard<std::mutex> lock(mu);
  int n = (*counts)[prefix]++;
  return n == 0 ? prefix : absl::StrCat(prefix, ".", n);
}

// ---- The communicator ------------------------------------------------------------------------

class GlooCommunicator final : public Communicator {
 public:
  // Joins the group `g` over `store` and connects every pair (blocking, up to `timeout`).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      GroupInfo g, Settings settings, braid::Store* store,
      std::shared_ptr<::gloo::transport::Device> device, absl::Duration timeout,
      const std::string& join_value) {
    BRAID_RETURN_IF_ERROR(Join(g, store, timeout, join_value));
    auto context = std::make_shared<::gloo::rendezvous::Context>(g.rank, g.size);
    context->setTimeout(Ms(timeout));
    try {
      GlooStoreAdapter adapter(store, g.prefix + "/mesh", timeout);
      context->connectFullMesh(adapter, device);
      // connectFullMesh returns once this rank's side of every pair is up; a rank that went on
      // and closed its communicator at once could still break a peer's half-made pair. A barrier
      // makes construction end together. (Its tag is never a collective's sequence number.)
      if (g.size > 1) {
        ::gloo::BarrierOptions o(context);
        o.setTag(0xffffffffu);
        o.setTimeout(Ms(timeout));
        ::gloo::barrier(o);
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("gloo communicator ", g.Rank(g.rank), " of ", g.Describe(),
                       ": connecting to the other ranks failed: ", Core::FirstLine(e.what())));
    }
    auto core = std::make_shared<Core>();
    core->group = std::move(g);
    core->settings = std::move(settings);
    core->store = store;
    core->device = std::move(device);
    core->context = std::move(context);
    return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(std::move(core), timeout));
  }

  ~GlooCommunicator() override {
    worker_.reset();  // drains the queued collectives
    {
      absl::MutexLock lock(&p2p_mu_);
      // Each ends by its timeout at the latest; the connections close only after.
      for (auto& w : p2p_ops_) {
        if (auto op = w.lock()) op->Drain();
      }
      p2p_ops_.clear();
    }
    core_->p2p_threads.JoinAll();
    core_->StopHeartbeat();
    heartbeat_.join();
    {
      absl::MutexLock lock(&core_->mu);
      core_->final_note = absl::StrCat("it destroyed its communicator after #", core_->finished);
    }
    core_->PublishProgress();
    core_->context.reset();  // closes this rank's connections
    core_->device.reset();   // Works may outlive this, holding core_
  }

  int rank() const override { return core_->group.rank; }
  int size() const override { return core_->group.size; }
  std::string name() const override { return "gloo"; }

  std::shared_ptr<Work> AllReduce(Tensor& t, ReduceOp op) override {
    std::string what = "AllReduce";
    absl::Status st = CheckTensor(t, "AllReduce");
    if (st.ok()) {
      what = absl::StrCat("AllReduce(", ReduceOpName(op), ", ", Elements(t), ")");
      st = CheckReducible(what, t.dtype(), op);
    }
    Tensor tensor = t;
    return Enqueue(what, st.ok() ? t.nbytes() : 0, st,
                   [this, tensor, op](int64_t seq) { RunAllReduce(tensor, op, seq); });
  }

  std::shared_ptr<Work> ReduceScatter(const Tensor& input, Tensor& output, ReduceOp op,
                                      const std::vector<int64_t>& counts) override {
    std::string what = "ReduceScatter";
    std::vector<int64_t> blocks;
    absl::Status st = CheckTensor(input, "ReduceScatter input");
    if (st.ok()) st = CheckTensor(output, "ReduceScatter output");
    if (st.ok()) {
      what = absl::StrCat(
          "ReduceScatter(", ReduceOpName(op), ", ", Elements(input),
          counts.empty() ? "" : absl::StrCat(" in blocks ", absl::StrJoin(counts, ",")), ")");
      st = CheckReducible(what, input.dtype(), op);
    }
    if (st.ok()) st = Blocks(what, input.numel(), counts, &blocks);
    if (st.ok()) st = CheckBlock(what, "output", output, input.dtype(), blocks);
    Tensor in = input, out = output;
    return Enqueue(
        what, st.ok() ? input.nbytes() : 0, st,
        [this, in, out, op, blocks](int64_t seq) { RunReduceScatter(in, out, op, blocks, seq); });
  }

  std::shared_ptr<Work> AllGather(const Tensor& input, Tensor& output,
                                  const std::vector<int64_t>& counts) override {
    std::string what = "AllGather";
    std::vector<int64_t> blocks;
    absl::Status st = CheckTensor(input, "AllGather input");
    if (st.ok()) st = CheckTensor(output, "AllGather output");
    if (st.ok()) {
      what = absl::StrCat(
          "AllGather(", Elements(output),
          counts.empty() ? "" : absl::StrCat(" in blocks ", absl::StrJoin(counts, ",")), ")");
      st = Blocks(what, output.numel(), counts, &blocks);
    }
    if (st.ok()) st = CheckBlock(what, "input", input, output.dtype(), blocks);
    Tensor in = input, out = output;
    bool equal = counts.empty() || std::all_of(blocks.begin(), blocks.end(),
                                               [&](int64_t c) { return c == blocks[0]; });
    return Enqueue(
        what, st.ok() ? output.nbytes() : 0, st,
        [this, in, out, blocks, equal](int64_t seq) { RunAllGather(in, out, blocks, equal, seq); });
  }

  std::shared_ptr<Work> Broadcast(Tensor& t, int root) override {
    std::string what = "Broadcast";
    absl::Status st = CheckTensor(t, "Broadcast");
    if (st.ok()) {
      what = absl::StrCat("Broadcast(root ", root, ", ", Elements(t), ")");
      st = CheckRoot(what, root);
    }
    Tensor tensor = t;
    return Enqueue(what, st.ok() ? t.nbytes() : 0, st, [this, tensor, root](int64_t seq) {
      if (tensor.numel() == 0 || size() == 1) return;
      ::gloo::BroadcastOptions o(core_->context);
      o.setOutput<Elem<1>>(reinterpret_cast<Elem<1>*>(Bytes(tensor)), tensor.nbytes());
      o.setRoot(root);
      o.setTag(uint32_t(seq));
      o.setTimeout(Ms(op_timeout_));
      ::gloo::broadcast(o);
    });
  }

  std::shared_ptr<Work> Reduce(Tensor& t, int root, ReduceOp op) override {
    std::string what = "Reduce";
    absl::Status st = CheckTensor(t, "Reduce");
    if (st.ok()) {
      what = absl::StrCat("Reduce(root ", root, ", ", ReduceOpName(op), ", ", Elements(t), ")");
      st = CheckReducible(what, t.dtype(), op);
    }
    if (st.ok()) st = CheckRoot(what, root);
    Tensor tensor = t;
    return Enqueue(what, st.ok() ? t.nbytes() : 0, st,
                   [this, tensor, root, op](int64_t seq) { RunReduce(tensor, root, op, seq); });
  }

  std::shared_ptr<Work> Barrier() override {
    return Enqueue("Barrier()", 0, absl::OkStatus(), [this](int64_t seq) {
      if (size() == 1) return;
      ::gloo::BarrierOptions o(core_->context);
      o.setTag(uint32_t(seq));
      o.setTimeout(Ms(op_timeout_));
      ::gloo::barrier(o);
    });
  }

  std::shared_ptr<Work> Send(const Tensor& t, int dst, int tag) override {
    return PointToPoint(/*send=*/true, t, dst, tag);
  }
  std::shared_ptr<Work> Recv(Tensor& t, int src, int tag) override {
    return PointToPoint(/*send=*/false, t, src, tag);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks) override {
    const GroupInfo& g = core_->group;
    std::string what = absl::StrCat("NewGroup(ranks ", absl::StrJoin(ranks, ","), ")");
    std::set<int> seen;
    for (int r : ranks) {
      if (r < 0 || r >= size() || !seen.insert(r).second) {
        return absl::InvalidArgumentError(absl::StrCat(what, " on ", g.Rank(rank()), " of ",
                                                       g.Describe(), ": rank ", r,
                                                       " is out of range or listed twice"));
      }
    }
    if (ranks.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NewGroup on ", g.Rank(rank()), " of ", g.Describe(), ": no ranks given"));
    }
    auto it = std::find(ranks.begin(), ranks.end(), rank());
    const bool member = it != ranks.end();
    const int child_rank = int(it - ranks.begin());
    auto result = std::make_shared<std::unique_ptr<GlooCommunicator>>();
    absl::Duration timeout = this->timeout();
    std::shared_ptr<GlooWork> work =
        Enqueue(what, 0, absl::OkStatus(),
                [this, member, child_rank, ranks, result, timeout](int64_t seq) -> absl::Status {
                  if (!member) return absl::OkStatus();
                  const GroupInfo& parent = core_->group;
                  GroupInfo child;
                  child.name = absl::StrCat(parent.name, "/g", seq);
                  child.prefix = absl::StrCat(parent.prefix, "/g", seq);
                  child.rank = child_rank;
                  child.size = int(ranks.size());
                  for (int r : ranks) child.world_ranks.push_back(parent.world_ranks[r]);
                  absl::StatusOr<std::unique_ptr<GlooCommunicator>> c =
                      Connect(std::move(child), core_->settings, core_->store, core_->device,
                              timeout, absl::StrCat("ranks=", absl::StrJoin(ranks, ",")));
                  if (!c.ok()) return c.status();
                  *result = std::move(*c);
                  return absl::OkStatus();
                });
    // Joining waits up to the timeout for the members and again for the connections.
    BRAID_RETURN_IF_ERROR(work->WaitFor(2 * timeout + WaitGrace()));
    if (!member) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(std::move(*result));
  }

 private:
  GlooCommunicator(std::shared_ptr<Core> core, absl::Duration timeout) : core_(std::move(core)) {
    set_timeout(timeout);
    worker_ = std::make_unique<SerialThread>();
    core_->PublishProgress();
    heartbeat_ = std::thread([core = core_] { core->HeartbeatLoop(); });
  }

  // Writes "join/<rank>" and waits for every rank's; names the ranks that did not come and
  // refuses a group whose members disagree on `join_value` (world size, member list).
  static absl::Status Join(const GroupInfo& g, braid::Store* store, absl::Duration timeout,
                           const std::string& join_value) {
    auto key = [&](int r) { return absl::StrCat(g.prefix, "/join/", r); };
    BRAID_RETURN_IF_ERROR(store->Set(key(g.rank), join_value));
    std::vector<std::string> keys;
    for (int r = 0; r < g.size; ++r) keys.push_back(key(r));
    absl::Status waited = WaitInSlices(store, keys, timeout);
    std::vector<int> missing, joined;
    for (int r = 0; r < g.size; ++r) {
      absl::StatusOr<std::string> v =
          store->Get(key(r), waited.ok() ? absl::Seconds(10) : absl::Milliseconds(10));
      if (!v.ok()) {
        missing.push_back(r);
        continue;
      }
      joined.push_back(r);
      if (*v != join_value) {
        return absl::InvalidArgumentError(
            absl::StrCat("gloo communicator ", g.Rank(g.rank), " of ", g.Describe(), ": ",
                         g.Rank(r), " joined with ", *v, " but this rank has ", join_value,
                         "; every rank must pass the same group (world size or member list)"));
      }
    }
    if (!missing.empty()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "gloo communicator ", g.Rank(g.rank), " of ", g.Describe(), ": rank(s) ",
          absl::StrJoin(missing, ","), " did not join within ", absl::FormatDuration(timeout),
          " (joined: ", absl::StrJoin(joined, ","), "; store keys '", g.prefix, "/join/<rank>')",
          waited.ok() ? "" : absl::StrCat(": ", waited.message())));
    }
    return absl::OkStatus();
  }

  absl::Duration WaitGrace() const {
    return std::min(core_->settings.heartbeat + absl::Milliseconds(250), absl::Seconds(3)) +
           absl::Seconds(5);
  }

  // Queues collective `what` (its sequence number is assigned here, in issue order). `run`
  // throws on transport errors; a non-OK `local_error` fails the Work without running it.
  template <typename Run>
  std::shared_ptr<GlooWork> Enqueue(const std::string& what, size_t bytes, absl::Status local_error,
                                    Run run) {
    int64_t seq;
    {
      absl::MutexLock lock(&issue_mu_);
      seq = next_seq_++;
    }
    std::string full = absl::StrCat("#", seq, " ", what);
    uint64_t id = core_->journal.Add(absl::StrCat(full, " ", bytes, " B"));
    absl::Duration timeout = this->timeout();
    auto work = std::make_shared<GlooWork>(core_, full, timeout + WaitGrace());
    worker_->Post([this, work, seq, full, id, timeout, local_error, run]() mutable {
      core_->journal.Start(id);
      absl::Time t0 = absl::Now();
      absl::Status st;
      std::string broken = core_->Broken();
      if (!local_error.ok()) {
        // Our peers will wait for us in this collective: the group cannot go on. This rank
        // counts as not having arrived (it never started it), with the reason published.
        st = local_error;
        core_->Break(
            absl::StrCat(full, " was called with invalid arguments: ", local_error.message()));
        core_->PublishProgress();
        core_->journal.Finish(id, false);
        work->Finish(std::move(st));
        return;
      }
      if (!broken.empty()) {
        st = core_->BrokenError(full);  // not started: peers must not count this rank as arrived
      } else {
        core_->Started(seq, full);
        op_timeout_ = timeout;
        try {
          st = Invoke(run, seq);
        } catch (const std::exception& e) {
          st = core_->CollectiveFailed(seq, full, e.what(), absl::Now() - t0, timeout);
        }
        core_->Finished(seq);
      }
      core_->journal.Finish(id, st.ok());
      work->Finish(std::move(st));
    });
    return work;
  }

  template <typename Run>
  static absl::Status Invoke(Run& run, int64_t seq) {
    if constexpr (std::is_same_v<decltype(run(seq)), void>) {
      run(seq);
      return absl::OkStatus();
    } else {
      return run(seq);
    }
  }

  // ---- Collectives, on the worker thread --------------------------------------------------

  ReduceFn Fn(DType t, ReduceOp op) {
    ReduceFn fn = NativeReduceFn(t, op);
    BRAID_CHECK(fn != nullptr) << "no native reduction for " << DTypeName(t);
    return fn;
  }

  // In place on `data` (n elements of native dtype t).
  void AllReduceNative(void* data, size_t n, DType t, ReduceOp op, int64_t seq) {
    if (n == 0 || size() == 1) return;
    const size_t bytes = n * SizeOf(t);
    const Settings& s = core_->settings;
    AllreduceAlgorithm algo = s.allreduce;
    if (algo == AllreduceAlgorithm::kAuto) {
      algo = bytes * size_t(size() - 1) <= s.direct_max_bytes ? AllreduceAlgorithm::kDirect
             : bytes <= s.bcube_max_bytes                     ? AllreduceAlgorithm::kBcube
                                                              : AllreduceAlgorithm::kRing;
    }
    if (algo == AllreduceAlgorithm::kDirect) {
      DirectAllReduce(static_cast<char*>(data), bytes, SizeOf(t), Fn(t, op), seq);
      return;
    }
    ::gloo::AllreduceOptions o(core_->context);
    WithElemSize(SizeOf(t), [&](auto e) {
      using E = decltype(e);
      o.setOutput<E>(static_cast<E*>(data), n);
    });
    o.setReduceFunction(Fn(t, op));
    o.setTag(uint32_t(seq));
    o.setTimeout(Ms(op_timeout_));
    o.setMaxSegmentSize(s.segment_bytes);
    o.setAlgorithm(algo == AllreduceAlgorithm::kBcube ? ::gloo::AllreduceOptions::Algorithm::BCUBE
                                                      : ::gloo::AllreduceOptions::Algorithm::RING);
    ::gloo::allreduce(o);
  }

  // Small buffers: every rank sends its whole buffer to every other rank, then reduces all of
  // them in rank order (so every rank computes bit-identical results). One message latency
  // instead of the ring's 2(n-1) or more; (n-1) times the buffer in traffic, hence small only.
  void DirectAllReduce(char* data, size_t bytes, size_t elem, ReduceFn fn, int64_t seq) {
    const int n = size(), me = rank();
    const uint64_t slot = ::gloo::Slot::build(kDirectAllreduceSlotPrefix, uint32_t(seq));
    const std::chrono::milliseconds timeout = Ms(op_timeout_);
    char* all = ring_.Get<char>(bytes * size_t(n));  // rank q's buffer at q * bytes
    auto mine = core_->context->createUnboundBuffer(data, bytes);
    auto others = core_->context->createUnboundBuffer(all, bytes * size_t(n));
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      others->recv(q, slot, size_t(q) * bytes, bytes);
      mine->send(q, slot);
    }
    std::memcpy(all + size_t(me) * bytes, data, bytes);
    for (int q = 0; q < n - 1; ++q) others->waitRecv(timeout);
    for (int q = 0; q < n - 1; ++q) mine->waitSend(timeout);
    fn(data, all, all + bytes, bytes / elem);
    for (int q = 2; q < n; ++q) fn(data, data, all + size_t(q) * bytes, bytes / elem);
  }

  void RunAllReduce(const Tensor& t, ReduceOp op, int64_t seq) {
    const size_t n = size_t(t.numel());
    if (n == 0) return;
    const DType dt = t.dtype();
    if (NativeReduceFn(dt, op) != nullptr) {
      AllReduceNative(t.raw_data(), n, dt, op, seq);
      if (op == ReduceOp::kAvg) DivideInPlace(static_cast<float*>(t.raw_data()), n, float(size()));
      return;
    }
    float* f = upcast_in_.Get<float>(n);
    UpcastToF32(dt, t.raw_data(), f, n);
    AllReduceNative(f, n, DType::kF32, op, seq);
    if (op == ReduceOp::kAvg) DivideInPlace(f, n, float(size()));
    DowncastFromF32(dt, f, t.raw_data(), n);
  }

  void RunReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op,
                        const std::vector<int64_t>& counts, int64_t seq) {
    const DType dt = in.dtype();
    const size_t mine = size_t(counts[rank()]);
    const uint64_t slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, uint32_t(seq));
    if (NativeReduceFn(dt, op) != nullptr) {
      RingReduceScatter(*core_->context, Bytes(in), Bytes(out), counts, SizeOf(dt), Fn(dt, op),
                        slot, Ms(op_timeout_), core_->settings.segment_bytes, ring_);
      if (op == ReduceOp::kAvg)
        DivideInPlace(static_cast<float*>(out.raw_data()), mine, float(size()));
      return;
    }
    const size_t n = size_t(in.numel());
    float* fin = upcast_in_.Get<float>(n);
    float* fout = upcast_out_.Get<float>(std::max<size_t>(mine, 1));
    UpcastToF32(dt, in.raw_data(), fin, n);
    RingReduceScatter(*core_->context, reinterpret_cast<const char*>(fin),
                      reinterpret_cast<char*>(fout), counts, sizeof(float), Fn(DType::kF32, op),
                      slot, Ms(op_timeout_), core_->settings.segment_bytes, ring_);
    if (op == ReduceOp::kAvg) DivideInPlace(fout, mine, float(size()));
    DowncastFromF32(dt, fout, out.raw_data(), mine);
  }

  void RunAllGather(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                    bool equal, int64_t seq) {
    const size_t elem = SizeOf(out.dtype());
    size_t my_offset = 0;
    for (int q = 0; q < rank(); ++q) my_offset += size_t(counts[q]) * elem;
    char* my_block = Bytes(out) + my_offset;
    const size_t my_bytes = size_t(counts[rank()]) * elem;
    // An input that is this rank's block of the output (ZeRO's layout) needs no copy.
    const bool in_place = Bytes(in) == my_block;
    if (out.nbytes() == 0) return;
    if (size() == 1) {
      if (!in_place) std::memmove(my_block, Bytes(in), my_bytes);
      return;
    }
    if (equal) {
      ::gloo::AllgatherOptions o(core_->context);
      if (!in_place) o.setInput<Elem<1>>(reinterpret_cast<Elem<1>*>(Bytes(in)), my_bytes);
      o.setOutput<Elem<1>>(reinterpret_cast<Elem<1>*>(Bytes(out)), out.nbytes());
      o.setTag(uint32_t(seq));
      o.setTimeout(Ms(op_timeout_));
      ::gloo::allgather(o);
      return;
    }
    if (!in_place) std::memcpy(my_block, Bytes(in), my_bytes);
    ::gloo::AllgathervOptions o(core_->context);
    std::vector<size_t> elements;
    for (int64_t c : counts) elements.push_back(size_t(c) * elem);
    o.setOutput<Elem<1>>(reinterpret_cast<Elem<1>*>(Bytes(out)), elements);
    o.setTag(uint32_t(seq));
    o.setTimeout(Ms(op_timeout_));
    ::gloo::allgatherv(o);
  }

  void RunReduce(const Tensor& t, int root, ReduceOp op, int64_t seq) {
    const size_t n = size_t(t.numel());
    if (n == 0) return;
    const DType dt = t.dtype();
    const bool native = NativeReduceFn(dt, op) != nullptr;
    void* data = t.raw_data();
    float* f = nullptr;
    if (!native) {
      f = upcast_in_.Get<float>(n);
      UpcastToF32(dt, data, f, n);
      data = f;
    }
    if (size() > 1) {
      ::gloo::ReduceOptions o(core_->context);
      const DType rt = native ? dt : DType::kF32;
      WithElemSize(SizeOf(rt), [&](auto e) {
        using E = decltype(e);
        o.setOutput<E>(static_cast<E*>(data), n);
      });
      o.setRoot(root);
      o.setReduceFunction(Fn(rt, op));
      o.setTag(uint32_t(seq));
      o.setTimeout(Ms(op_timeout_));
      o.setMaxSegmentSize(core_->settings.segment_bytes);
      ::gloo::reduce(o);
    }
    if (rank() != root) return;
    if (op == ReduceOp::kAvg) DivideInPlace(static_cast<float*>(data), n, float(size()));
    if (!native) DowncastFromF32(dt, f, t.raw_data(), n);
  }

  // ---- Point to point ------------------------------------------------------------------

  std::shared_ptr<Work> PointToPoint(bool send, const Tensor& t, int peer, int tag) {
    const GroupInfo& g = core_->group;
    const char* op = send ? "Send" : "Recv";
    absl::Status st = CheckTensor(t, op);
    if (st.ok() && (peer < 0 || peer >= size() || peer == rank())) {
      st = absl::InvalidArgumentError(
          absl::StrCat(op, " on ", g.Rank(rank()), " of ", g.Describe(), ": peer rank ", peer,
                       peer == rank() ? " is this rank" : " is out of range"));
    }
    if (!st.ok()) return CompletedWork(st);
    int64_t n;
    {
      absl::MutexLock lock(&issue_mu_);
      n = (send ? sends_ : recvs_)[peer]++;
    }
    std::string what = absl::StrCat(op, " #", n, send ? " to " : " from ", g.Rank(peer), " (tag ",
                                    tag, ", ", t.DescribeForError(), ")");
    uint64_t id = core_->journal.Add(absl::StrCat(what, " ", t.nbytes(), " B"));
    core_->journal.Start(id);
    absl::Duration timeout = this->timeout();
    auto work = std::make_shared<GlooWork>(core_, what, timeout + WaitGrace());
    std::string broken = core_->Broken();
    if (!broken.empty()) {
      core_->journal.Finish(id, false);
      work->Finish(core_->BrokenError(what));
      return work;
    }
    if (t.nbytes() == 0) {
      core_->journal.Finish(id, true);
      work->Finish(absl::OkStatus());
      return work;
    }
    // Posting never blocks (the transport queues it), which is why it happens right here: a
    // Send and a Recv issued by both sides in any order always meet. The wait is the caller's
    // (P2pOp), so Works may be waited in any order: a pipeline's stages exchange in both
    // directions and wait for what they need next.
    std::unique_ptr<UnboundBuffer> buf;
    absl::Time posted = absl::Now();
    try {
      buf = core_->context->createUnboundBuffer(t.raw_data(), t.nbytes());
      const uint64_t slot = ::gloo::Slot::build(kP2pSlotPrefix, uint32_t(tag));
      if (send) {
        buf->send(peer, slot);
      } else {
        buf->recv(peer, slot);
      }
    } catch (const std::exception& e) {
      core_->journal.Finish(id, false);
      work->Finish(core_->P2pFailed(what, peer, e.what(), absl::Now() - posted, timeout));
      return work;
    }
    auto flight = std::make_shared<P2pOp>(core_, std::move(buf), t, send, peer, what, id, timeout);
    absl::MutexLock lock(&p2p_mu_);
    p2p_ops_.erase(std::remove_if(p2p_ops_.begin(), p2p_ops_.end(),
                                  [](const std::weak_ptr<P2pOp>& w) { return w.expired(); }),
                   p2p_ops_.end());
    p2p_ops_.push_back(flight);
    return std::make_shared<P2pWork>(std::move(flight), timeout + WaitGrace());
  }

  // ---- Argument checks (same rules as the in-process communicator) ------------------------

  absl::Status CheckTensor(const Tensor& t, const char* role) const {
    if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(role, " tensor is undefined"));
    if (t.device().type != DeviceType::kCPU) {
      return absl::InvalidArgumentError(
          absl::StrCat(role, " tensor ", t.DescribeForError(),
                       " is not on a CPU device; the gloo communicator moves host memory only"));
    }
    return absl::OkStatus();
  }

  // The rule every communicator shares (core/communicator.h).
  absl::Status CheckReducible(const std::string& what, DType t, ReduceOp op) const {
    return CheckReduction(op, t, absl::StrCat(what, " on ", core_->group.Rank(rank())));
  }

  absl::Status CheckRoot(const std::string& what, int root) const {
    if (root >= 0 && root < size()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, " on ", core_->group.Rank(rank()), " of ",
                                                   core_->group.Describe(), ": root ", root,
                                                   " is out of range"));
  }

  absl::Status Blocks(const std::string& what, int64_t total, const std::vector<int64_t>& counts,
                      std::vector<int64_t>* out) const {
    BRAID_ASSIGN_OR_RETURN(
        *out, BlockCounts(absl::StrCat(what, " on ", core_->group.Rank(rank())), total, size(),
                          counts));
    return absl::OkStatus();
  }

  absl::Status CheckBlock(const std::string& what, const char* role, const Tensor& t, DType dtype,
                          const std::vector<int64_t>& counts) const {
    if (t.numel() != counts[rank()] || t.dtype() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " on ", core_->group.Rank(rank()), ": ", role, " is ", t.DescribeForError(),
          " but must hold this rank's block: ", counts[rank()], " elements of ", DTypeName(dtype)));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Core> core_;

  absl::Mutex issue_mu_;
  int64_t next_seq_ = 0;          // GUARDED_BY(issue_mu_): collectives issued
  std::map<int, int64_t> sends_;  // GUARDED_BY(issue_mu_): per peer
  std::map<int, int64_t> recvs_;  // GUARDED_BY(issue_mu_)

  // Worker-thread state.
  absl::Duration op_timeout_;
  Scratch upcast_in_, upcast_out_, ring_;

  std::unique_ptr<SerialThread> worker_;
  absl::Mutex p2p_mu_;
  // GUARDED_BY(p2p_mu_): the Sends and Recvs posted whose Works may still be alive.
  std::vector<std::weak_ptr<P2pOp>> p2p_ops_;

  std::thread heartbeat_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(
    const CommunicatorOptions& options) {
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("gloo communicator: no rendezvous store given");
  }
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("gloo communicator: rank ", options.rank,
                                                   " is out of range for world size ",
                                                   options.size));
  }
  if (options.device.type != DeviceType::kCPU) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo communicator: device ", options.device.ToString(),
                     " is not a CPU device (use the nccl communicator for CUDA)"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo communicator: the timeout must be positive");
  }
  BRAID_ASSIGN_OR_RETURN(Settings settings, ParseSettings(options.options));
  if (settings.iface.empty()) {
    // Gloo's own lookup misreads getaddrinfo's errors and crashes on a name that does not
    // resolve, so resolve it here first.
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* found = nullptr;
    int rv = ::getaddrinfo(settings.hostname.c_str(), nullptr, &hints, &found);
    if (rv != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gloo communicator rank ", options.rank, ": cannot use hostname '", settings.hostname,
          "' for the TCP transport: ", ::gai_strerror(rv),
          " (give this host's address as peers reach it in option hostname, or an interface "
          "in option iface)"));
    }
    ::freeaddrinfo(found);
  }
  std::shared_ptr<::gloo::transport::Device> device;
  try {
    ::gloo::transport::tcp::attr attr;
    if (!settings.iface.empty()) {
      attr.iface = settings.iface;
    } else {
      attr.hostname = settings.hostname;
    }
    device = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo communicator rank ", options.rank, ": cannot use ",
                     settings.iface.empty() ? absl::StrCat("hostname '", settings.hostname, "'")
                                            : absl::StrCat("interface '", settings.iface, "'"),
                     " for the TCP transport: ", e.what()));
  }
  GroupInfo g;
  g.name = settings.group_name;
  g.prefix = InstancePrefix(settings.store_prefix);
  g.rank = options.rank;
  g.size = options.size;
  for (int r = 0; r < options.size; ++r) g.world_ranks.push_back(r);
  std::string join_value = absl::StrCat("size=", options.size);
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                         GlooCommunicator::Connect(std::move(g), std::move(settings), options.store,
                                                   std::move(device), options.timeout, join_value));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace braid::gloo_backend
