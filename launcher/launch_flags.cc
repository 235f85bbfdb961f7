#include "launcher/launch_flags.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/edit_distance.h"
#include "launcher/launch_flag_values.h"

namespace braid::launcher {

bool LaunchFlags::Given(const std::string& name) const {
  return std::find(given.begin(), given.end(), name) != given.end();
}

std::string LaunchFlags::Origin(const std::string& name) const {
  auto it = origin.find(name);
  return it == origin.end() ? absl::StrCat("--", name) : it->second;
}

namespace {

// The launcher's flags. Bool flags take no value ("--standalone"), or "=true"/"=false".
struct FlagInfo {
  const char* name;
  bool is_bool;
};
constexpr FlagInfo kLauncherFlags[] = {
    {"nnodes", false},          {"node_rank", false},       {"nproc_per_node", false},
    {"master_addr", false},     {"master_port", false},     {"rdzv_endpoint", false},
    {"rdzv_backend", false},    {"rdzv_id", false},         {"standalone", true},
    {"role", false},            {"log_dir", false},         {"max_restarts", false},
    {"program", false},         {"scheduler", false},       {"job_token_file", false},
    {"connect_timeout_s", false}, {"rdzv_timeout_s", false}, {"stop_grace_s", false},
    {"heartbeat_timeout_s", false}, {"tail_lines", false},  {"redirects", false},
    {"tee", false},             {"local_ranks_filter", false}, {"monitor_interval", false},
    {"start_method", false},    {"no_python", true},        {"no_local_rank", true},
    {"dry_run", true},          {"help", true},             {"hostfile", false},
    {"include", false},         {"exclude", false},         {"ssh_port", false},
    {"watch_stdin", true},      {"rdzv_last_call_s", false},
};

const FlagInfo* FindLauncherFlag(const std::string& name) {
  for (const FlagInfo& f : kLauncherFlags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// The training program's flags (launcher/train_main.cc), accepted before "--" so that the
// commands in the README keep working; print_config is its only bool.
bool IsTrainingProgramBool(const std::string& name) { return name == "print_config"; }

// torchrun and DeepSpeed flags the launcher knows but refuses, each with what to do instead.
std::string Refusal(const std::string& name) {
  static const std::map<std::string, std::string> kWhy = {
      {"rdzv_conf", "Braid's rendezvous takes no options; its timeouts are --connect_timeout_s "
                    "and --rdzv_timeout_s"},
      {"local_addr", "a Braid launcher needs no address of its own: every node reaches node 0's "
                     "store at --master_addr"},
      {"module", "Braid starts an executable, not a Python module: name it with --program=PATH "
                 "or as the first argument"},
      {"run_path", "Braid starts an executable, not a Python script: name it with --program=PATH "
                   "or as the first argument"},
      {"logs_specs", "Braid's worker logs are <--log_dir>/workerlog.<rank>"},
      {"numa_binding", "Braid does not bind workers to NUMA nodes: use numactl in the program's "
                       "command or the scheduler's binding"},
      {"event_log_handler", "Braid's launcher has no event log"},
      {"signals_to_handle", "Braid's launcher forwards SIGINT, SIGTERM and SIGHUP to the workers"},
      {"virtual_local_rank", "Braid gives every worker its own LOCAL_RANK"},
      {"max_nodes", "give the bounds of an elastic job as --nnodes=MIN:MAX"},
      {"launcher", "DeepSpeed's --launcher (pdsh, openmpi, slurm) has no Braid equivalent: "
                   "--hostfile starts the nodes over OpenSSH; or run Braid's launcher under "
                   "srun or mpirun (docs/LAUNCHING.md)"},
      {"force_multi", "Braid's launcher needs no flag to run several nodes"},
  };
  auto it = kWhy.find(name);
  return it == kWhy.end() ? "" : it->second;
}

// Other launchers' names for Braid's flags: the "did you mean" for a command copied from them.
std::string ForeignName(const std::string& name) {
  static const std::map<std::string, std::string> kSame = {
      {"num_gpus", "nproc_per_node"},     {"num_nodes", "nnodes"},
      {"num_processes", "nproc_per_node"}, {"num_machines", "nnodes"},
      {"machine_rank", "node_rank"},      {"main_process_ip", "master_addr"},
      {"main_process_port", "master_port"}, {"nproc", "nproc_per_node"},
      {"master_ip", "master_addr"},       {"rank", "node_rank"},
  };
  auto it = kSame.find(name);
  return it == kSame.end() ? "" : it->second;
}

// The closest known flag, if one is close enough to be a typo; "" otherwise.
std::string Suggest(const std::string& name) {
  if (std::string f = ForeignName(name); !f.empty()) return f;
  std::vector<std::string> names;
  for (const FlagInfo& f : kLauncherFlags) names.push_back(f.name);
  for (const std::string& t : TrainingProgramFlags()) names.push_back(t);
  std::string best;
  size_t best_d = std::string::npos;
  for (const std::string& n : names) {
    size_t d = EditDistance(name, n, /*ignore_case=*/false, best_d);
    if (d < best_d) best_d = d, best = n;
  }
  if (best_d <= 2 || best_d * 3 <= name.size()) return best;
  // An abbreviation of exactly one flag ("--nproc_per" for --nproc_per_node).
  std::string prefix_of;
  for (const std::string& n : names) {
    if (name.size() >= 3 && absl::StartsWith(n, name)) {
      if (!prefix_of.empty()) return "";
      prefix_of = n;
    }
  }
  return prefix_of;
}


void MarkGiven(LaunchFlags* f, const std::string& name, const std::string& origin) {
  if (!f->Given(name)) f->given.push_back(name);
  f->origin[name] = origin;
}

// master_addr and master_port can come from two flags (--master_addr, --rdzv_endpoint): the
// second source must agree with the first.
absl::Status SetMaster(LaunchFlags* f, const std::string& addr, int port, const std::string& origin,
                       const std::string& shown) {
  if (!addr.empty()) {
    if (f->Given("master_addr") && f->Origin("master_addr") != origin && f->master_addr != addr) {
      return absl::InvalidArgumentError(absl::StrCat(f->Origin("master_addr"), "=", f->master_addr,
                                                     " disagrees with ", origin, "=", shown,
                                                     "; give node 0's address once"));
    }
    f->master_addr = addr;
    MarkGiven(f, "master_addr", origin);
  }
  if (port != 0) {
    if (f->Given("master_port") && f->Origin("master_port") != origin && f->master_port != port) {
      return absl::InvalidArgumentError(absl::StrCat(f->Origin("master_port"), "=", f->master_port,
                                                     " disagrees with ", origin, "=", shown,
                                                     "; give the store's port once"));
    }
    f->master_port = port;
    MarkGiven(f, "master_port", origin);
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& TrainingProgramFlags() {
  static const std::vector<std::string> kFlags = {"config",    "steps",   "threads",     "strategy",
                                                  "init_from", "save_to", "print_config"};
  return kFlags;
}

absl::Status SetLaunchFlag(LaunchFlags* f, const std::string& name, const std::string& v,
                           const std::string& origin) {
  absl::Status st;
  if (name == "nnodes") {
    // N, or torchrun's elastic MIN:MAX (N:N is N): launcher/elastic.h.
    std::vector<std::string> r = absl::StrSplit(v, ':');
    int lo = 0, hi = 0;
    if (r.size() > 2) return BadValue(origin, v, "a number of nodes, or MIN:MAX");
    st = ParseInt(origin, r[0], 1, &lo);
    hi = lo;
    if (st.ok() && r.size() == 2) st = ParseInt(origin, r[1], 1, &hi);
    if (!st.ok()) return st;
    if (hi < lo) {
      return absl::InvalidArgumentError(absl::StrCat(origin, "=", v, ": MIN (", lo,
                                                     ") is above MAX (", hi, "); write ", origin,
                                                     "=", hi, ":", lo));
    }
    f->nnodes = hi;
    f->nnodes_min = lo;
  } else if (name == "node_rank") {
    st = ParseInt(origin, v, 0, &f->node_rank);
  } else if (name == "nproc_per_node") {
    if (v == "auto" || v == "cpu" || v == "gpu") {
      f->nproc_per_node_kind = v;
      f->nproc_resolved = false;
    } else if (int n; absl::SimpleAtoi(v, &n)) {
      st = ParseInt(origin, v, 1, &f->nproc_per_node);
      f->nproc_per_node_kind.clear();
    } else {
      return BadValue(origin, v, "a number >= 1, auto, cpu or gpu");
    }
  } else if (name == "master_addr") {
    if (v.empty()) return BadValue(origin, v, "an address of node 0");
    return SetMaster(f, v, 0, origin, v);
  } else if (name == "master_port") {
    int port;
    if (st = ParsePort(origin, v, &port); !st.ok()) return st;
    return SetMaster(f, "", port, origin, v);
  } else if (name == "rdzv_endpoint") {
    std::string host;
    int port;
    if (st = ParseEndpoint(origin, v, &host, &port); !st.ok()) return st;
    st = SetMaster(f, host, port, origin, v);
  } else if (name == "rdzv_backend") {
    if (v == "static" || v == "c10d") {
      f->rdzv_backend = v;
    } else if (v == "etcd" || v == "etcd-v2") {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, "=", v, ": Braid's launchers meet in their own store, served by node 0's "
          "launcher at --master_addr/--rdzv_endpoint (what torchrun's c10d backend does); there "
          "is no etcd backend: use c10d, or leave the flag out"));
    } else {
      return BadValue(origin, v, "static or c10d (both mean Braid's own store on node 0)");
    }
  } else if (name == "rdzv_id") {
    if (v.empty() || v.find_first_of(" \t\n=") != std::string::npos) {
      return BadValue(origin, v, "an id without spaces or '='");
    }
    f->rdzv_id = v;
  } else if (name == "role") {
    if (v.empty() || v.find_first_of(" \t\n[]:") != std::string::npos) {
      return BadValue(origin, v, "a name without spaces, brackets or ':'");
    }
    f->role = v;
  } else if (name == "standalone") {
    st = ParseBool(origin, v, &f->standalone);
  } else if (name == "log_dir") {
    f->log_dir = v;
  } else if (name == "max_restarts") {
    st = ParseInt(origin, v, 0, &f->max_restarts);
  } else if (name == "program") {
    if (v.empty()) return BadValue(origin, v, "the path or name of an executable");
    f->program = v;
  } else if (name == "scheduler") {
    if (v == "auto") f->scheduler = SchedulerMode::kAuto;
    else if (v == "none") f->scheduler = SchedulerMode::kNone;
    else if (v == "slurm") f->scheduler = SchedulerMode::kSlurm;
    else if (v == "mpi") f->scheduler = SchedulerMode::kMpi;
    else if (v == "env") f->scheduler = SchedulerMode::kTorchEnv;
    else return BadValue(origin, v, "one of auto, none, slurm, mpi, env");
  } else if (name == "job_token_file") {
    if (v.empty()) return BadValue(origin, v, "the path of a file holding the job token");
    f->job_token_file = v;
  } else if (name == "connect_timeout_s") {
    st = ParseSeconds(origin, v, &f->connect_timeout_s);
  } else if (name == "rdzv_last_call_s") {
    st = ParseSeconds(origin, v, &f->rdzv_last_call_s);
  } else if (name == "rdzv_timeout_s") {
    st = ParseSeconds(origin, v, &f->rdzv_timeout_s);
  } else if (name == "stop_grace_s") {
    st = ParseSeconds(origin, v, &f->stop_grace_s);
  } else if (name == "heartbeat_timeout_s") {
    st = ParseSeconds(origin, v, &f->heartbeat_timeout_s);
  } else if (name == "tail_lines") {
    st = ParseInt(origin, v, 0, &f->tail_lines);
  } else if (name == "redirects") {
    st = ParseStreams(origin, v, &f->console.redirects);
  } else if (name == "tee") {
    st = ParseStreams(origin, v, &f->console.tee);
  } else if (name == "local_ranks_filter") {
    std::vector<int> ranks;
    for (absl::string_view s : absl::StrSplit(v, ',')) {
      int r;
      if (!absl::SimpleAtoi(s, &r) || r < 0) return BadValue(origin, v, "local ranks, e.g. 0,1");
      ranks.push_back(r);
    }
    f->console.local_ranks_filter = ranks;
  } else if (name == "monitor_interval") {
    double unused;  // Braid's launcher watches its workers without a polling interval
    st = ParseSeconds(origin, v, &unused);
  } else if (name == "start_method") {
    // Python multiprocessing's choice; Braid starts every worker with fork + exec.
    if (v != "spawn" && v != "fork" && v != "forkserver") {
      return BadValue(origin, v, "spawn, fork or forkserver");
    }
  } else if (name == "no_python" || name == "no_local_rank") {
    // Braid always runs an executable and never passes --local_rank: nothing to change.
    bool unused;
    st = ParseBool(origin, v, &unused);
  } else if (name == "hostfile") {
    if (v.empty()) return BadValue(origin, v, "the path of a hostfile ('HOST slots=N' lines)");
    f->hostfile = v;
  } else if (name == "include" || name == "exclude") {
    if (v.empty()) return BadValue(origin, v, "HOST[:SLOT,...][@HOST...]");
    (name == "include" ? f->include : f->exclude) = v;
  } else if (name == "ssh_port") {
    st = ParsePort(origin, v, &f->ssh_port);
  } else if (name == "watch_stdin") {
    st = ParseBool(origin, v, &f->watch_stdin);
  } else if (name == "dry_run") {
    st = ParseBool(origin, v, &f->dry_run);
  } else if (name == "help") {
    st = ParseBool(origin, v, &f->help);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("the launcher has no flag ", origin));
  }
  if (!st.ok()) return st;
  // master_addr and master_port were marked by SetMaster, with their own origin.
  if (name != "master_addr" && name != "master_port") MarkGiven(f, name, origin);
  return absl::OkStatus();
}

std::string LaunchFlagValue(const LaunchFlags& f, const std::string& name) {
  if (name == "nnodes") {
    return f.Elastic() ? absl::StrCat(f.nnodes_min, ":", f.nnodes) : std::to_string(f.nnodes);
  }
  if (name == "node_rank") return std::to_string(f.node_rank);
  if (name == "nproc_per_node") {
    return f.nproc_per_node_kind.empty() ? std::to_string(f.nproc_per_node) : f.nproc_per_node_kind;
  }
  if (name == "master_addr") return f.master_addr;
  if (name == "master_port") return std::to_string(f.master_port);
  if (name == "max_restarts") return std::to_string(f.max_restarts);
  if (name == "rdzv_backend") return f.rdzv_backend;
  if (name == "rdzv_id") return f.rdzv_id;
  if (name == "standalone") return f.standalone ? "true" : "false";
  return "";
}

absl::StatusOr<LaunchFlags> ParseLaunchFlags(const std::vector<std::string>& args) {
  LaunchFlags f;
  std::string positional_program;
  std::string first_training_flag;  // the first training program's flag before "--"
  bool rest = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (rest) {
      f.program_args.push_back(a);
      continue;
    }
    if (a == "--") {
      rest = true;
      continue;
    }
    if (a.empty() || a[0] != '-' || a == "-") {
      // torchrun's "training_script [args...]": the program, then only its arguments.
      positional_program = a;
      rest = true;
      continue;
    }
    std::string name, value;
    bool has_value = false;
    if (absl::StartsWith(a, "--")) {
      std::string body = a.substr(2);
      size_t eq = body.find('=');
      name = body.substr(0, eq);
      if (eq != std::string::npos) value = body.substr(eq + 1), has_value = true;
      std::replace(name.begin(), name.end(), '-', '_');  // torchrun's --nproc-per-node
    } else {
      // torchrun's short options: -r (--redirects), -t (--tee), -m (--module), -h.
      char c = a[1];
      name = c == 'r' ? "redirects" : c == 't' ? "tee" : c == 'm' ? "module" : c == 'h' ? "help" : "";
      if (name.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown launcher option ", a, ". Arguments for the program go after --: launcher "
            "[launcher flags] -- ", a));
      }
      if (a.size() > 2) value = a.substr(a[2] == '=' ? 3 : 2), has_value = true;
    }
    const std::string shown = absl::StrCat("--", name);
    if (std::string why = Refusal(name); !why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(shown, " is not supported: ", why));
    }
    const FlagInfo* info = FindLauncherFlag(name);
    const auto& tf = TrainingProgramFlags();
    const bool training = std::find(tf.begin(), tf.end(), name) != tf.end();
    if (!info && !training) {
      std::string msg = absl::StrCat("unknown launcher flag ", a.substr(0, a.find('=')));
      if (std::string s = Suggest(name); !s.empty()) absl::StrAppend(&msg, "; did you mean --", s, "?");
      absl::StrAppend(&msg, " Arguments for the program go after --: launcher [launcher flags] -- ",
                      a);
      return absl::InvalidArgumentError(msg);
    }
    const bool is_bool = info ? info->is_bool : IsTrainingProgramBool(name);
    if (!has_value && !is_bool) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat(shown, " needs a value"));
      }
      value = args[++i];
      has_value = true;
    }
    if (training) {
      // Passed on in the spelling the training program reads (it has no dashed names).
      f.program_args.push_back(has_value ? absl::StrCat(shown, "=", value) : shown);
      if (first_training_flag.empty()) first_training_flag = shown;
      continue;
    }
    if (absl::Status st = SetLaunchFlag(&f, name, value, shown); !st.ok()) return st;
    f.command_line[name] = has_value ? value : "true";
  }
  if (!positional_program.empty()) {
    if (!f.program.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "two programs: --program=", f.program, " and '", positional_program,
          "'; give one (arguments for the program go after --)"));
    }
    f.program = positional_program;
    MarkGiven(&f, "program", "the program argument");
  }
  if (!f.program.empty() && !first_training_flag.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        first_training_flag, " is a flag of the training program (//launcher:train), but this "
        "launcher runs ", f.program, ": put that program's arguments after --: launcher ",
        "--program=", f.program, " -- ", first_training_flag, "=..."));
  }
  for (const char* n : {"include", "exclude", "ssh_port"}) {
    if (f.Given(n) && f.hostfile.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", n, " selects hosts of a --hostfile, but no --hostfile was given"));
    }
  }
  if (f.Elastic() && !f.hostfile.empty()) {
    // The hostfile launcher starts a fixed set of nodes and stops them all on a failure.
    return absl::InvalidArgumentError(absl::StrCat(
        "--nnodes=", f.nnodes_min, ":", f.nnodes, " (elastic) does not go with --hostfile, which "
        "starts every node itself: start one launcher per node with --node_rank instead "
        "(docs/LAUNCHING.md, Elastic training), or give --hostfile a fixed --nnodes"));
  }
  if (f.standalone) {
    // torchrun's --standalone: a one-node job whose store this launcher serves on a free port.
    if (f.Given("nnodes") && f.nnodes != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--standalone is a job of one node, but --nnodes=", f.nnodes, "; drop one of them"));
    }
    for (const char* n : {"master_addr", "master_port"}) {
      if (f.Given(n)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--standalone serves the store on a free port of this machine, so ", f.Origin(n),
            " has nothing to say; drop one of them"));
      }
    }
  }
  return f;
}

absl::Status ResolveNprocPerNode(LaunchFlags* f, const HostFacts& host) {
  const std::string& k = f->nproc_per_node_kind;
  if (k.empty()) return absl::OkStatus();
  if (k == "gpu" && host.gpus < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        f->Origin("nproc_per_node"), "=gpu: this machine shows no GPU (no /dev/nvidiaN, or "
        "CUDA_VISIBLE_DEVICES lists none); give a number of workers, or cpu"));
  }
  f->nproc_resolved = true;
  f->nproc_per_node = k == "cpu" ? host.cpus : k == "gpu" ? host.gpus : (host.gpus > 0 ? host.gpus : host.cpus);
  return absl::OkStatus();
}


}  // namespace braid::launcher
