#include "launcher/node_launcher.h"

#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "launcher/run_folder.h"

namespace braid::launcher {
namespace {

// Exit codes of the launcher itself (a failed worker's own code is passed on, see
// WorkerFailure); kExitLauncherError is launcher_signals.h's.
constexpr int kExitJobFailed = 1;

bool IsIpLiteral(const std::string& a) {
  unsigned char buf[16];
  return inet_pton(AF_INET, a.c_str(), buf) == 1 || inet_pton(AF_INET6, a.c_str(), buf) == 1;
}

}  // namespace

// This launcher's view of the job (of the round, in an elastic job), for the check-in.
LauncherInfo Launcher::SelfInfo() const {
  LauncherInfo info;
  info.id = plan_.launcher_id;
  info.num_launchers = plan_.num_launchers;
  info.world_size = plan_.world_size;
  info.local_workers = static_cast<int>(plan_.workers.size());
  info.uniform = plan_.source == LayoutSource::kFlags || flags_.Given("nproc_per_node");
  info.max_restarts = flags_.max_restarts;
  info.label = Label();
  info.host = host_;
  info.layout = plan_.describe;
  info.run_id = plan_.run_id;
  return info;
}

void Launcher::ServeAndConnect() {
  if (plan_.launcher_id == 0) {
    TcpStoreServer::Options o;
    // An IP literal is this node's address: listen there only. A host name may resolve to a
    // loopback alias locally (Debian's 127.0.1.1) and to the real address elsewhere, so then
    // listen on every interface.
    o.host = IsIpLiteral(plan_.master_addr) ? plan_.master_addr : "0.0.0.0";
    // One launcher and no port asked for: a free port, so that several single-node jobs on
    // one machine never collide.
    o.port = plan_.num_launchers == 1 && !plan_.master_port_given ? 0 : plan_.master_port;
    o.token = token_;
    o.log = [](const std::string& m) { Say(m); };  // "braid store <addr>: ..."
    auto server = TcpStoreServer::Start(o);
    if (!server.ok()) {
      Die(absl::StrCat("node 0 cannot serve the rendezvous store at ", o.host, ":", o.port, ": ",
                       server.status().message(),
                       plan_.num_launchers == 1
                           ? " (or leave out --master_port and $MASTER_PORT: one node then picks "
                             "a free port)"
                           : ""));
    }
    server_ = std::move(*server);
    plan_.master_port = server_->port();
  }
  TcpStoreClient::Options c;
  c.host = plan_.launcher_id == 0 && plan_.master_addr == "0.0.0.0" ? "127.0.0.1" : plan_.master_addr;
  c.port = plan_.master_port;
  c.token = token_;
  c.connect_timeout = absl::Seconds(flags_.connect_timeout_s);
  // Nodes rarely start together: say what this one waits for (after 1 s, then every 30 s)
  // instead of staying silent up to the connect timeout.
  const absl::Time connecting = absl::Now();
  auto next_note = std::make_shared<absl::Time>(connecting + absl::Seconds(1));
  c.on_retry = [label = Label(), address = absl::StrCat(c.host, ":", c.port), connecting,
                next_note](int attempt, const std::string& error) {
    const absl::Time now = absl::Now();
    if (now < *next_note) return;
    *next_note = now + absl::Seconds(30);
    Say(absl::StrCat(label, " is waiting for the rendezvous store at ", address,
                     " (node 0's launcher serves it): ",
                     absl::FormatDuration(absl::Trunc(now - connecting, absl::Seconds(1))),
                     " so far, ", attempt, " attempt(s), last error: ", error));
  };
  auto client = WhileWatchingSignals<absl::StatusOr<std::unique_ptr<TcpStoreClient>>>(
      signals_, "connecting to the rendezvous store",
      [c] { return TcpStoreClient::Connect(c); });
  if (!client.ok()) {
    Die(absl::StrCat(Label(), " cannot use the rendezvous store at ", c.host, ":", c.port, ": ",
                     client.status().message()));
  }
  client_ = std::move(*client);
  rdzv_ = std::make_unique<LauncherRendezvous>(client_.get(), SelfInfo());
}

// Every launcher of the job proposes runs/<config>-<its start time>; the first proposal to reach
// node 0's store is everyone's (each node makes the folder under its own workspace). The store
// outlives restarts, and the folder is chosen once, so restarted workers append to the same files.
void Launcher::AgreeOnRunFolder() {
  if (!log_dir_.empty()) return;
  absl::StatusOr<std::string> agreed = client_->CompareSet("braid/run_folder", "", run_name_);
  if (!agreed.ok()) Die(absl::StrCat("agreeing on the run folder: ", agreed.status().message()));
  const std::string runs = Workspace().empty() ? "runs/" : Workspace() + "/runs/";
  log_dir_ = Absolute(ResolveUserPath(runs + *agreed));
  if (absl::Status st = MakeDirs(log_dir_); !st.ok()) Die(absl::StrCat("run folder: ", st.message()));
}

std::vector<WorkerSpec> Launcher::Specs(int attempt) const {
  EnvMap base = CurrentEnvironment();
  if (!Workspace().empty() && !base.count("BRAID_DATA_DIR")) base["BRAID_DATA_DIR"] = Workspace() + "/data";
  std::vector<WorkerSpec> specs;
  for (const WorkerPlan& w : plan_.workers) {
    WorkerSpec s;
    s.rank = w.rank;
    s.argv = argv_;
    s.env = base;
    for (auto& [k, v] : program_env_) s.env[k] = v;
    for (auto& [k, v] : WorkerEnvironment(plan_, w, token_, attempt)) s.env[k] = v;
    s.env[kRunDirEnv] = log_dir_;  // the trainer's metrics and train.log go here too
    if (flags_.Elastic()) s.env[kElasticEnv] = LaunchFlagValue(flags_, "nnodes");
    s.log_path = absl::StrCat(log_dir_, "/workerlog.", w.rank);
    s.append_log = attempt > 0;
    ConsoleChoice console = ConsoleFor(flags_.console, plan_.role, w.rank, w.local_rank);
    s.echo = console.echo;
    s.echo_prefix = console.prefix;
    // A terminal for rank 0 when we have one: the training program then draws its live
    // progress line, as when run on its own.
    s.echo_tty = s.echo && console.tty_ok && isatty(STDOUT_FILENO);
    specs.push_back(std::move(s));
  }
  return specs;
}

Outcome Launcher::WorkerFailure(const WorkerExit& e) const {
  Outcome o;
  o.kind = Outcome::kWorkerFailed;
  o.restartable = true;
  std::string log = absl::StrCat(log_dir_, "/workerlog.", e.rank);
  group_->DrainOutput();
  std::vector<std::string> tail = LastLines(log, flags_.tail_lines);
  o.message = absl::StrCat("rank ", e.rank, " (", Label(), ", host ", host_, ", pid ", e.pid, ") ",
                           DescribeWaitStatus(e.wait_status), ".");
  if (flags_.tail_lines > 0) {
    if (tail.empty()) {
      absl::StrAppend(&o.message, " Its log ", log, " is empty.");
    } else {
      absl::StrAppend(&o.message, " Last ", tail.size(), " line(s) of ", log, ":");
      for (std::string& line : tail) {
        if (line.size() > 400) line = line.substr(0, 400) + "...";
        absl::StrAppend(&o.message, "\n  | ", line);
      }
    }
  }
  o.exit_code = WIFEXITED(e.wait_status) ? WEXITSTATUS(e.wait_status) : 128 + WTERMSIG(e.wait_status);
  if (plan_.world_size > 1 || o.exit_code == 0) o.exit_code = kExitJobFailed;
  return o;
}

Outcome Launcher::RunAttempt(int attempt) {
  auto interrupted = [&] { return signals_.Poll() != 0 || signals_.first() != 0; };
  // On a restart, a launcher silent for longer than a living one can be (its heartbeat timeout,
  // plus stopping its workers) is gone: the job ends then, not after --rdzv_timeout_s.
  const absl::Duration silence = absl::Seconds(flags_.heartbeat_timeout_s + flags_.stop_grace_s + 5);
  if (absl::Status st = rdzv_->CheckIn(attempt, absl::Seconds(flags_.rdzv_timeout_s), interrupted, silence);
      !st.ok()) {
    Outcome o;
    if (signals_.first()) {
      o.kind = Outcome::kInterrupted;
      o.message = absl::StrCat("interrupted by ", SigName(signals_.first()),
                               " while waiting for the other nodes; no worker was started");
      o.exit_code = 128 + signals_.first();
    } else {
      o.kind = Outcome::kLauncherError;
      o.message = std::string(st.message());
      // A launcher gone during a restart fails the job that ran (1), as when it vanishes mid-run.
      o.exit_code = absl::IsUnavailable(st) ? kExitJobFailed : kExitLauncherError;
    }
    return o;
  }
  WorkerGroup group;
  group_ = &group;
  std::vector<WorkerSpec> specs = Specs(attempt);
  if (absl::Status st = group.Start(specs); !st.ok()) {
    Outcome o{Outcome::kLauncherError, std::string(st.message()), kExitLauncherError};
    (void)rdzv_->ReportFailure(attempt, {absl::StrCat(Label(), " could not start its workers: ", o.message), false});
    group_ = nullptr;
    return o;
  }
  if (plan_.world_size > 1) {
    const auto& w = plan_.workers;
    Say(absl::StrCat(Label(), " (", host_, ") started ", w.size() == 1 ? "rank " : "ranks ",
                     w.front().rank, w.size() > 1 ? absl::StrCat("-", w.back().rank) : "", " of ",
                     plan_.world_size,
                     attempt > 0 ? absl::StrCat(elastic_ ? " (round " : " (restart ", attempt, ")") : "",
                     "; store ", plan_.master_addr, ":", plan_.master_port, "; logs in ", log_dir_));
  }

  std::optional<Outcome> outcome;
  bool reported_done = false, regroup = false, regroup_asked = false;
  absl::Time next_beat = absl::InfinitePast(), next_silence_check = absl::Now() + absl::Seconds(2);
  while (!outcome) {
    std::vector<WorkerExit> exits = group.Poll(absl::Milliseconds(200), {signals_.fd()});
    if (int s = signals_.Poll()) {
      outcome = Outcome{Outcome::kInterrupted,
                        absl::StrCat(Label(), "'s launcher", elastic_ ? absl::StrCat(" (host ", host_, ")") : "",
                                     " received ", SigName(s),
                                     elastic_ && plan_.launcher_id != 0 ? "; it leaves the job" : "; stopping the job"),
                        128 + s};
      (void)rdzv_->ReportFailure(attempt, {outcome->message, false});
      break;
    }
    for (const WorkerExit& e : exits) {
      if (elastic_ && WIFEXITED(e.wait_status) && WEXITSTATUS(e.wait_status) == kExitRegroup) {
        regroup = true;  // stopped at a checkpoint, as asked: not a failure
      } else if (!e.ok() && !outcome) {
        outcome = WorkerFailure(e);
      }
    }
    if (outcome) {
      // The first report in the store wins; when another node's came first, it is the cause.
      (void)rdzv_->ReportFailure(attempt, {outcome->message, true});
      break;
    }
    // The job, as the other launchers see it. A store error means node 0 is gone.
    absl::StatusOr<std::optional<LauncherRendezvous::Failure>> failure = rdzv_->CheckFailure(attempt);
    if (!failure.ok()) {
      outcome = Outcome{Outcome::kStoreLost,
                        absl::StrCat(Label(), " lost the rendezvous store at ", plan_.master_addr,
                                     ":", plan_.master_port,
                                     " (node 0's launcher ended or the network failed): ",
                                     failure.status().message()),
                        kExitJobFailed};
      break;
    }
    if (*failure) {
      // Elastic: whatever ended the round (a node lost, interrupted, vanished), the next one
      // goes on without it.
      outcome = Outcome{Outcome::kRemoteFailed, (*failure)->message, kExitJobFailed,
                        (*failure)->restartable || elastic_ != nullptr};
      break;
    }
    absl::Time now = absl::Now();
    if (now >= next_beat) {
      (void)rdzv_->Heartbeat(attempt);
      next_beat = now + absl::Seconds(1);
    }
    if (plan_.launcher_id == 0 && now >= next_silence_check) {
      next_silence_check = now + absl::Seconds(1);
      auto silent = rdzv_->SilentLaunchers(attempt, absl::Seconds(flags_.heartbeat_timeout_s));
      if (silent.ok() && !silent->empty()) {
        const LauncherInfo& s = silent->front();
        vanished_ = static_cast<int>(silent->size());
        outcome = Outcome{Outcome::kRemoteFailed,
                          absl::StrCat(s.label, "'s launcher (host ", s.host,
                                       ") stopped responding: no heartbeat for ",
                                       flags_.heartbeat_timeout_s, " s", elastic_ ? "" : "; stopping the job"),
                          kExitJobFailed};
        (void)rdzv_->ReportFailure(attempt, {outcome->message, false});
        break;
      }
    }
    if (elastic_ && plan_.launcher_id == 0 && !regroup_asked) {
      // A node waits to join: ask the training program to stop at its next checkpoint.
      auto waiting = elastic_->Waiting(attempt + 1, round_members_);
      if (waiting.ok() && waiting->has_value()) {
        regroup_asked = true;
        Say(absl::StrCat(**waiting, " waits to join; the group regroups at its next checkpoint"));
        (void)client_->Set(RegroupKey(attempt), **waiting);
      }
    }
    if (regroup && group.running() == 0) {
      outcome = Outcome{Outcome::kRegroup, "the workers stopped at a checkpoint to regroup", 0, true};
      break;
    }
    if (group.running() == 0) {
      // Every local worker finished well; the job is done when every node's are.
      if (!reported_done) {
        auto n = rdzv_->ReportDone(attempt);
        reported_done = n.ok();
      }
      auto done = rdzv_->CountDone(attempt);
      if (done.ok() && *done >= plan_.num_launchers) outcome = Outcome{};
    }
  }

  {
    // Also after a success: nothing a worker left running survives the job.
    int sig = outcome->kind == Outcome::kInterrupted ? signals_.first() : SIGTERM;
    if (sig == SIGHUP) sig = SIGTERM;
    group.Stop(sig, absl::Seconds(flags_.stop_grace_s), [&] {
      signals_.Poll();
      return signals_.count() > 1;  // a second Ctrl-C: no more waiting
    });
    group.Poll(absl::ZeroDuration());
  }
  if (outcome->kind == Outcome::kWorkerFailed || outcome->kind == Outcome::kInterrupted) {
    // Several nodes can fail at once; the store's first report is the job's cause.
    auto first = rdzv_->CheckFailure(attempt);
    if (first.ok() && *first && (*first)->message != outcome->message) {
      outcome->message = absl::StrCat((*first)->message, "\n(then, on ", Label(), ": ",
                                      outcome->message.substr(0, outcome->message.find('\n')), ")");
      outcome->restartable = outcome->restartable && (*first)->restartable;
    }
  }
  group_ = nullptr;
  return *outcome;
}

int Launcher::Finish(const Outcome& o, int attempt) {
  switch (o.kind) {
    case Outcome::kSuccess:
      break;
    case Outcome::kWorkerFailed:
      Say(absl::StrCat(o.message, "\nStopped the other workers", plan_.num_launchers > 1 ? " on every node" : "",
                       "; logs in ", log_dir_, "."));
      break;
    case Outcome::kRemoteFailed:
    case Outcome::kStoreLost:
      Say(absl::StrCat(o.message, "\n", Label(), " stopped its workers; its logs are in ", log_dir_, "."));
      break;
    case Outcome::kInterrupted:
    case Outcome::kLauncherError:
    case Outcome::kRegroup:
      Say(o.message);
      break;
  }
  // Node 0 keeps the store up until every launcher that checked in has read the outcome
  // (bounded: a launcher may be gone).
  (void)rdzv_->ReportExit(attempt);
  if (server_) {
    absl::Time deadline = absl::Now() + absl::Seconds(o.kind == Outcome::kSuccess ? 10 : 5);
    while (absl::Now() < deadline) {
      auto n = rdzv_->CountExit(attempt);
      auto arrived = rdzv_->CountArrived(attempt);
      if (!n.ok() || !arrived.ok() || *n >= *arrived - vanished_) break;
      if (signals_.Poll()) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  client_.reset();
  if (server_) server_->Stop();
  return o.exit_code;
}

int Launcher::Run() {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  ServeAndConnect();
  AgreeOnRunFolder();
  if (flags_.Elastic()) return RunElastic();
  for (int attempt = 0;; ++attempt) {
    Outcome o = RunAttempt(attempt);
    bool retry = o.restartable && attempt < flags_.max_restarts && !signals_.first();
    if (!retry) return Finish(o, attempt);
    Say(absl::StrCat(o.message, "\nRestarting the worker group (restart ", attempt + 1, " of --max_restarts=",
                     flags_.max_restarts, ")."));
    MarkLogs(absl::StrFormat("restart %d of %d", attempt + 1, flags_.max_restarts));
  }
}

// Rounds: join, wait for node 0's decision, run the worker group at the round's size, and go on
// to the next round when it ends by a failure, a lost node or a node waiting to join.
int Launcher::RunElastic() {
  const LaunchPlan base = plan_;
  RoundRules rules{flags_.nnodes_min, flags_.nnodes, absl::Seconds(flags_.rdzv_last_call_s),
                   absl::Seconds(flags_.rdzv_timeout_s)};
  ElasticRendezvous elastic(client_.get(), flags_.node_rank, host_, rules, flags_.max_restarts);
  elastic_ = &elastic;
  PreviousRound previous;
  auto lost_store = [&](const absl::Status& st) {
    Say(absl::StrCat(Label(), " lost the rendezvous store at ", base.master_addr, ":", base.master_port,
                     " (node 0's launcher ended or the network failed): ", st.message()));
    return kExitJobFailed;
  };
  for (int round = 0;; ++round) {
    absl::StatusOr<int> joined = elastic.Join(round);
    if (!joined.ok()) return lost_store(joined.status());
    round = *joined;
    absl::StatusOr<std::optional<RoundResult>> result = elastic.Await(round, previous, [&] {
      pollfd p = {signals_.fd(), POLLIN, 0};
      poll(&p, 1, 50);
      return signals_.Poll() != 0;
    });
    if (!result.ok()) return lost_store(result.status());
    if (!*result) {
      Say(absl::StrCat("interrupted by ", SigName(signals_.first()), " while waiting to join round ", round));
      return 128 + signals_.first();
    }
    if (!(*result)->error.empty()) {
      Say((*result)->error);
      return kExitJobFailed;
    }
    const int rank = (*result)->RankOf(flags_.node_rank);
    if (rank < 0) {
      Say(absl::StrCat(Label(), " came after round ", round, " closed; it waits for the next one"));
      continue;
    }
    plan_ = PlanForRound(base, flags_, round, rank, static_cast<int>((*result)->members.size()));
    round_members_ = (*result)->members;
    Say(absl::StrCat((*result)->note, " (world size ", plan_.world_size, ")"));
    rdzv_ = std::make_unique<LauncherRendezvous>(client_.get(), SelfInfo());
    if (round > 0) MarkLogs(absl::StrFormat("round %d, %d node(s)", round, plan_.nnodes));
    Outcome o = RunAttempt(round);
    const bool go_on = o.kind == Outcome::kRegroup ||
                       (o.restartable && (o.kind == Outcome::kWorkerFailed || o.kind == Outcome::kRemoteFailed));
    if (!go_on || signals_.first()) return Finish(o, round);
    // Its cause in one line: the first line, without the log tail's heading.
    std::string why = o.message.substr(0, o.message.find('\n'));
    why = why.substr(0, why.find(" Last "));
    previous = {o.kind != Outcome::kRegroup, why};
    if (o.kind != Outcome::kRegroup) Say(absl::StrCat(o.message, "\n", Label(), " stopped its workers; regrouping"));
    (void)rdzv_->ReportExit(round);
  }
}

// A node of a hostfile job reads its standard input from the launcher on the first host (through
// ssh). End-of-file means that launcher is stopping the job (Ctrl-C there, another node failed),

}  // namespace braid::launcher
