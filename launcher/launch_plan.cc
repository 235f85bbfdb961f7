#include "launcher/launch_plan.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/check.h"

extern char** environ;

namespace braid::launcher {

EnvMap CurrentEnvironment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env.emplace(std::string(*e, eq - *e), std::string(eq + 1));
  }
  return env;
}

const char kLauncherUsage[] =
    "usage: launcher [--nnodes=N --node_rank=K --nproc_per_node=P --master_addr=A\n"
    "                 --master_port=Q --log_dir=D --max_restarts=R --program=PATH] [--] ARGS\n"
    "\n"
    "Starts P workers on this node (ranks K*P .. K*P+P-1 of N*P) running PATH (default: the\n"
    "training program, //launcher:train) with ARGS, and watches them: one worker failing stops\n"
    "the job on every node (or restarts it, --max_restarts). Flags it does not know, before --,\n"
    "go to the program too (e.g. --config=FILE).\n"
    "\n"
    "  --nnodes=N            nodes in the job (default 1)\n"
    "  --node_rank=K         this node's index, 0..N-1 (default 0); node 0 serves the store\n"
    "  --nproc_per_node=P    workers per node (default 1)\n"
    "  --master_addr=A       address of node 0 that every node reaches (default: $MASTER_ADDR,\n"
    "                        else 127.0.0.1: every node on this machine)\n"
    "  --master_port=Q       port of the rendezvous store on node 0 (default: $MASTER_PORT,\n"
    "                        else 29500; a single node picks a free port when none is given)\n"
    "  --log_dir=D           worker logs D/workerlog.<rank> (default runs/workers-<time>, in the\n"
    "                        workspace under bazel run); the training program gets it too\n"
    "  --max_restarts=R      restart the whole worker group up to R times on failure (default 0)\n"
    "  --program=PATH        run this executable instead of the training program\n"
    "  --scheduler=auto|none|slurm|mpi   where the rank layout comes from (default auto: Slurm\n"
    "                        or Open MPI variables when present, else the flags)\n"
    "  --connect_timeout_s=S give up reaching the master's store after S s (default 120)\n"
    "  --rdzv_timeout_s=S    give up waiting for every node to check in after S s (default 300)\n"
    "  --stop_grace_s=S      SIGTERM, then SIGKILL after S s (default 10)\n"
    "  --heartbeat_timeout_s=S  another node's launcher silent this long counts as failed (60)\n"
    "  --tail_lines=L        lines of a failed worker's log to print (default 10)\n"
    "\n"
    "Several nodes need the same secret on every node: export BRAID_JOB_TOKEN=$(openssl rand "
    "-hex 32).\nSee docs/LAUNCHING.md.\n";

bool LaunchFlags::Given(const std::string& name) const {
  return std::find(given.begin(), given.end(), name) != given.end();
}

namespace {

absl::Status BadValue(const std::string& name, const std::string& value, const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, " wants ", want, ", got '", value, "'"));
}

absl::Status ParseInt(const std::string& name, const std::string& v, int* out) {
  if (!absl::SimpleAtoi(v, out)) return BadValue(name, v, "an integer");
  return absl::OkStatus();
}

absl::Status ParseSeconds(const std::string& name, const std::string& v, double* out) {
  if (!absl::SimpleAtod(v, out) || !(*out > 0)) return BadValue(name, v, "a positive number of seconds");
  return absl::OkStatus();
}

absl::StatusOr<int> EnvInt(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) {
    return absl::NotFoundError(absl::StrCat("the environment variable ", name, " is not set"));
  }
  int v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the environment variable ", name, "='", it->second, "' is not an integer"));
  }
  return v;
}

std::string EnvOr(const EnvMap& env, const std::string& name, const std::string& def) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? def : it->second;
}

bool Has(const EnvMap& env, const char* name) { return env.count(name) > 0; }

}  // namespace

absl::StatusOr<LaunchFlags> ParseLaunchFlags(const std::vector<std::string>& args) {
  LaunchFlags f;
  using Setter = std::function<absl::Status(const std::string& name, const std::string& value)>;
  auto int_flag = [](int* p) -> Setter {
    return [p](const std::string& n, const std::string& v) { return ParseInt(n, v, p); };
  };
  auto seconds_flag = [](double* p) -> Setter {
    return [p](const std::string& n, const std::string& v) { return ParseSeconds(n, v, p); };
  };
  auto string_flag = [](std::string* p) -> Setter {
    return [p](const std::string&, const std::string& v) {
      *p = v;
      return absl::OkStatus();
    };
  };
  const std::map<std::string, Setter> known = {
      {"nnodes", int_flag(&f.nnodes)},
      {"node_rank", int_flag(&f.node_rank)},
      {"nproc_per_node", int_flag(&f.nproc_per_node)},
      {"master_addr", string_flag(&f.master_addr)},
      {"master_port", int_flag(&f.master_port)},
      {"log_dir", string_flag(&f.log_dir)},
      {"max_restarts", int_flag(&f.max_restarts)},
      {"program", string_flag(&f.program)},
      {"scheduler",
       [&f](const std::string& n, const std::string& v) {
         if (v == "auto") f.scheduler = SchedulerMode::kAuto;
         else if (v == "none") f.scheduler = SchedulerMode::kNone;
         else if (v == "slurm") f.scheduler = SchedulerMode::kSlurm;
         else if (v == "mpi") f.scheduler = SchedulerMode::kOpenMpi;
         else return BadValue(n, v, "one of auto, none, slurm, mpi");
         return absl::OkStatus();
       }},
      {"connect_timeout_s", seconds_flag(&f.connect_timeout_s)},
      {"rdzv_timeout_s", seconds_flag(&f.rdzv_timeout_s)},
      {"stop_grace_s", seconds_flag(&f.stop_grace_s)},
      {"heartbeat_timeout_s", seconds_flag(&f.heartbeat_timeout_s)},
      {"tail_lines", int_flag(&f.tail_lines)},
  };
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
    if (a == "--help" || a == "-h") {
      f.help = true;
      continue;
    }
    if (!absl::StartsWith(a, "--")) {
      f.program_args.push_back(a);
      continue;
    }
    std::string body = a.substr(2);
    size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    auto it = known.find(name);
    if (it == known.end()) {
      f.program_args.push_back(a);  // the program's flag
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    auto st = it->second(name, value);
    if (!st.ok()) return st;
    f.given.push_back(name);
  }
  if (f.nnodes < 1) return BadValue("nnodes", std::to_string(f.nnodes), "a number >= 1");
  if (f.nproc_per_node < 1) {
    return BadValue("nproc_per_node", std::to_string(f.nproc_per_node), "a number >= 1");
  }
  if (f.Given("master_port") && (f.master_port <= 0 || f.master_port > 65535)) {
    return BadValue("master_port", std::to_string(f.master_port), "a port in 1..65535");
  }
  if (f.max_restarts < 0) return BadValue("max_restarts", std::to_string(f.max_restarts), "a number >= 0");
  if (f.tail_lines < 0) return BadValue("tail_lines", std::to_string(f.tail_lines), "a number >= 0");
  return f;
}

const char* LayoutSourceName(LayoutSource s) {
  switch (s) {
    case LayoutSource::kFlags: return "flags";
    case LayoutSource::kSlurm: return "Slurm";
    case LayoutSource::kOpenMpi: return "Open MPI";
  }
  return "?";
}

absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist) {
  // The first entry ends at the first comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    char c = nodelist[end];
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
  }
  std::string first = nodelist.substr(0, end);
  if (first.empty()) return absl::InvalidArgumentError("empty Slurm node list");
  // Each bracket group contributes its first value; zero padding is part of the name
  // ("gpu[07-09]" -> "gpu07"), so digits are copied as text.
  std::string host;
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] != '[') {
      host += first[i];
      continue;
    }
    size_t rb = first.find(']', i);
    if (rb == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("Slurm node list '", nodelist, "' has an unclosed ["));
    }
    std::string range = first.substr(i + 1, rb - i - 1);
    std::string lo = range.substr(0, range.find_first_of(",-"));
    if (lo.empty()) return absl::InvalidArgumentError(absl::StrCat("cannot read Slurm node list '", nodelist, "'"));
    host += lo;
    i = rb;
  }
  return host;
}

absl::StatusOr<std::vector<int>> ParseSlurmTasksPerNode(const std::string& spec) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    int count = 0, times = 1;
    size_t paren = part.find('(');
    absl::string_view head = part.substr(0, paren);
    bool ok = absl::SimpleAtoi(head, &count) && count > 0;
    if (ok && paren != absl::string_view::npos) {
      absl::string_view rep = part.substr(paren + 1);
      ok = absl::ConsumePrefix(&rep, "x") && absl::ConsumeSuffix(&rep, ")") &&
           absl::SimpleAtoi(rep, &times) && times > 0;
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read SLURM_TASKS_PER_NODE='", spec, "' (expected e.g. '2(x3),1')"));
    }
    for (int i = 0; i < times; ++i) out.push_back(count);
  }
  return out;
}

namespace {

// A scheduler's numbers that the user also gave as flags must agree with them.
absl::Status CheckAgrees(const LaunchFlags& f, const char* flag, int flag_value, const std::string& var,
                         int var_value) {
  if (f.Given(flag) && flag_value != var_value) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", flag_value, " disagrees with ",
                                                   var, "=", var_value,
                                                   "; drop the flag or use --scheduler=none"));
  }
  return absl::OkStatus();
}

struct SchedulerLayout {
  int rank, world, local_rank, local_world, node_rank, nnodes;
  std::string rank_var, world_var, local_world_var, node_var, nnodes_var;
};

absl::StatusOr<SchedulerLayout> SlurmLayout(const EnvMap& env) {
  SchedulerLayout l;
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID"}) {
    if (!Has(env, v)) {
      return absl::FailedPreconditionError(
          absl::StrCat("Slurm layout: ", v, " is not set (run the launcher with srun)"));
    }
  }
  BRAID_ASSIGN_OR_RETURN(l.rank, EnvInt(env, "SLURM_PROCID"));
  BRAID_ASSIGN_OR_RETURN(l.world, EnvInt(env, "SLURM_NTASKS"));
  BRAID_ASSIGN_OR_RETURN(l.local_rank, EnvInt(env, "SLURM_LOCALID"));
  BRAID_ASSIGN_OR_RETURN(l.node_rank, EnvInt(env, "SLURM_NODEID"));
  l.rank_var = "SLURM_PROCID";
  l.world_var = "SLURM_NTASKS";
  l.node_var = "SLURM_NODEID";
  l.nnodes = -1;
  for (const char* v : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}) {
    if (Has(env, v)) {
      BRAID_ASSIGN_OR_RETURN(l.nnodes, EnvInt(env, v));
      l.nnodes_var = v;
      break;
    }
  }
  if (l.nnodes < 1) {
    return absl::FailedPreconditionError("Slurm layout: SLURM_NNODES is not set (run the launcher with srun)");
  }
  l.local_world = -1;
  for (const char* v : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (!Has(env, v)) continue;
    BRAID_ASSIGN_OR_RETURN(std::vector<int> per_node, ParseSlurmTasksPerNode(env.at(v)));
    if (l.node_rank < 0 || l.node_rank >= static_cast<int>(per_node.size())) {
      return absl::InvalidArgumentError(absl::StrCat("Slurm layout: SLURM_NODEID=", l.node_rank,
                                                     " but ", v, "='", env.at(v), "' lists ",
                                                     per_node.size(), " node(s)"));
    }
    l.local_world = per_node[l.node_rank];
    l.local_world_var = v;
    break;
  }
  if (l.local_world < 0 && Has(env, "SLURM_NTASKS_PER_NODE")) {
    BRAID_ASSIGN_OR_RETURN(l.local_world, EnvInt(env, "SLURM_NTASKS_PER_NODE"));
    l.local_world_var = "SLURM_NTASKS_PER_NODE";
  }
  if (l.local_world < 0) {
    if (l.world % l.nnodes != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Slurm layout: SLURM_TASKS_PER_NODE is not set and SLURM_NTASKS=", l.world,
          " is not a multiple of ", l.nnodes_var, "=", l.nnodes));
    }
    l.local_world = l.world / l.nnodes;
    l.local_world_var = "SLURM_NTASKS/SLURM_NNODES";
  }
  return l;
}

absl::StatusOr<SchedulerLayout> OpenMpiLayout(const EnvMap& env) {
  SchedulerLayout l;
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    if (!Has(env, v)) {
      return absl::FailedPreconditionError(
          absl::StrCat("Open MPI layout: ", v, " is not set (run the launcher with mpirun)"));
    }
  }
  BRAID_ASSIGN_OR_RETURN(l.rank, EnvInt(env, "OMPI_COMM_WORLD_RANK"));
  BRAID_ASSIGN_OR_RETURN(l.world, EnvInt(env, "OMPI_COMM_WORLD_SIZE"));
  BRAID_ASSIGN_OR_RETURN(l.local_rank, EnvInt(env, "OMPI_COMM_WORLD_LOCAL_RANK"));
  BRAID_ASSIGN_OR_RETURN(l.local_world, EnvInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE"));
  l.rank_var = "OMPI_COMM_WORLD_RANK";
  l.world_var = "OMPI_COMM_WORLD_SIZE";
  l.local_world_var = "OMPI_COMM_WORLD_LOCAL_SIZE";
  l.node_var = "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_LOCAL_SIZE";
  l.nnodes_var = "OMPI_COMM_WORLD_SIZE/OMPI_COMM_WORLD_LOCAL_SIZE";
  if (l.local_world < 1 || l.world % l.local_world != 0 ||
      (l.rank - l.local_rank) % l.local_world != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Open MPI layout: cannot tell the node index of rank ", l.rank, " (OMPI_COMM_WORLD_SIZE=",
        l.world, ", OMPI_COMM_WORLD_LOCAL_SIZE=", l.local_world, ", OMPI_COMM_WORLD_LOCAL_RANK=",
        l.local_rank, "); place ranks node by node with the same count on every node "
        "(mpirun --map-by slot)"));
  }
  l.node_rank = (l.rank - l.local_rank) / l.local_world;
  l.nnodes = l.world / l.local_world;
  return l;
}

absl::Status CheckRange(const SchedulerLayout& l, const char* who) {
  if (l.world < 1 || l.rank < 0 || l.rank >= l.world || l.local_world < 1 || l.local_rank < 0 ||
      l.local_rank >= l.local_world || l.nnodes < 1 || l.node_rank < 0 || l.node_rank >= l.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " layout is inconsistent: ", l.rank_var, "=", l.rank, " ", l.world_var, "=", l.world,
        " local rank ", l.local_rank, " of ", l.local_world, " (", l.local_world_var, "), node ",
        l.node_rank, " of ", l.nnodes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LaunchPlan> MakeLaunchPlan(const LaunchFlags& f, const EnvMap& env) {
  LaunchPlan p;
  SchedulerMode mode = f.scheduler;
  if (mode == SchedulerMode::kAuto) {
    // mpirun inside a Slurm allocation: the Open MPI variables describe this very process.
    if (Has(env, "OMPI_COMM_WORLD_RANK") && Has(env, "OMPI_COMM_WORLD_SIZE")) {
      mode = SchedulerMode::kOpenMpi;
    } else if (Has(env, "SLURM_PROCID") && Has(env, "SLURM_NTASKS") &&
               (Has(env, "SLURM_STEP_ID") || Has(env, "SLURM_STEPID"))) {
      // Only inside a job step (srun): a batch script also has SLURM_PROCID=0, but there the
      // launcher is the only one and should spawn the workers itself.
      mode = SchedulerMode::kSlurm;
    } else {
      mode = SchedulerMode::kNone;
    }
  }
  if (mode == SchedulerMode::kNone) {
    p.source = LayoutSource::kFlags;
    if (f.node_rank < 0 || f.node_rank >= f.nnodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("--node_rank=", f.node_rank, " is outside [0, --nnodes=", f.nnodes, ")"));
    }
    p.nnodes = f.nnodes;
    p.node_rank = f.node_rank;
    p.local_world_size = f.nproc_per_node;
    p.world_size = f.nnodes * f.nproc_per_node;
    p.num_launchers = f.nnodes;
    p.launcher_id = f.node_rank;
    for (int i = 0; i < f.nproc_per_node; ++i) p.workers.push_back({f.node_rank * f.nproc_per_node + i, i});
    p.describe = absl::StrCat("--nnodes=", f.nnodes, " --nproc_per_node=", f.nproc_per_node);
  } else {
    const char* who = mode == SchedulerMode::kSlurm ? "Slurm" : "Open MPI";
    p.source = mode == SchedulerMode::kSlurm ? LayoutSource::kSlurm : LayoutSource::kOpenMpi;
    BRAID_ASSIGN_OR_RETURN(SchedulerLayout l,
                              mode == SchedulerMode::kSlurm ? SlurmLayout(env) : OpenMpiLayout(env));
    BRAID_RETURN_IF_ERROR(CheckRange(l, who));
    if (f.Given("nproc_per_node")) {
      // The scheduler started one launcher per node; each spawns its node's workers.
      if (l.local_world != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "with --nproc_per_node the launcher spawns the workers of its node, so the ", who,
            " job must start one launcher per node, but it has ", l.local_world_var, "=",
            l.local_world, mode == SchedulerMode::kSlurm ? " (use srun --ntasks-per-node=1)"
                                                         : " (use mpirun --map-by ppr:1:node)",
            "; or drop --nproc_per_node to run one worker per task"));
      }
      BRAID_RETURN_IF_ERROR(CheckAgrees(f, "nnodes", f.nnodes, l.world_var, l.world));
      BRAID_RETURN_IF_ERROR(CheckAgrees(f, "node_rank", f.node_rank, l.rank_var, l.rank));
      p.nnodes = l.world;
      p.node_rank = l.rank;
      p.local_world_size = f.nproc_per_node;
      p.world_size = l.world * f.nproc_per_node;
      p.num_launchers = l.world;
      p.launcher_id = l.rank;
      for (int i = 0; i < f.nproc_per_node; ++i) p.workers.push_back({l.rank * f.nproc_per_node + i, i});
      p.describe = absl::StrCat(who, ": ", l.world_var, "=", l.world, " --nproc_per_node=",
                                f.nproc_per_node);
    } else {
      BRAID_RETURN_IF_ERROR(CheckAgrees(f, "nnodes", f.nnodes, l.nnodes_var, l.nnodes));
      BRAID_RETURN_IF_ERROR(CheckAgrees(f, "node_rank", f.node_rank, l.node_var, l.node_rank));
      p.nnodes = l.nnodes;
      p.node_rank = l.node_rank;
      p.local_world_size = l.local_world;
      p.world_size = l.world;
      p.num_launchers = l.world;
      p.launcher_id = l.rank;
      p.workers.push_back({l.rank, l.local_rank});
      p.describe = absl::StrCat(who, ": ", l.world_var, "=", l.world, ", one worker per task");
    }
  }

  // The master: flags, then the environment, then the scheduler's first node.
  p.master_addr = f.master_addr;
  if (p.master_addr.empty()) p.master_addr = EnvOr(env, "MASTER_ADDR", "");
  if (p.master_addr.empty() && p.source == LayoutSource::kSlurm) {
    for (const char* v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (!Has(env, v)) continue;
      BRAID_ASSIGN_OR_RETURN(p.master_addr, FirstSlurmHost(env.at(v)));
      break;
    }
  }
  // As torchrun: with no address given, node 0 is this machine (several "nodes" on one
  // machine); the launcher prints the default it took (launcher_main.cc). Under a scheduler
  // the nodes are other machines, and guessing would only end in a connect timeout.
  if (p.master_addr.empty()) {
    if (p.nnodes > 1 && p.source != LayoutSource::kFlags) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a job of ", p.nnodes, " nodes needs --master_addr (or $MASTER_ADDR): an address of node "
          "0 that every node can reach"));
    }
    p.master_addr = "127.0.0.1";
    p.master_addr_defaulted = p.nnodes > 1;
  }
  if (f.Given("master_port")) {
    p.master_port = f.master_port;
    p.master_port_given = true;
  } else if (Has(env, "MASTER_PORT")) {
    auto port = EnvInt(env, "MASTER_PORT");
    if (!port.ok() || *port <= 0 || *port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("$MASTER_PORT='", env.at("MASTER_PORT"), "' is not a port in 1..65535"));
    }
    p.master_port = *port;
    p.master_port_given = true;
  }
  return p;
}

EnvMap WorkerEnvironment(const LaunchPlan& plan, const WorkerPlan& w, const std::string& token,
                         int restart_count) {
  return {
      {"RANK", std::to_string(w.rank)},
      {"LOCAL_RANK", std::to_string(w.local_rank)},
      {"WORLD_SIZE", std::to_string(plan.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(plan.local_world_size)},
      {"NODE_RANK", std::to_string(plan.node_rank)},
      {"NNODES", std::to_string(plan.nnodes)},
      {"MASTER_ADDR", plan.master_addr},
      {"MASTER_PORT", std::to_string(plan.master_port)},
      {"BRAID_JOB_TOKEN", token},
      {"BRAID_RESTART_COUNT", std::to_string(restart_count)},
  };
}

}  // namespace braid::launcher
