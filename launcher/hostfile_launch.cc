#include "launcher/hostfile_launch.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "launcher/job_token.h"
#include "launcher/launch_plan.h"
#include "launcher/programs.h"
#include "launcher/worker_group.h"
#include "backends/store/tcp_store.h"

namespace braid::launcher {
namespace {

void Say(const std::string& msg) {
  std::fprintf(stderr, "braid launcher: %s\n", msg.c_str());
  std::fflush(stderr);
}

// Flags that the hostfile launcher decides for every node, or that only it reads.
const std::set<std::string>& NotPassedOn() {
  static const std::set<std::string> k = {
      "hostfile", "include",  "exclude",       "ssh_port", "nnodes",         "node_rank",
      "nproc_per_node", "master_addr", "master_port", "rdzv_endpoint", "standalone",
      "job_token_file", "dry_run", "help", "scheduler", "watch_stdin"};
  return k;
}

// Variables a remote launcher needs from here (ssh passes none on by itself).
bool PassedOnVariable(const std::string& name) {
  if (name == "BRAID_JOB_TOKEN" || name == "BRAID_SSH_OPTIONS") return false;
  return absl::StartsWith(name, "BRAID_") || absl::StartsWith(name, "NCCL_") ||
         name == "OMP_NUM_THREADS" || name == "OPENBLAS_NUM_THREADS" ||
         name == "BUILD_WORKSPACE_DIRECTORY";
}

bool DefaultSlots(const HostSlots& h) {
  for (size_t i = 0; i < h.slots.size(); ++i) {
    if (h.slots[i] != static_cast<int>(i)) return false;
  }
  return true;
}

}  // namespace

std::string ShellQuote(const std::string& w) {
  const bool plain = !w.empty() && w.find_first_not_of(
                                       "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                       "0123456789_-+=/.,:@%") == std::string::npos;
  if (plain) return w;
  std::string out = "'";
  for (char c : w) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

absl::StatusOr<HostfileNodes> HostfileNodesFor(const LaunchFlags& f) {
  auto refuse = [](const std::string& flag, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " does not go with --hostfile: ", why));
  };
  if (f.Given("node_rank")) return refuse("--node_rank", "the node ranks follow the hostfile's order");
  if (f.standalone) return refuse("--standalone", "a hostfile job runs on the hosts it lists");
  if (f.scheduler != SchedulerMode::kAuto && f.scheduler != SchedulerMode::kNone) {
    return refuse("--scheduler", "the hostfile says where the nodes are");
  }
  if (!f.nproc_per_node_kind.empty()) {
    return refuse(absl::StrCat("--nproc_per_node=", f.nproc_per_node_kind),
                  "each host's slots say how many workers it runs; give a number (the first "
                  "slots of each host), or leave it out");
  }
  if (f.watch_stdin) return refuse("--watch_stdin", "it is what the hostfile launcher gives its nodes");
  absl::StatusOr<std::vector<HostSlots>> hosts = ReadHostfile(f.hostfile);
  if (!hosts.ok()) return hosts.status();
  absl::StatusOr<std::vector<HostSlots>> chosen = FilterHosts(*hosts, f.include, f.exclude);
  if (!chosen.ok()) return chosen.status();
  return SelectNodes(*std::move(chosen), f.Given("nnodes") ? f.nnodes : 0,
                     f.Given("nproc_per_node") ? f.nproc_per_node : 0);
}

absl::StatusOr<std::vector<NodeStart>> PlanHostfileNodes(const LaunchFlags& f,
                                                         const HostfileNodes& nodes,
                                                         const HostfileContext& ctx) {
  const int nnodes = static_cast<int>(nodes.nodes.size());
  const std::string master_addr = f.master_addr.empty() ? nodes.nodes.front().host : f.master_addr;
  const int master_port = f.master_port > 0 ? f.master_port : 29500;
  // The user's flags, in a fixed order, then the program's arguments.
  std::vector<std::string> passed_on;
  for (const auto& [name, value] : f.command_line) {
    if (!NotPassedOn().count(name)) passed_on.push_back(absl::StrCat("--", name, "=", value));
  }
  std::vector<std::string> env_words;  // K=V for the remote launchers
  for (const auto& [k, v] : ctx.env) {
    if (PassedOnVariable(k)) env_words.push_back(absl::StrCat(k, "=", v));
  }
  std::vector<std::string> ssh = {ctx.ssh, "-T", "-o", "BatchMode=yes"};
  if (f.ssh_port > 0) {
    ssh.push_back("-p");
    ssh.push_back(std::to_string(f.ssh_port));
  }
  if (auto it = ctx.env.find("BRAID_SSH_OPTIONS"); it != ctx.env.end()) {
    for (absl::string_view o : absl::StrSplit(it->second, absl::ByAnyChar(" \t"), absl::SkipEmpty())) {
      ssh.emplace_back(o);
    }
  }

  std::vector<NodeStart> out;
  for (int rank = 0; rank < nnodes; ++rank) {
    const HostSlots& h = nodes.nodes[rank];
    std::vector<std::string> launcher = {
        ctx.launcher_path,
        absl::StrCat("--nnodes=", nnodes),
        absl::StrCat("--node_rank=", rank),
        absl::StrCat("--nproc_per_node=", nodes.nproc_per_node),
        absl::StrCat("--master_addr=", master_addr),
        absl::StrCat("--master_port=", master_port),
        "--scheduler=none",  // the hostfile's layout, whatever this machine's environment says
        "--job_token_file=-",
        "--watch_stdin",
    };
    launcher.insert(launcher.end(), passed_on.begin(), passed_on.end());
    launcher.push_back("--");
    launcher.insert(launcher.end(), f.program_args.begin(), f.program_args.end());
    // DeepSpeed's slots are device indices: the chosen ones become the node's visible devices.
    std::optional<std::string> devices;
    if (!DefaultSlots(h)) devices = absl::StrJoin(h.slots, ",");

    NodeStart n;
    n.node_rank = rank;
    n.host = h.host;
    n.local = rank == 0;
    if (n.local) {
      n.argv = std::move(launcher);
      if (devices) n.env_overrides["CUDA_VISIBLE_DEVICES"] = *devices;
    } else {
      std::vector<std::string> words;
      for (const std::string& w : env_words) words.push_back(ShellQuote(w));
      if (devices) words.push_back(ShellQuote("CUDA_VISIBLE_DEVICES=" + *devices));
      for (const std::string& w : launcher) words.push_back(ShellQuote(w));
      std::string command = absl::StrCat("cd ", ShellQuote(ctx.cwd), " && exec ",
                                         env_words.empty() && !devices ? "" : "env ",
                                         absl::StrJoin(words, " "));
      n.argv = ssh;
      n.argv.push_back(h.host);
      n.argv.push_back(command);
    }
    out.push_back(std::move(n));
  }
  return out;
}

std::string DescribeHostfileNodes(const std::vector<NodeStart>& nodes) {
  std::string out;
  for (const NodeStart& n : nodes) {
    std::vector<std::string> words;
    for (const std::string& w : n.argv) words.push_back(ShellQuote(w));
    absl::StrAppend(&out, "node ", n.node_rank, " on ", n.host, n.local ? " (here)" : " (ssh)", ": ");
    for (const auto& [k, v] : n.env_overrides) absl::StrAppend(&out, k, "=", ShellQuote(v), " ");
    absl::StrAppend(&out, absl::StrJoin(words, " "), "\n");
  }
  return out;
}

int RunHostfileNodes(const std::vector<NodeStart>& nodes, const std::string& token,
                     const std::map<std::string, std::string>& env, double stop_grace_s) {
  // Adopt what a node's launcher leaves behind, so that nothing outlives the job here.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old;
    if (sigaction(s, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;  // nohup
    sigaddset(&set, s);
  }
  sigprocmask(SIG_BLOCK, &set, nullptr);
  const int sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sigfd < 0) {
    Say(absl::StrCat("signalfd: ", std::strerror(errno)));
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);

  std::vector<WorkerSpec> specs;
  for (const NodeStart& n : nodes) {
    WorkerSpec s;
    s.rank = n.node_rank;
    s.argv = n.argv;
    s.env = env;
    for (const auto& [k, v] : n.env_overrides) s.env[k] = v;
    s.log_path = "/dev/null";  // each node's launcher keeps its workers' logs on its host
    s.echo = true;
    s.echo_prefix = n.host + ": ";
    s.stdin_pipe = true;
    s.stdin_text = token + "\n";
    specs.push_back(std::move(s));
  }
  WorkerGroup group;
  if (absl::Status st = group.Start(specs); !st.ok()) {
    Say(absl::StrCat("cannot start the nodes: ", st.message()));
    return 2;
  }
  std::vector<std::string> where;
  for (const NodeStart& n : nodes) {
    where.push_back(absl::StrCat("node ", n.node_rank, " on ", n.host, n.local ? " (here)" : " (ssh)"));
  }
  Say(absl::StrCat("hostfile job of ", nodes.size(), " node(s): ", absl::StrJoin(where, ", ")));

  const absl::Duration grace = absl::Seconds(stop_grace_s);
  std::optional<absl::Time> deadline;  // when the nodes still running are stopped by force
  int signal_seen = 0, signals = 0;
  bool stopping = false;  // the nodes' standard input is closed: they stop their jobs
  int failed = 0, failed_to_start = 0;
  auto stop_all = [&] {
    stopping = true;
    group.CloseStdin();
    deadline = absl::Now() + grace + absl::Seconds(10);
  };
  while (group.running() > 0) {
    std::vector<WorkerExit> exits = group.Poll(absl::Milliseconds(200), {sigfd});
    signalfd_siginfo info;
    while (read(sigfd, &info, sizeof info) == sizeof info) {
      const int s = static_cast<int>(info.ssi_signo);
      if (s == SIGCHLD) continue;
      ++signals;
      if (!signal_seen) {
        signal_seen = s;
        const char* abbrev = sigabbrev_np(s);
        Say(absl::StrCat("received SIG", abbrev ? abbrev : "?", "; stopping every node"));
        stop_all();
      }
    }
    for (const WorkerExit& e : exits) {
      const NodeStart& n = nodes[e.rank];
      if (e.ok()) {
        // Node 0 done: the others end within seconds (their launchers saw the outcome).
        if (n.node_rank == 0 && !deadline) deadline = absl::Now() + grace + absl::Seconds(15);
        continue;
      }
      ++failed;
      if (WIFEXITED(e.wait_status) && WEXITSTATUS(e.wait_status) == 2) ++failed_to_start;
      if (stopping) continue;
      std::string how = DescribeWaitStatus(e.wait_status);
      if (!n.local && WIFEXITED(e.wait_status) && WEXITSTATUS(e.wait_status) == 255) {
        absl::StrAppend(&how, " (ssh's code for a connection that failed or broke, or a remote "
                              "launcher killed by a signal)");
      }
      Say(absl::StrCat("node ", n.node_rank, " (host ", n.host, n.local ? ", here" : ", over ssh",
                       "): its launcher ", how, "; stopping every node"));
      stop_all();
    }
    if (signals > 1 || (deadline && absl::Now() >= *deadline)) {
      if (!stopping) {
        stop_all();  // node 0 ended well, but some node did not follow: close and wait once more
        continue;
      }
      std::vector<std::string> left;
      for (pid_t p : group.pids()) left.push_back(std::to_string(p));
      Say(absl::StrCat(signals > 1 ? "a second signal" : "nodes still running after the stop",
                       ": ending what is left (pids ", absl::StrJoin(left, ", "), ")"));
      group.Stop(SIGTERM, absl::Seconds(2));
      group.Poll(absl::ZeroDuration());
      break;
    }
  }
  group.DrainOutput();
  group.Stop(SIGTERM, absl::Seconds(2));  // anything a node's launcher left here
  close(sigfd);
  if (signal_seen) return 128 + signal_seen;
  if (failed == 0) return 0;
  return failed == failed_to_start ? 2 : 1;
}

int HostfileMain(const LaunchFlags& flags, const char* argv0) {
  absl::StatusOr<HostfileNodes> nodes = HostfileNodesFor(flags);
  if (!nodes.ok()) {
    Say(std::string(nodes.status().message()));
    return 2;
  }
  HostfileContext ctx;
  // The same launcher on every host (a shared or identical installation, as DeepSpeed assumes).
  if (std::strchr(argv0, '/')) {
    ctx.launcher_path = Absolute(argv0);
  } else {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    ctx.launcher_path = n > 0 ? std::string(buf, n) : argv0;
  }
  char cwd[4096];
  ctx.cwd = getcwd(cwd, sizeof cwd) ? cwd : ".";
  ctx.env = CurrentEnvironment();
  if (nodes->nodes.size() > 1) {
    absl::StatusOr<std::string> ssh = FindProgram("ssh");
    if (!ssh.ok()) {
      Say(absl::StrCat("--hostfile starts the other nodes with OpenSSH's ssh, which is not on "
                       "$PATH (Debian: apt-get install openssh-client): ", ssh.status().message()));
      return 2;
    }
    ctx.ssh = *ssh;
  }
  absl::StatusOr<std::vector<NodeStart>> starts = PlanHostfileNodes(flags, *nodes, ctx);
  if (!starts.ok()) {
    Say(std::string(starts.status().message()));
    return 2;
  }
  if (flags.dry_run) {
    std::printf("%s", DescribeHostfileNodes(*starts).c_str());
    return 0;
  }
  // The user's token, else a fresh one: every node gets it from here, so none is needed.
  const std::string& file = flags.job_token_file;
  absl::StatusOr<std::optional<std::string>> given = GivenJobToken(
      file.empty() || file == "-" ? file : ResolveUserPath(file), std::getenv("BRAID_JOB_TOKEN"));
  if (!given.ok()) {
    Say(std::string(given.status().message()));
    return 2;
  }
  std::string token;
  if (*given) {
    token = **given;
  } else {
    absl::StatusOr<std::string> fresh = GenerateJobToken();
    if (!fresh.ok()) {
      Say(absl::StrCat("cannot generate a job token: ", fresh.status().message()));
      return 2;
    }
    token = *fresh;
  }
  return RunHostfileNodes(*starts, token, ctx.env, flags.stop_grace_s);
}

}  // namespace braid::launcher
