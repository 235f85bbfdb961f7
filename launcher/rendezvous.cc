#include "launcher/rendezvous.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/check.h"

namespace braid::launcher {

std::string LauncherInfo::Serialize() const {
  return absl::StrCat("id=", id, "\nnum_launchers=", num_launchers, "\nworld_size=", world_size,
                      "\nlocal_workers=", local_workers, "\nuniform=", uniform ? 1 : 0,
                      "\nmax_restarts=", max_restarts, "\nlabel=", label, "\nhost=", host,
                      "\nlayout=", layout, "\nrun_id=", run_id);
}

absl::StatusOr<LauncherInfo> LauncherInfo::Parse(const std::string& s) {
  LauncherInfo info;
  std::map<std::string, std::string> kv;
  for (absl::string_view line : absl::StrSplit(s, '\n')) {
    size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    kv[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  int uniform = 1;
  bool ok = absl::SimpleAtoi(kv["id"], &info.id) &&
            absl::SimpleAtoi(kv["num_launchers"], &info.num_launchers) &&
            absl::SimpleAtoi(kv["world_size"], &info.world_size) &&
            absl::SimpleAtoi(kv["local_workers"], &info.local_workers) &&
            absl::SimpleAtoi(kv["uniform"], &uniform) &&
            absl::SimpleAtoi(kv["max_restarts"], &info.max_restarts);
  if (!ok) {
    return absl::DataLossError(absl::StrCat(
        "a launcher published a check-in record this launcher cannot read (different Braid "
        "versions on the nodes?): '", s, "'"));
  }
  info.uniform = uniform != 0;
  info.label = kv["label"];
  info.host = kv["host"];
  info.layout = kv["layout"];
  // A launcher of a Braid without run ids has none, which is torchrun's default "none".
  info.run_id = kv.count("run_id") ? kv["run_id"] : "none";
  return info;
}

namespace {

std::string Who(const LauncherInfo& i) {
  return absl::StrCat(i.label, " (host ", i.host, ": ", i.layout, ")");
}

// A per-attempt counter (launchers done, launchers whose group exited): adds `delta` (0 reads it)
// and returns the count after.
absl::StatusOr<int> AddToCount(Store& store, const std::string& key, int64_t delta) {
  BRAID_ASSIGN_OR_RETURN(int64_t n, store.Add(key, delta));
  return static_cast<int>(n);
}

}  // namespace

std::string LauncherRendezvous::Key(int attempt, const std::string& name) const {
  return absl::StrCat("braid.launcher/", attempt, "/", name);
}

absl::StatusOr<std::optional<std::string>> LauncherRendezvous::TryGet(const std::string& key) {
  absl::StatusOr<std::string> v = store_->Get(key, absl::Milliseconds(1));
  if (v.ok()) return std::optional<std::string>(*v);
  if (absl::IsDeadlineExceeded(v.status()) || absl::IsNotFound(v.status())) {
    return std::optional<std::string>();
  }
  return v.status();
}

absl::Status LauncherRendezvous::Disagree(int attempt, const LauncherInfo& o) {
  const LauncherInfo& s = self_;
  std::string msg;
  if (o.world_size != s.world_size || o.num_launchers != s.num_launchers ||
      (s.uniform && o.uniform && o.local_workers != s.local_workers)) {
    msg = absl::StrCat("world size disagreement between ", Who(s), ": world size ", s.world_size,
                       ", and ", Who(o), ": world size ", o.world_size,
                       "; start every node with the same --nnodes and --nproc_per_node");
  } else if (o.run_id != s.run_id) {
    msg = absl::StrCat("--rdzv_id disagreement: ", Who(s), " has --rdzv_id=", s.run_id, ", ",
                       Who(o), " has --rdzv_id=", o.run_id,
                       "; these launchers belong to different jobs: give every launcher of one "
                       "job the same id (and different jobs different --master_port)");
  } else if (o.max_restarts != s.max_restarts) {
    msg = absl::StrCat("--max_restarts disagreement: ", Who(s), " has --max_restarts=",
                       s.max_restarts, ", ", Who(o), " has --max_restarts=", o.max_restarts,
                       "; give every node the same value");
  } else {
    return absl::OkStatus();
  }
  // Tell everyone (the other side may be waiting for launchers that will never come).
  (void)store_->CompareSet(Key(attempt, "error"), "", msg);
  return absl::FailedPreconditionError(msg);
}

absl::Status LauncherRendezvous::CheckIn(int attempt, absl::Duration timeout,
                                         const std::function<bool()>& cancelled,
                                         absl::Duration silence) {
  // The previous attempt's peers: on a restart, those that do not come are watched through
  // their last heartbeats (SilentLaunchers keeps when each last moved).
  const std::map<int, LauncherInfo> previous = peers_;
  peers_.clear();
  absl::Time deadline = absl::Now() + timeout;
  BRAID_ASSIGN_OR_RETURN(int64_t claims, store_->Add(Key(attempt, absl::StrCat("claim/", self_.id)), 1));
  if (claims > 1) {
    std::string first = "?";
    auto other = store_->Get(Key(attempt, absl::StrCat("info/", self_.id)), absl::Seconds(5));
    if (other.ok()) {
      auto info = LauncherInfo::Parse(*other);
      if (info.ok()) first = info->host;
    }
    std::string msg = absl::StrCat("two launchers claim to be ", self_.label, " (hosts ", first,
                                   " and ", self_.host,
                                   "): give each node its own --node_rank, 0..--nnodes-1");
    (void)store_->CompareSet(Key(attempt, "error"), "", msg);
    return absl::AlreadyExistsError(msg);
  }
  // Counted before the info is published: a launcher that reads our info (and may fail on it at
  // once) then also counts us among those whose exit node 0 waits for before its store goes.
  BRAID_RETURN_IF_ERROR(store_->Add(Key(attempt, "arrived"), 1).status());
  BRAID_RETURN_IF_ERROR(store_->Set(Key(attempt, absl::StrCat("info/", self_.id)), self_.Serialize()));
  // Launcher 0 first: everyone compares with it, so a disagreement is found even when one side
  // waits for launchers (ids) the other side does not know about.
  std::vector<int> order;
  for (int id = 0; id < self_.num_launchers; ++id) {
    if (id != self_.id) order.push_back(id);
  }
  while (true) {
    BRAID_ASSIGN_OR_RETURN(std::optional<std::string> error, TryGet(Key(attempt, "error")));
    if (error) return absl::FailedPreconditionError(*error);
    std::vector<int> missing;
    for (int id : order) {
      if (peers_.count(id)) continue;
      BRAID_ASSIGN_OR_RETURN(std::optional<std::string> raw, TryGet(Key(attempt, absl::StrCat("info/", id))));
      if (!raw) {
        missing.push_back(id);
        continue;
      }
      BRAID_ASSIGN_OR_RETURN(LauncherInfo info, LauncherInfo::Parse(*raw));
      BRAID_RETURN_IF_ERROR(Disagree(attempt, info));
      peers_[id] = info;
    }
    if (missing.empty()) return absl::OkStatus();
    if (cancelled && cancelled()) return absl::CancelledError("interrupted while waiting for the other nodes");
    if (attempt > 0 && silence != absl::InfiniteDuration()) {
      BRAID_ASSIGN_OR_RETURN(std::optional<LauncherInfo> gone, GoneBeforeCheckIn(attempt, previous, missing, silence));
      if (gone) {
        return absl::UnavailableError(absl::StrCat(
            gone->label, "'s launcher (host ", gone->host, ") stopped responding: no heartbeat for ",
            absl::FormatDuration(silence), " and it never checked in for restart ", attempt,
            "; stopping the job"));
      }
    }
    if (absl::Now() >= deadline) {
      std::vector<std::string> names;
      for (int id : missing) {
        names.push_back(self_.uniform ? absl::StrCat("node ", id) : absl::StrCat("rank ", id, "'s launcher"));
        if (names.size() == 8 && missing.size() > 8) {
          names.push_back(absl::StrCat("and ", missing.size() - 8, " more"));
          break;
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "only ", self_.num_launchers - static_cast<int>(missing.size()), " of ",
          self_.num_launchers, " launchers checked in within ", absl::FormatDuration(timeout),
          "; missing: ", absl::StrJoin(names, ", "),
          ". Start the launcher on every node with the same --nnodes, --master_addr, "
          "--master_port and BRAID_JOB_TOKEN (or raise --rdzv_timeout_s)"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::StatusOr<std::optional<LauncherInfo>> LauncherRendezvous::GoneBeforeCheckIn(
    int attempt, const std::map<int, LauncherInfo>& previous, const std::vector<int>& missing,
    absl::Duration silence) {
  // SilentLaunchers looks at peers_: here the previous attempt's, narrowed to the missing ones.
  std::map<int, LauncherInfo> arrived = std::move(peers_);
  peers_.clear();
  for (int id : missing) {
    auto it = previous.find(id);
    if (it != previous.end()) peers_[id] = it->second;
  }
  absl::StatusOr<std::vector<LauncherInfo>> silent = SilentLaunchers(attempt - 1, silence);
  peers_ = std::move(arrived);
  if (!silent.ok()) return silent.status();
  if (silent->empty()) return std::optional<LauncherInfo>();
  return std::optional<LauncherInfo>(silent->front());
}

// Stored as "R:" (restartable) or "F:" (final), then the message.
absl::Status LauncherRendezvous::ReportFailure(int attempt, const Failure& failure) {
  return store_->CompareSet(Key(attempt, "failed"), "",
                            absl::StrCat(failure.restartable ? "R:" : "F:", failure.message))
      .status();
}

absl::StatusOr<std::optional<LauncherRendezvous::Failure>> LauncherRendezvous::CheckFailure(
    int attempt) {
  BRAID_ASSIGN_OR_RETURN(std::optional<std::string> raw, TryGet(Key(attempt, "failed")));
  if (!raw) return std::optional<Failure>();
  Failure f;
  f.restartable = raw->rfind("R:", 0) == 0;
  f.message = raw->size() >= 2 ? raw->substr(2) : *raw;
  return std::optional<Failure>(f);
}

absl::StatusOr<int> LauncherRendezvous::CountArrived(int attempt) {
  BRAID_ASSIGN_OR_RETURN(int64_t n, store_->Add(Key(attempt, "arrived"), 0));
  return static_cast<int>(n);
}

absl::Status LauncherRendezvous::Heartbeat(int attempt) {
  return store_->Set(Key(attempt, absl::StrCat("beat/", self_.id)), std::to_string(++beat_count_));
}

absl::StatusOr<std::vector<LauncherInfo>> LauncherRendezvous::SilentLaunchers(int attempt,
                                                                              absl::Duration timeout) {
  if (beats_attempt_ != attempt) {
    beats_.clear();
    beats_attempt_ = attempt;
  }
  std::vector<LauncherInfo> silent;
  absl::Time now = absl::Now();
  for (const auto& [id, info] : peers_) {
    BRAID_ASSIGN_OR_RETURN(std::optional<std::string> v, TryGet(Key(attempt, absl::StrCat("beat/", id))));
    std::string value = v.value_or("");
    auto it = beats_.find(id);
    if (it == beats_.end() || it->second.value != value) {
      beats_[id] = {value, now};
    } else if (now - it->second.changed > timeout) {
      silent.push_back(info);
    }
  }
  return silent;
}

absl::StatusOr<int> LauncherRendezvous::ReportDone(int attempt) {
  return AddToCount(*store_, Key(attempt, "done"), 1);
}

absl::StatusOr<int> LauncherRendezvous::CountDone(int attempt) {
  return AddToCount(*store_, Key(attempt, "done"), 0);
}

absl::StatusOr<int> LauncherRendezvous::ReportExit(int attempt) {
  return AddToCount(*store_, Key(attempt, "exit"), 1);
}

absl::StatusOr<int> LauncherRendezvous::CountExit(int attempt) {
  return AddToCount(*store_, Key(attempt, "exit"), 0);
}

}  // namespace braid::launcher
