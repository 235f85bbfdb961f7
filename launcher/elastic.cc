#include "launcher/elastic.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/check.h"

namespace braid::launcher {

RoundAdmission::Arrival RoundAdmission::Arrive(int node, absl::Time now) {
  if (std::find(nodes_.begin(), nodes_.end(), node) != nodes_.end()) return Arrival::kDuplicate;
  if (arrived() >= rules_.max_nodes) return Arrival::kFull;
  nodes_.push_back(node);
  if (!quorum_at_ && arrived() >= rules_.min_nodes) quorum_at_ = now;
  return Arrival::kAdmitted;
}

RoundAdmission::Decision RoundAdmission::Decide(absl::Time now) const {
  if (arrived() >= rules_.max_nodes) return Decision::kClose;
  if (quorum_at_) return now >= *quorum_at_ + rules_.last_call ? Decision::kClose : Decision::kWait;
  return now >= opened_ + rules_.timeout ? Decision::kTimeout : Decision::kWait;
}

absl::Time RoundAdmission::NextDeadline() const {
  return quorum_at_ ? *quorum_at_ + rules_.last_call : opened_ + rules_.timeout;
}

std::vector<int> RoundAdmission::Members() const {
  std::vector<int> m = nodes_;
  std::sort(m.begin(), m.end());
  return m;
}

int RoundResult::RankOf(int node) const {
  auto it = std::find(members.begin(), members.end(), node);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

// One fact per line; note and error are single lines (newlines are replaced when made).
std::string RoundResult::Serialize() const {
  return absl::StrCat("members=", absl::StrJoin(members, ","), "\nhosts=", absl::StrJoin(hosts, ","),
                      "\nnote=", note, "\nerror=", error);
}

absl::StatusOr<RoundResult> RoundResult::Parse(const std::string& s) {
  std::map<std::string, std::string> kv;
  for (absl::string_view line : absl::StrSplit(s, '\n')) {
    size_t eq = line.find('=');
    if (eq != absl::string_view::npos) kv[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  RoundResult r;
  for (absl::string_view m : absl::StrSplit(kv["members"], ',', absl::SkipEmpty())) {
    int id;
    if (!absl::SimpleAtoi(m, &id)) {
      return absl::DataLossError(absl::StrCat("unreadable elastic round record: '", s, "'"));
    }
    r.members.push_back(id);
  }
  r.hosts = absl::StrSplit(kv["hosts"], ',', absl::SkipEmpty());
  r.note = kv["note"];
  r.error = kv["error"];
  if (r.hosts.size() != r.members.size()) {
    return absl::DataLossError(absl::StrCat("unreadable elastic round record: '", s, "'"));
  }
  return r;
}

absl::Status CheckElasticLayout(const LaunchFlags& f, const LaunchPlan& plan) {
  if (!f.Elastic()) return absl::OkStatus();
  if (plan.source != LayoutSource::kFlags) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.Origin("nnodes"), "=", f.nnodes_min, ":", f.nnodes, " (elastic) needs one launcher per node "
        "started with --node_rank and --nproc_per_node, but the layout comes from ",
        LayoutSourceName(plan.source), ", which fixes the number of processes: give a fixed --nnodes "
        "there"));
  }
  return absl::OkStatus();
}

LaunchPlan PlanForRound(const LaunchPlan& base, const LaunchFlags& f, int round, int rank, int nodes) {
  LaunchPlan p = base;
  p.nnodes = p.num_launchers = nodes;
  p.node_rank = p.launcher_id = rank;
  p.world_size = nodes * p.local_world_size;
  p.workers.clear();
  for (int i = 0; i < p.local_world_size; ++i) p.workers.push_back({rank * p.local_world_size + i, i});
  p.describe = absl::StrCat(f.Origin("nnodes"), "=", f.nnodes_min, ":", f.nnodes, " (round ", round,
                            ": ", nodes, ") ", f.Origin("nproc_per_node"), "=", p.local_world_size);
  return p;
}

std::string NodeName(int node, const std::string& host) {
  return absl::StrCat("node ", node, " (host ", host, ")");
}

std::string ElasticRendezvous::Key(int round, const std::string& name) const {
  return absl::StrCat("braid.launcher/elastic/", round, "/", name);
}


namespace {

absl::StatusOr<std::optional<std::string>> TryGet(Store* store, const std::string& key) {
  absl::StatusOr<std::string> v = store->Get(key, absl::Milliseconds(1));
  if (v.ok()) return std::optional<std::string>(*v);
  if (absl::IsDeadlineExceeded(v.status()) || absl::IsNotFound(v.status())) return std::optional<std::string>();
  return v.status();
}

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string Names(const std::vector<int>& ids, const std::map<int, std::string>& hosts) {
  std::vector<std::string> names;
  for (int id : ids) names.push_back(NodeName(id, hosts.count(id) ? hosts.at(id) : "?"));
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::StatusOr<int> ElasticRendezvous::Join(int at_least) {
  BRAID_ASSIGN_OR_RETURN(std::optional<std::string> latest, TryGet(store_, "braid.launcher/elastic/latest"));
  int round = at_least;
  if (int l; latest && absl::SimpleAtoi(*latest, &l)) round = std::max(round, l + 1);
  BRAID_ASSIGN_OR_RETURN(int64_t k, store_->Add(Key(round, "joined"), 1));
  BRAID_RETURN_IF_ERROR(store_->Set(Key(round, absl::StrCat("joiner/", k - 1)), absl::StrCat(node_, "\n", host_)));
  return round;
}

absl::StatusOr<std::optional<RoundResult>> ElasticRendezvous::Result(int round) {
  BRAID_ASSIGN_OR_RETURN(std::optional<std::string> raw, TryGet(store_, Key(round, "result")));
  if (!raw) return std::optional<RoundResult>();
  BRAID_ASSIGN_OR_RETURN(RoundResult r, RoundResult::Parse(*raw));
  return std::optional<RoundResult>(std::move(r));
}

absl::StatusOr<std::optional<RoundResult>> ElasticRendezvous::Await(int round, const PreviousRound& previous,
                                                                    const std::function<bool()>& pause) {
  while (true) {
    if (node_ == 0) BRAID_RETURN_IF_ERROR(Coordinate(round, previous));
    BRAID_ASSIGN_OR_RETURN(std::optional<RoundResult> result, Result(round));
    if (result || pause()) return result;
  }
}

absl::StatusOr<std::optional<std::string>> ElasticRendezvous::Waiting(int round,
                                                                      const std::vector<int>& members) {
  BRAID_ASSIGN_OR_RETURN(int64_t n, store_->Add(Key(round, "joined"), 0));
  for (int64_t k = 0; k < n; ++k) {
    BRAID_ASSIGN_OR_RETURN(std::optional<std::string> raw, TryGet(store_, Key(round, absl::StrCat("joiner/", k))));
    if (!raw) continue;
    std::vector<std::string> parts = absl::StrSplit(*raw, '\n');
    int id = -1;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &id)) continue;
    if (std::find(members.begin(), members.end(), id) == members.end()) {
      return std::optional<std::string>(NodeName(id, parts[1]));
    }
  }
  return std::optional<std::string>();
}

absl::Status ElasticRendezvous::Coordinate(int round, const PreviousRound& previous) {
  if (node_ != 0) return absl::FailedPreconditionError("only node 0 decides the rounds");
  const absl::Time now = now_();
  if (coordinating_ != round) {
    coordinating_ = round;
    admission_.emplace(rules_, now);
    hosts_by_arrival_.clear();
    seen_ = 0;
  }
  BRAID_ASSIGN_OR_RETURN(std::optional<std::string> done, TryGet(store_, Key(round, "result")));
  if (done) return absl::OkStatus();
  RoundResult result;
  std::map<int, std::string> hosts;  // of this round's arrivals and the previous round's members
  if (last_) {
    for (size_t i = 0; i < last_->members.size(); ++i) hosts[last_->members[i]] = last_->hosts[i];
  }
  BRAID_ASSIGN_OR_RETURN(int64_t joined, store_->Add(Key(round, "joined"), 0));
  for (; seen_ < joined; ++seen_) {
    BRAID_ASSIGN_OR_RETURN(std::optional<std::string> raw, TryGet(store_, Key(round, absl::StrCat("joiner/", seen_))));
    if (!raw) break;  // counted but not yet written: read it on the next call
    std::vector<std::string> parts = absl::StrSplit(*raw, '\n');
    int id = -1;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &id)) {
      return absl::DataLossError(absl::StrCat("unreadable elastic join record: '", *raw, "'"));
    }
    switch (admission_->Arrive(id, now)) {
      case RoundAdmission::Arrival::kAdmitted:
        hosts_by_arrival_.push_back(absl::StrCat(id, "=", parts[1]));
        break;
      case RoundAdmission::Arrival::kFull:  // it joins the next round by itself
        break;
      case RoundAdmission::Arrival::kDuplicate: {
        std::string first = "?";
        for (const std::string& h : hosts_by_arrival_) {
          if (absl::StartsWith(h, absl::StrCat(id, "="))) first = h.substr(h.find('=') + 1);
        }
        result.error = absl::StrCat("two launchers claim to be node ", id, " (hosts ", first, " and ",
                                    parts[1], "): give each node its own --node_rank, 0..MAX-1");
        break;
      }
    }
    if (!result.error.empty()) break;
  }
  for (const std::string& h : hosts_by_arrival_) {
    hosts[std::stoi(h.substr(0, h.find('=')))] = h.substr(h.find('=') + 1);
  }
  if (result.error.empty()) {
    switch (admission_->Decide(now)) {
      case RoundAdmission::Decision::kWait:
        return absl::OkStatus();
      case RoundAdmission::Decision::kTimeout:
        result.error = absl::StrCat(
            "only ", admission_->arrived(), " node(s) (", Names(admission_->Members(), hosts),
            ") joined round ", round, " within ", absl::FormatDuration(rules_.timeout), "; --nnodes=",
            rules_.min_nodes, ":", rules_.max_nodes, " needs at least ", rules_.min_nodes,
            ". Start the launchers of the other nodes (or raise --rdzv_timeout_s)");
        break;
      case RoundAdmission::Decision::kClose:
        break;
    }
  }
  if (result.error.empty()) {
    result.members = admission_->Members();
    for (int id : result.members) result.hosts.push_back(hosts[id]);
    std::string from = "the start";
    BRAID_ASSIGN_OR_RETURN(std::optional<std::string> step, TryGet(store_, CheckpointStepKey()));
    if (step) from = absl::StrCat("the checkpoint of step ", *step);
    const std::string with = absl::StrCat("; continuing with ", result.members.size(), " node(s) from ", from);
    if (!last_) {
      result.note = absl::StrCat("round ", round, ": starting with ", result.members.size(), " node(s): ",
                                 Names(result.members, hosts));
    } else {
      std::vector<int> lost, came;
      for (int id : last_->members) {
        if (result.RankOf(id) < 0) lost.push_back(id);
      }
      for (int id : result.members) {
        if (last_->RankOf(id) < 0) came.push_back(id);
      }
      std::vector<std::string> what;
      if (!lost.empty()) {
        what.push_back(absl::StrCat(Names(lost, hosts), " lost (not back within --rdzv_last_call_s after: ",
                                    previous.why, ")"));
      }
      if (!came.empty()) what.push_back(absl::StrCat(Names(came, hosts), " joined"));
      if (previous.failed && lost.empty()) {
        ++failures_;
        if (failures_ > max_restarts_) {
          result.error = absl::StrCat(previous.why, "; no node was lost and the worker group has failed ",
                                      failures_, " time(s) (--max_restarts=", max_restarts_, "): stopping");
        }
        what.push_back(absl::StrCat("restart ", failures_, " of --max_restarts=", max_restarts_,
                                    " after: ", previous.why));
      }
      if (what.empty()) what.push_back(absl::StrCat("regrouped (", previous.why, ")"));
      result.note = absl::StrCat("round ", round, ": ", absl::StrJoin(what, "; "), with);
    }
  }
  result.note = OneLine(result.note);
  result.error = OneLine(result.error);
  BRAID_RETURN_IF_ERROR(store_->CompareSet(Key(round, "result"), "", result.Serialize()).status());
  BRAID_RETURN_IF_ERROR(store_->Set("braid.launcher/elastic/latest", absl::StrCat(round)));
  if (result.error.empty()) last_ = result;
  return absl::OkStatus();
}

}  // namespace braid::launcher
