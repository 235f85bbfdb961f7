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

namespace {

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

const char* LayoutSourceName(LayoutSource s) {
  switch (s) {
    case LayoutSource::kFlags: return "flags";
    case LayoutSource::kSlurm: return "Slurm";
    case LayoutSource::kOpenMpi: return "Open MPI";
    case LayoutSource::kMpich: return "MPICH";
    case LayoutSource::kTorchEnv: return "RANK/WORLD_SIZE";
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
    return absl::InvalidArgumentError(absl::StrCat(f.Origin(flag), "=", flag_value, " disagrees with ",
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

// An MPI process's layout from its launcher's variables: rank and size, and the local rank and
// count on this host. Neither Open MPI nor Hydra names a node index, so the node is derived from
// ranks placed node by node with the same count on every node (both mpiruns' default).
struct MpiVars {
  const char* who;  // for messages
  const char *rank, *size, *local_rank, *local_size;
  const char* placement_hint;
};
constexpr MpiVars kOpenMpiVars = {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                  "mpirun --map-by slot"};
// MPICH's Hydra process manager (mpiexec.hydra; Intel MPI and MVAPICH use it too): PMI_RANK and
// PMI_SIZE are the PMI wire protocol's, MPI_LOCALRANKID and MPI_LOCALNRANKS Hydra's own.
constexpr MpiVars kMpichVars = {"MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
                                "MPI_LOCALNRANKS", "mpiexec -ppn N, or a hostfile's host:N slots"};

absl::StatusOr<SchedulerLayout> MpiLayout(const EnvMap& env, const MpiVars& m) {
  SchedulerLayout l;
  for (const char* v : {m.rank, m.size, m.local_rank, m.local_size}) {
    if (!Has(env, v)) {
      return absl::FailedPreconditionError(
          absl::StrCat(m.who, " layout: ", v, " is not set (run the launcher with mpirun)"));
    }
  }
  BRAID_ASSIGN_OR_RETURN(l.rank, EnvInt(env, m.rank));
  BRAID_ASSIGN_OR_RETURN(l.world, EnvInt(env, m.size));
  BRAID_ASSIGN_OR_RETURN(l.local_rank, EnvInt(env, m.local_rank));
  BRAID_ASSIGN_OR_RETURN(l.local_world, EnvInt(env, m.local_size));
  l.rank_var = m.rank;
  l.world_var = m.size;
  l.local_world_var = m.local_size;
  l.node_var = absl::StrCat(m.rank, "/", m.local_size);
  l.nnodes_var = absl::StrCat(m.size, "/", m.local_size);
  if (l.local_world < 1 || l.world % l.local_world != 0 ||
      (l.rank - l.local_rank) % l.local_world != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        m.who, " layout: cannot tell the node index of rank ", l.rank, " (", m.size, "=", l.world,
        ", ", m.local_size, "=", l.local_world, ", ", m.local_rank, "=", l.local_rank,
        "); place ranks node by node with the same count on every node (", m.placement_hint, ")"));
  }
  l.node_rank = (l.rank - l.local_rank) / l.local_world;
  l.nnodes = l.world / l.local_world;
  return l;
}

// torch's env:// variables, from whatever started this process with them.
absl::StatusOr<SchedulerLayout> TorchEnvLayout(const EnvMap& env) {
  SchedulerLayout l;
  for (const char* v : {"RANK", "WORLD_SIZE"}) {
    if (!Has(env, v)) {
      return absl::FailedPreconditionError(
          absl::StrCat("RANK/WORLD_SIZE layout: ", v, " is not set"));
    }
  }
  BRAID_ASSIGN_OR_RETURN(l.rank, EnvInt(env, "RANK"));
  BRAID_ASSIGN_OR_RETURN(l.world, EnvInt(env, "WORLD_SIZE"));
  l.rank_var = "RANK";
  l.world_var = "WORLD_SIZE";
  if (Has(env, "LOCAL_WORLD_SIZE") && Has(env, "LOCAL_RANK")) {
    BRAID_ASSIGN_OR_RETURN(l.local_rank, EnvInt(env, "LOCAL_RANK"));
    BRAID_ASSIGN_OR_RETURN(l.local_world, EnvInt(env, "LOCAL_WORLD_SIZE"));
    l.local_world_var = "LOCAL_WORLD_SIZE";
    l.node_var = "RANK/LOCAL_WORLD_SIZE";
    l.nnodes_var = "WORLD_SIZE/LOCAL_WORLD_SIZE";
    if (l.local_world < 1 || l.world % l.local_world != 0 ||
        (l.rank - l.local_rank) % l.local_world != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RANK/WORLD_SIZE layout: cannot tell the node index of RANK=", l.rank, " (WORLD_SIZE=",
          l.world, ", LOCAL_WORLD_SIZE=", l.local_world, ", LOCAL_RANK=", l.local_rank,
          "); ranks must be placed node by node with the same count on every node"));
    }
    l.node_rank = (l.rank - l.local_rank) / l.local_world;
    l.nnodes = l.world / l.local_world;
  } else {
    // One process per node (a pod each): the rank is the node's.
    l.local_rank = 0;
    l.local_world = 1;
    l.local_world_var = "one process per node";
    l.node_rank = l.rank;
    l.nnodes = l.world;
    l.node_var = "RANK";
    l.nnodes_var = "WORLD_SIZE";
  }
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

// Where a flag's value came from the environment rather than the command line.
bool FromEnvironment(const LaunchFlags& f, const std::string& name) {
  return f.Given(name) && !absl::StartsWith(f.Origin(name), "--");
}

// A PyTorchJob pod also has RANK (its pod index, = PET_NODE_RANK) and WORLD_SIZE (pods times
// numeric nprocPerNode, or the pod count when nprocPerNode is auto/cpu/gpu): they must describe
// the same job as the node layout.
absl::Status CheckPodNumbers(const LaunchFlags& f, const EnvMap& env, const LaunchPlan& p) {
  if (!FromEnvironment(f, "node_rank") && !FromEnvironment(f, "nnodes")) return absl::OkStatus();
  if (Has(env, "RANK")) {
    BRAID_ASSIGN_OR_RETURN(int rank, EnvInt(env, "RANK"));
    if (rank != p.node_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RANK=", rank, " disagrees with ", f.Origin("node_rank"), "=", p.node_rank,
          " (a pod's RANK is its node rank here); fix one of them"));
    }
  }
  if (Has(env, "WORLD_SIZE")) {
    BRAID_ASSIGN_OR_RETURN(int world, EnvInt(env, "WORLD_SIZE"));
    if (world != p.world_size && world != p.nnodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WORLD_SIZE=", world, " disagrees with ", f.Origin("nnodes"), "=", p.nnodes, " x ",
          f.Origin("nproc_per_node"), "=", f.nproc_per_node, " (world size ", p.world_size,
          "); fix one of them"));
    }
  }
  return absl::OkStatus();
}

// The layout where each of `nnodes` nodes runs one launcher that spawns `nproc_per_node` workers
// (plain flags, or a scheduler that started one task per node): this launcher is node
// `node_rank`'s, and its workers take the global ranks that follow the nodes before it.
void OneLauncherPerNode(int nnodes, int node_rank, int nproc_per_node, LaunchPlan& p) {
  p.nnodes = nnodes;
  p.node_rank = node_rank;
  p.local_world_size = nproc_per_node;
  p.world_size = nnodes * nproc_per_node;
  p.num_launchers = nnodes;
  p.launcher_id = node_rank;
  for (int i = 0; i < nproc_per_node; ++i) p.workers.push_back({node_rank * nproc_per_node + i, i});
}

}  // namespace

absl::StatusOr<LaunchFlags> FlagsWithEnvironment(LaunchFlags f, const EnvMap& env,
                                                 const HostFacts& host) {
  struct Pet {
    const char* flag;
    const char* var;
    bool command_line_wins;  // node 0's address: the command line overrides the environment
  };
  static constexpr Pet kPet[] = {
      {"nnodes", "PET_NNODES", false},         {"node_rank", "PET_NODE_RANK", false},
      {"nproc_per_node", "PET_NPROC_PER_NODE", false}, {"max_restarts", "PET_MAX_RESTARTS", false},
      {"rdzv_id", "PET_RDZV_ID", false},       {"rdzv_backend", "PET_RDZV_BACKEND", false},
      {"master_addr", "PET_MASTER_ADDR", true}, {"master_port", "PET_MASTER_PORT", true},
      {"rdzv_endpoint", "PET_RDZV_ENDPOINT", true},
  };
  if (!f.standalone) {
    for (const Pet& pet : kPet) {
      auto it = env.find(pet.var);
      if (it == env.end()) continue;
      const std::string& value = it->second;
      const bool on_command_line = f.Given(pet.flag) && absl::StartsWith(f.Origin(pet.flag), "--");
      if (on_command_line && pet.command_line_wins) continue;
      if (std::string(pet.flag) == "master_addr" && f.Given("master_addr") &&
          f.Origin("master_addr") == "--rdzv_endpoint") {
        continue;  // the command line's --rdzv_endpoint is node 0's address too
      }
      if (on_command_line) {
        LaunchFlags from_env;
        BRAID_RETURN_IF_ERROR(SetLaunchFlag(&from_env, pet.flag, value, pet.var));
        if (LaunchFlagValue(from_env, pet.flag) != LaunchFlagValue(f, pet.flag)) {
          return absl::InvalidArgumentError(absl::StrCat(
              f.Origin(pet.flag), "=", LaunchFlagValue(f, pet.flag), " disagrees with ", pet.var,
              "=", value, " from the environment; drop the flag or fix the variable"));
        }
        continue;
      }
      BRAID_RETURN_IF_ERROR(SetLaunchFlag(&f, pet.flag, value, pet.var));
    }
  }
  // A Kubernetes Indexed Job numbers its pods 0..completions-1: the pod's node rank.
  if (auto it = env.find("JOB_COMPLETION_INDEX"); it != env.end() && !f.standalone) {
    int index;
    if (!absl::SimpleAtoi(it->second, &index) || index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the environment variable JOB_COMPLETION_INDEX='", it->second, "' is not a pod index"));
    }
    if (f.Given("node_rank") && f.node_rank != index) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.Origin("node_rank"), "=", f.node_rank, " disagrees with JOB_COMPLETION_INDEX=", index,
          " (this pod's index in the Indexed Job); drop one of them"));
    }
    if (!f.Given("node_rank")) {
      f.node_rank = index;
      f.given.push_back("node_rank");
      f.origin["node_rank"] = "JOB_COMPLETION_INDEX";
    }
  }
  // Node 0's address from torchrun's variable and from $MASTER_ADDR: one place, one value.
  for (const auto& [flag, var] : {std::pair<std::string, std::string>{"master_addr", "MASTER_ADDR"},
                                  {"master_port", "MASTER_PORT"}}) {
    auto it = env.find(var);
    if (!FromEnvironment(f, flag) || it == env.end() || it->second.empty()) continue;
    if (it->second != LaunchFlagValue(f, flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.Origin(flag), "=", LaunchFlagValue(f, flag), " disagrees with ", var, "=", it->second,
          " in the environment; set them to the same value, or give --", flag));
    }
  }
  BRAID_RETURN_IF_ERROR(ResolveNprocPerNode(&f, host));
  return f;
}

absl::StatusOr<LaunchPlan> MakeLaunchPlan(const LaunchFlags& f, const EnvMap& env) {
  if (!f.nproc_per_node_kind.empty() && !f.nproc_resolved) {
    return absl::InternalError("--nproc_per_node=auto|cpu|gpu reached MakeLaunchPlan unresolved "
                               "(call FlagsWithEnvironment first)");
  }
  LaunchPlan p;
  p.role = f.role;
  p.run_id = f.rdzv_id;
  p.max_restarts = f.max_restarts;
  SchedulerMode mode = f.standalone ? SchedulerMode::kNone : f.scheduler;
  // The node layout came from torchrun's variables or a pod index: a PyTorchJob or Indexed Job
  // pod, whose RANK/WORLD_SIZE (if any) only describe the pods (checked below).
  const bool layout_from_env = FromEnvironment(f, "node_rank") || FromEnvironment(f, "nnodes");
  const bool open_mpi = Has(env, "OMPI_COMM_WORLD_RANK") && Has(env, "OMPI_COMM_WORLD_SIZE");
  // PMI_RANK alone is also what srun --mpi=pmi2 sets (Slurm's layout, below, says more); Hydra
  // adds its local rank and count.
  const bool hydra = Has(env, "PMI_RANK") && Has(env, "PMI_SIZE") && Has(env, "MPI_LOCALRANKID");
  if (mode == SchedulerMode::kMpi) {
    if (!open_mpi && !Has(env, "PMI_RANK")) {
      return absl::FailedPreconditionError(
          "--scheduler=mpi: neither Open MPI's OMPI_COMM_WORLD_RANK nor MPICH's PMI_RANK is set "
          "(run the launcher with mpirun or mpiexec)");
    }
    mode = open_mpi ? SchedulerMode::kOpenMpi : SchedulerMode::kMpich;
  }
  if (mode == SchedulerMode::kAuto) {
    // mpirun inside a Slurm allocation: the MPI's variables describe this very process (Slurm's,
    // if any, describe the step that started mpirun's daemons).
    if (open_mpi) {
      mode = SchedulerMode::kOpenMpi;
    } else if (hydra) {
      mode = SchedulerMode::kMpich;
    } else if (Has(env, "SLURM_PROCID") && Has(env, "SLURM_NTASKS") &&
               (Has(env, "SLURM_STEP_ID") || Has(env, "SLURM_STEPID"))) {
      // Only inside a job step (srun): a batch script also has SLURM_PROCID=0, but there the
      // launcher is the only one and should spawn the workers itself.
      mode = SchedulerMode::kSlurm;
    } else if (!layout_from_env && Has(env, "RANK") && Has(env, "WORLD_SIZE")) {
      mode = SchedulerMode::kTorchEnv;
    } else {
      mode = SchedulerMode::kNone;
    }
  }
  if (mode == SchedulerMode::kNone) {
    p.source = LayoutSource::kFlags;
    if (f.node_rank < 0 || f.node_rank >= f.nnodes) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.Origin("node_rank"), "=", f.node_rank, " is outside [0, ",
                       f.Origin("nnodes"), "=", f.nnodes, ")"));
    }
    OneLauncherPerNode(f.nnodes, f.node_rank, f.nproc_per_node, p);
    p.describe = absl::StrCat(f.Origin("nnodes"), "=", f.nnodes, " ", f.Origin("nproc_per_node"),
                              "=", f.nproc_per_node);
    if (!f.nproc_per_node_kind.empty()) absl::StrAppend(&p.describe, " (", f.nproc_per_node_kind, ")");
    if (f.Given("node_rank") && f.Origin("node_rank") != "--node_rank") {
      absl::StrAppend(&p.describe, " ", f.Origin("node_rank"), "=", f.node_rank);
    }
    BRAID_RETURN_IF_ERROR(CheckPodNumbers(f, env, p));
  } else {
    const bool mpi = mode == SchedulerMode::kOpenMpi || mode == SchedulerMode::kMpich;
    const char* who = mode == SchedulerMode::kSlurm     ? "Slurm"
                      : mode == SchedulerMode::kOpenMpi ? "Open MPI"
                      : mode == SchedulerMode::kMpich   ? "MPICH"
                                                        : "RANK/WORLD_SIZE";
    p.source = mode == SchedulerMode::kSlurm     ? LayoutSource::kSlurm
               : mode == SchedulerMode::kOpenMpi ? LayoutSource::kOpenMpi
               : mode == SchedulerMode::kMpich   ? LayoutSource::kMpich
                                                 : LayoutSource::kTorchEnv;
    BRAID_ASSIGN_OR_RETURN(
        SchedulerLayout l,
        mode == SchedulerMode::kSlurm ? SlurmLayout(env)
        : mpi ? MpiLayout(env, mode == SchedulerMode::kOpenMpi ? kOpenMpiVars : kMpichVars)
              : TorchEnvLayout(env));
    BRAID_RETURN_IF_ERROR(CheckRange(l, who));
    if (f.Given("nproc_per_node")) {
      // The scheduler started one launcher per node; each spawns its node's workers.
      if (l.local_world != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "with --nproc_per_node the launcher spawns the workers of its node, so the ", who,
            " job must start one launcher per node, but it has ", l.local_world_var, "=",
            l.local_world, mode == SchedulerMode::kSlurm     ? " (use srun --ntasks-per-node=1)"
                           : mode == SchedulerMode::kOpenMpi ? " (use mpirun --map-by ppr:1:node)"
                           : mode == SchedulerMode::kMpich   ? " (use mpiexec -ppn 1)"
                                                             : " (start one launcher per node)",
            "; or drop --nproc_per_node to run one worker per task"));
      }
      BRAID_RETURN_IF_ERROR(CheckAgrees(f, "nnodes", f.nnodes, l.world_var, l.world));
      BRAID_RETURN_IF_ERROR(CheckAgrees(f, "node_rank", f.node_rank, l.rank_var, l.rank));
      OneLauncherPerNode(l.world, l.rank, f.nproc_per_node, p);
      p.describe = absl::StrCat(who, ": ", l.world_var, "=", l.world, " ",
                                f.Origin("nproc_per_node"), "=", f.nproc_per_node);
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

  if (f.standalone) {
    // torchrun --standalone: this machine, a free port; the environment's master is not ours.
    p.master_addr = "127.0.0.1";
    return p;
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
  if (f.Given("master_port") && f.master_port > 0) {
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

std::string DescribePlan(const LaunchPlan& p) {
  std::string out = absl::StrCat(
      "layout: ", p.describe, " (from ", LayoutSourceName(p.source), ")\n",
      "world_size=", p.world_size, " nnodes=", p.nnodes, " node_rank=", p.node_rank,
      " local_world_size=", p.local_world_size, "\n", "launchers=", p.num_launchers,
      " launcher_id=", p.launcher_id, "\n", "master=", p.master_addr, ":",
      p.master_port_given || p.num_launchers > 1 ? std::to_string(p.master_port) : "<free port>",
      "\n");
  for (const WorkerPlan& w : p.workers) {
    absl::StrAppend(&out, "worker rank=", w.rank, " local_rank=", w.local_rank, "\n");
  }
  return out;
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
      // torchrun's names for the same facts, for programs written against it.
      {"GROUP_RANK", std::to_string(plan.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(plan.nnodes)},
      {"ROLE_NAME", plan.role},
      {"ROLE_RANK", std::to_string(w.rank)},
      {"ROLE_WORLD_SIZE", std::to_string(plan.world_size)},
      {"TORCHELASTIC_RUN_ID", plan.run_id},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(plan.max_restarts)},
  };
}

}  // namespace braid::launcher
