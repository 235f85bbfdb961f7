// Core's progress publishing (the heartbeat) and the failure diagnosis built from the progress
// every rank publishes; the group's descriptions used in every message; joining a group.
#include "backends/gloo/core_state.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "backends/gloo/store_adapter.h"
#include "core/check.h"

namespace braid::gloo_backend::internal {

bool GroupInfo::IsWorld() const {
  for (int r = 0; r < size; ++r) {
    if (world_ranks[r] != r) return false;
  }
  return true;
}

std::string GroupInfo::Describe() const {
  if (IsWorld()) return absl::StrCat("group '", name, "' (", size, " ranks)");
  return absl::StrCat("group '", name, "' (", size, " ranks: world ranks ",
                      absl::StrJoin(world_ranks, ","), ")");
}

std::string GroupInfo::Rank(int r) const {
  if (IsWorld()) return absl::StrCat("rank ", r);
  return absl::StrCat("rank ", r, " (world rank ", world_ranks[r], ")");
}

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

std::string Core::ProgressKey(int r) const { return absl::StrCat(group.prefix, "/progress/", r); }

void Core::Started(int64_t seq, const std::string& what) {
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

void Core::HeartbeatLoop() {
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

void Core::StopHeartbeat() {
  std::lock_guard<std::mutex> lock(beat_mu);
  beat_stop = true;
  beat_cv.notify_one();
}

void Core::Finished(int64_t seq) {
  absl::MutexLock lock(&mu);
  finished = seq;
}

std::string Core::Broken() {
  absl::MutexLock lock(&mu);
  return broken;
}

void Core::Break(const std::string& why) {
  absl::MutexLock lock(&mu);
  if (broken.empty()) broken = why;
}

void Core::PublishProgress() {
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

std::string Core::Why(const Progress& p) {
  if (p.why.empty()) return "";
  return absl::StrCat(p.failed ? ", and has failed: " : ", ", p.why);
}

std::string Core::WhoDidNotArrive(int64_t seq, const std::string& what) {
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
        notes.push_back(absl::StrCat(group.Rank(q), " reached it and failed too (reported ", heard,
                                     "): ", p.why));
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

absl::Status Core::CollectiveFailed(int64_t seq, const std::string& what, const std::string& error,
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

absl::Status Core::P2pFailed(const std::string& what, int peer, const std::string& error,
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
                   ": peer ", group.Rank(peer), ": ", peer_state, ". ", FirstLine(error),
                   ". Recent operations on this rank, oldest first: ", journal.Recent());
  return timed_out ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
}

absl::Status Core::BrokenError(const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrCat("gloo ", what, " in ", group.Describe(), " on ", group.Rank(group.rank),
                   ": this communicator is unusable since an earlier operation failed (", Broken(),
                   "); make a new communicator"));
}

absl::Status JoinGroup(const GroupInfo& g, braid::Store* store, absl::Duration timeout,
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

}  // namespace braid::gloo_backend::internal
