#include "launcher/launch_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace braid::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

LaunchFlags Flags(std::vector<std::string> args) {
  auto f = ParseLaunchFlags(args);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : LaunchFlags{};
}

// The whole path of launcher_main.cc: command line, environment, host, plan.
absl::StatusOr<LaunchPlan> Plan(std::vector<std::string> args, const EnvMap& env,
                                HostFacts host = {}) {
  auto f = ParseLaunchFlags(args);
  if (!f.ok()) return f.status();
  f = FlagsWithEnvironment(*std::move(f), env, host);
  if (!f.ok()) return f.status();
  return MakeLaunchPlan(*f, env);
}

std::string Error(std::vector<std::string> args, const EnvMap& env = {}) {
  auto p = Plan(args, env);
  return p.ok() ? "" : std::string(p.status().message());
}

std::vector<std::pair<int, int>> Workers(const LaunchPlan& p) {
  std::vector<std::pair<int, int>> out;
  for (const WorkerPlan& w : p.workers) out.push_back({w.rank, w.local_rank});
  return out;
}

TEST(MakeLaunchPlan, SingleProcessDefaults) {
  auto p = MakeLaunchPlan(Flags({}), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, LayoutSource::kFlags);
  EXPECT_EQ(p->world_size, 1);
  EXPECT_EQ(p->num_launchers, 1);
  EXPECT_EQ(p->master_addr, "127.0.0.1");
  EXPECT_EQ(p->master_port, 29500);
  EXPECT_FALSE(p->master_port_given);
  EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(0, 0)));
}

TEST(MakeLaunchPlan, NodeOfAMultiNodeJob) {
  auto p = MakeLaunchPlan(
      Flags({"--nnodes=3", "--node_rank=1", "--nproc_per_node=4", "--master_addr=10.0.0.1"}), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->world_size, 12);
  EXPECT_EQ(p->local_world_size, 4);
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->num_launchers, 3);
  EXPECT_EQ(p->launcher_id, 1);
  // Node 1's ranks are 4..7, local ranks 0..3.
  EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(4, 0), std::make_pair(5, 1),
                                       std::make_pair(6, 2), std::make_pair(7, 3)));
}

TEST(MakeLaunchPlan, FlagErrors) {
  EXPECT_THAT(Error({"--nnodes=2", "--node_rank=2", "--master_addr=a"}),
              HasSubstr("--node_rank=2 is outside [0, --nnodes=2)"));
}

// torchrun's default: several nodes and no address means every node is on this machine.
TEST(MakeLaunchPlan, SeveralNodesDefaultToLoopback) {
  auto p = MakeLaunchPlan(Flags({"--nnodes=2", "--node_rank=1"}), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->master_addr, "127.0.0.1");
  EXPECT_TRUE(p->master_addr_defaulted);
  EXPECT_EQ(p->master_port, 29500);
  p = MakeLaunchPlan(Flags({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1"}), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->master_addr_defaulted);
}

TEST(MakeLaunchPlan, MasterFromTheEnvironmentFlagsWin) {
  EnvMap env = {{"MASTER_ADDR", "10.9.9.9"}, {"MASTER_PORT", "4321"}};
  auto p = Plan({"--nnodes=2", "--node_rank=1"}, env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->master_addr, "10.9.9.9");
  EXPECT_EQ(p->master_port, 4321);
  EXPECT_TRUE(p->master_port_given);
  p = Plan({"--master_addr=10.1.1.1", "--master_port=555"}, env);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->master_addr, "10.1.1.1");
  EXPECT_EQ(p->master_port, 555);
  p = Plan({"--rdzv_endpoint=10.2.2.2:666"}, env);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->master_addr, "10.2.2.2");
  EXPECT_EQ(p->master_port, 666);
  EXPECT_THAT(Error({}, {{"MASTER_PORT", "http"}}), HasSubstr("$MASTER_PORT='http'"));
}

EnvMap SlurmTask(int procid, int localid, int nodeid) {
  // srun -N4 --ntasks-per-node=2: 8 tasks, 2 per node.
  return {{"SLURM_PROCID", std::to_string(procid)}, {"SLURM_NTASKS", "8"},
          {"SLURM_LOCALID", std::to_string(localid)}, {"SLURM_NODEID", std::to_string(nodeid)},
          {"SLURM_NNODES", "4"}, {"SLURM_TASKS_PER_NODE", "2(x4)"}, {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_NODELIST", "gpu[07-10]"}};
}

TEST(MakeLaunchPlan, SlurmOneWorkerPerTask) {
  auto p = MakeLaunchPlan(Flags({}), SlurmTask(5, 1, 2));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, LayoutSource::kSlurm);
  EXPECT_EQ(p->world_size, 8);
  EXPECT_EQ(p->nnodes, 4);
  EXPECT_EQ(p->node_rank, 2);
  EXPECT_EQ(p->local_world_size, 2);
  EXPECT_EQ(p->num_launchers, 8);  // every task's launcher checks in
  EXPECT_EQ(p->launcher_id, 5);
  EXPECT_EQ(p->master_addr, "gpu07");  // the first node of the step
  EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(5, 1)));
}

TEST(MakeLaunchPlan, SlurmBatchScriptIsNotAStep) {
  EnvMap env = SlurmTask(0, 0, 0);
  env.erase("SLURM_STEP_ID");
  auto p = MakeLaunchPlan(Flags({"--nproc_per_node=2"}), env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, LayoutSource::kFlags);
  EXPECT_EQ(p->world_size, 2);
  // ...unless asked for.
  p = MakeLaunchPlan(Flags({"--scheduler=slurm"}), env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, LayoutSource::kSlurm);
}

TEST(MakeLaunchPlan, SlurmUnevenTasksPerNode) {
  EnvMap env = SlurmTask(4, 0, 2);
  env["SLURM_NTASKS"] = "5";
  env["SLURM_NNODES"] = "3";
  env["SLURM_TASKS_PER_NODE"] = "2(x2),1";
  auto p = MakeLaunchPlan(Flags({}), env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->local_world_size, 1);
  EXPECT_EQ(p->world_size, 5);
}

TEST(MakeLaunchPlan, SlurmOneLauncherPerNode) {
  EnvMap env = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                {"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_TASKS_PER_NODE", "1(x2)"},
                {"SLURM_STEP_ID", "3"}, {"SLURM_JOB_NODELIST", "n1,n2"}};
  auto p = MakeLaunchPlan(Flags({"--nproc_per_node=4"}), env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->world_size, 8);
  EXPECT_EQ(p->num_launchers, 2);
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->master_addr, "n1");
  EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(4, 0), std::make_pair(5, 1),
                                       std::make_pair(6, 2), std::make_pair(7, 3)));
  // Two tasks per node and --nproc_per_node would start every worker twice.
  EXPECT_THAT(Error({"--nproc_per_node=4"}, SlurmTask(3, 1, 1)), HasSubstr("--ntasks-per-node=1"));
}

TEST(MakeLaunchPlan, SchedulerAndFlagsMustAgree) {
  EXPECT_THAT(Error({"--node_rank=0"}, SlurmTask(5, 1, 2)),
              HasSubstr("--node_rank=0 disagrees with SLURM_NODEID=2"));
  EXPECT_THAT(Error({"--nnodes=2"}, SlurmTask(5, 1, 2)), HasSubstr("SLURM_NNODES=4"));
  EXPECT_TRUE(Error({"--nnodes=4", "--node_rank=2"}, SlurmTask(5, 1, 2)).empty());
}

TEST(MakeLaunchPlan, SchedulerForcedButAbsent) {
  EXPECT_THAT(Error({"--scheduler=slurm"}), HasSubstr("SLURM_PROCID is not set"));
  EXPECT_THAT(Error({"--scheduler=mpi"}),
              HasSubstr("neither Open MPI's OMPI_COMM_WORLD_RANK nor MPICH's PMI_RANK is set"));
  // PMI_RANK without Hydra's local numbers (srun --mpi=pmi2 sets only PMI's).
  EXPECT_THAT(Error({"--scheduler=mpi"}, {{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}),
              HasSubstr("MPICH layout: MPI_LOCALRANKID is not set"));
  EXPECT_THAT(Error({}, {{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                         {"SLURM_NODEID", "0"}, {"SLURM_NNODES", "1"}, {"SLURM_STEP_ID", "0"}}),
              HasSubstr("SLURM_PROCID='x' is not an integer"));
}

TEST(MakeLaunchPlan, NoneIgnoresTheScheduler) {
  auto p = MakeLaunchPlan(Flags({"--scheduler=none"}), SlurmTask(5, 1, 2));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, LayoutSource::kFlags);
  EXPECT_EQ(p->world_size, 1);
}

EnvMap OmpiProc(int rank, int local, int size, int local_size) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(size)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_size)}};
}

TEST(MakeLaunchPlan, OpenMpi) {
  // mpirun -np 8 --map-by slot on two nodes of 4: rank 5 is local rank 1 of node 1.
  EnvMap env = OmpiProc(5, 1, 8, 4);
  EXPECT_THAT(Error({}, env), HasSubstr("--master_addr"));
  auto p = MakeLaunchPlan(Flags({"--master_addr=10.0.0.1"}), env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, LayoutSource::kOpenMpi);
  EXPECT_EQ(p->world_size, 8);
  EXPECT_EQ(p->nnodes, 2);
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->local_world_size, 4);
  EXPECT_EQ(p->launcher_id, 5);
  EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(5, 1)));
  // Round-robin placement gives local ranks that do not line up with the global ones.
  EXPECT_THAT(Error({"--master_addr=a"}, OmpiProc(5, 2, 8, 4)), HasSubstr("--map-by slot"));
}

TEST(MakeLaunchPlan, OpenMpiWinsOverTheSurroundingSlurmJob) {
  EnvMap env = SlurmTask(0, 0, 0);
  for (auto& [k, v] : OmpiProc(3, 3, 4, 4)) env[k] = v;
  auto p = MakeLaunchPlan(Flags({}), env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, LayoutSource::kOpenMpi);
  EXPECT_EQ(p->world_size, 4);
  EXPECT_EQ(p->nnodes, 1);
  EXPECT_EQ(p->master_addr, "127.0.0.1");  // one node: loopback
}

// What MPICH's mpiexec (Hydra) gives each process, as seen under mpiexec.mpich -n 2.
EnvMap HydraProc(int rank, int local, int size, int local_size) {
  return {{"PMI_RANK", std::to_string(rank)},          {"PMI_SIZE", std::to_string(size)},
          {"MPI_LOCALRANKID", std::to_string(local)}, {"MPI_LOCALNRANKS", std::to_string(local_size)},
          {"PMI_FD", "6"}, {"MPIR_CVAR_CH3_INTERFACE_HOSTNAME", "node1"}};
}

TEST(MakeLaunchPlan, Mpich) {
  // mpiexec -n 8 -ppn 4 on two hosts: rank 6 is local rank 2 of node 1.
  EnvMap env = HydraProc(6, 2, 8, 4);
  EXPECT_THAT(Error({}, env), HasSubstr("--master_addr"));
  for (const char* sched : {"--scheduler=auto", "--scheduler=mpi"}) {
    auto p = MakeLaunchPlan(Flags({sched, "--master_addr=10.0.0.1"}), env);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->source, LayoutSource::kMpich);
    EXPECT_EQ(p->world_size, 8);
    EXPECT_EQ(p->nnodes, 2);
    EXPECT_EQ(p->node_rank, 1);
    EXPECT_EQ(p->local_world_size, 4);
    EXPECT_EQ(p->launcher_id, 6);
    EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(6, 2)));
    EXPECT_THAT(p->describe, HasSubstr("MPICH: PMI_SIZE=8, one worker per task"));
  }
  // One launcher per node (mpiexec -ppn 1): each spawns its node's workers.
  auto p = MakeLaunchPlan(Flags({"--nproc_per_node=4", "--master_addr=a"}), HydraProc(1, 0, 2, 1));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->world_size, 8);
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(4, 0), std::make_pair(5, 1),
                                       std::make_pair(6, 2), std::make_pair(7, 3)));
  EXPECT_THAT(Error({"--nproc_per_node=4"}, HydraProc(1, 1, 2, 2)), HasSubstr("mpiexec -ppn 1"));
  // Round-robin placement (mpiexec -ppn 1 with more ranks than hosts) has no node index.
  EXPECT_THAT(Error({"--master_addr=a"}, HydraProc(1, 0, 4, 2)),
              HasSubstr("MPICH layout: cannot tell the node index of rank 1"));
  EXPECT_THAT(Error({}, HydraProc(2, 0, 2, 1)), HasSubstr("MPICH layout is inconsistent"));
  // Flags that MPICH also gives must agree with it.
  EXPECT_THAT(Error({"--nnodes=3", "--master_addr=a"}, env),
              HasSubstr("--nnodes=3 disagrees with PMI_SIZE/MPI_LOCALNRANKS=2"));
}

TEST(MakeLaunchPlan, PmiAloneIsNotHydra) {
  // srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE but not Hydra's local numbers: Slurm's layout.
  EnvMap env = SlurmTask(1, 1, 0);
  env["PMI_RANK"] = "1";
  env["PMI_SIZE"] = env["SLURM_NTASKS"];
  auto p = MakeLaunchPlan(Flags({}), env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, LayoutSource::kSlurm);
}

TEST(FirstSlurmHost, Forms) {
  EXPECT_EQ(*FirstSlurmHost("gpu[07-09,12],cpu1"), "gpu07");
  EXPECT_EQ(*FirstSlurmHost("a1,b2"), "a1");
  EXPECT_EQ(*FirstSlurmHost("node5"), "node5");
  EXPECT_EQ(*FirstSlurmHost("rack[3,5]-n[1-2],x"), "rack3-n1");
  EXPECT_FALSE(FirstSlurmHost("gpu[07").ok());
  EXPECT_FALSE(FirstSlurmHost("").ok());
}

TEST(ParseSlurmTasksPerNode, Forms) {
  EXPECT_THAT(*ParseSlurmTasksPerNode("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(*ParseSlurmTasksPerNode("4"), ElementsAre(4));
  EXPECT_THAT(*ParseSlurmTasksPerNode("1,3(x2)"), ElementsAre(1, 3, 3));
  EXPECT_FALSE(ParseSlurmTasksPerNode("2(3)").ok());
  EXPECT_FALSE(ParseSlurmTasksPerNode("x").ok());
  EXPECT_FALSE(ParseSlurmTasksPerNode("").ok());
}

// ---- Kubernetes and torchrun's variables ----------------------------------------------------

// What every container of a pod has (Kubernetes' service links and the pod's name), so that the
// mapping is tested against a pod's environment, not only the variables it reads.
EnvMap PodBase(const std::string& hostname) {
  return {{"HOSTNAME", hostname}, {"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
          {"KUBERNETES_SERVICE_PORT", "443"}, {"KUBERNETES_PORT", "tcp://10.96.0.1:443"},
          {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", "/root"}};
}

// A pod of an Indexed Job (batch/v1, completionMode: Indexed): Kubernetes adds
// JOB_COMPLETION_INDEX (and the batch.kubernetes.io/job-completion-index annotation, which is
// not in the environment); the job's own command gives the rest, as in
// launcher/examples/kubernetes/indexed-job.yaml.
EnvMap IndexedJobPod(int index) {
  EnvMap env = PodBase(absl::StrCat("braid-gpt-", index));
  env["JOB_COMPLETION_INDEX"] = std::to_string(index);
  env["BRAID_JOB_TOKEN"] = "from-the-secret";
  return env;
}
const std::vector<std::string> kIndexedJobArgs = {
    "--nnodes=2", "--nproc_per_node=2", "--master_addr=braid-gpt-0.braid-gpt",
    "--master_port=29500", "--job_token_file=/var/run/braid/token", "--",
    "--config=launcher/configs/gpt-mini-ddp.pbtxt"};

TEST(Kubernetes, IndexedJobPodIndexIsTheNodeRank) {
  for (int index : {0, 1}) {
    auto p = Plan(kIndexedJobArgs, IndexedJobPod(index));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->source, LayoutSource::kFlags);
    EXPECT_EQ(p->node_rank, index);
    EXPECT_EQ(p->nnodes, 2);
    EXPECT_EQ(p->world_size, 4);
    EXPECT_EQ(p->launcher_id, index);
    EXPECT_EQ(p->master_addr, "braid-gpt-0.braid-gpt");
    EXPECT_EQ(p->master_port, 29500);
    EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(2 * index, 0), std::make_pair(2 * index + 1, 1)));
    EXPECT_THAT(p->describe, HasSubstr(absl::StrCat("JOB_COMPLETION_INDEX=", index)));
  }
}

TEST(Kubernetes, IndexedJobDisagreements) {
  std::vector<std::string> args = {"--nnodes=2", "--node_rank=0", "--master_addr=a"};
  EXPECT_EQ(Error(args, IndexedJobPod(1)),
            "--node_rank=0 disagrees with JOB_COMPLETION_INDEX=1 (this pod's index in the Indexed "
            "Job); drop one of them");
  EXPECT_TRUE(Error({"--nnodes=2", "--node_rank=1", "--master_addr=a"}, IndexedJobPod(1)).empty());
  EnvMap env = IndexedJobPod(1);
  env["JOB_COMPLETION_INDEX"] = "one";
  EXPECT_THAT(Error({"--nnodes=2"}, env), HasSubstr("JOB_COMPLETION_INDEX='one' is not a pod index"));
  EXPECT_THAT(Error({"--nnodes=2", "--master_addr=a"}, IndexedJobPod(2)),
              HasSubstr("JOB_COMPLETION_INDEX=2 is outside [0, --nnodes=2)"));
}

// A Kubeflow PyTorchJob pod (training-operator v1.7+) with one Master and one Worker replica and
// nprocPerNode "2": the operator's variables exactly, besides the pod's own.
EnvMap PyTorchJobPod(const std::string& type, int index, const std::string& nproc = "2",
                     int world = 4) {
  const int node_rank = type == "master" ? 0 : index + 1;
  EnvMap env = PodBase(absl::StrCat("braid-gpt-", type, "-", index));
  for (auto& [k, v] : EnvMap{{"PYTHONUNBUFFERED", "0"},
                             {"MASTER_PORT", "23456"},
                             {"PET_MASTER_PORT", "23456"},
                             {"MASTER_ADDR", "braid-gpt-master-0"},
                             {"PET_MASTER_ADDR", "braid-gpt-master-0"},
                             {"WORLD_SIZE", std::to_string(world)},
                             {"RANK", std::to_string(node_rank)},
                             {"PET_NPROC_PER_NODE", nproc},
                             {"PET_NODE_RANK", std::to_string(node_rank)},
                             {"PET_NNODES", "2"}}) {
    env[k] = v;
  }
  return env;
}
const std::vector<std::string> kPyTorchJobArgs = {
    "--job_token_file=/var/run/braid/token", "--config=launcher/configs/gpt-mini-ddp.pbtxt"};

TEST(Kubernetes, PyTorchJobMasterAndWorker) {
  auto master = Plan(kPyTorchJobArgs, PyTorchJobPod("master", 0));
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_EQ(master->source, LayoutSource::kFlags);
  EXPECT_EQ(master->node_rank, 0);
  EXPECT_EQ(master->nnodes, 2);
  EXPECT_EQ(master->world_size, 4);
  EXPECT_EQ(master->num_launchers, 2);
  EXPECT_EQ(master->master_addr, "braid-gpt-master-0");
  EXPECT_EQ(master->master_port, 23456);
  EXPECT_TRUE(master->master_port_given);
  EXPECT_THAT(Workers(*master), ElementsAre(std::make_pair(0, 0), std::make_pair(1, 1)));
  EXPECT_EQ(master->describe, "PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=0");

  auto worker = Plan(kPyTorchJobArgs, PyTorchJobPod("worker", 0));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->node_rank, 1);
  EXPECT_EQ(worker->launcher_id, 1);
  EXPECT_THAT(Workers(*worker), ElementsAre(std::make_pair(2, 0), std::make_pair(3, 1)));
  EXPECT_EQ(worker->master_addr, "braid-gpt-master-0");
}

// Some operator versions give the master pod MASTER_ADDR=localhost: node 0 serves there.
TEST(Kubernetes, PyTorchJobMasterOnLocalhost) {
  EnvMap env = PyTorchJobPod("master", 0);
  env["MASTER_ADDR"] = env["PET_MASTER_ADDR"] = "localhost";
  auto p = Plan(kPyTorchJobArgs, env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->master_addr, "localhost");
}

// nprocPerNode left at its default "auto": one worker per GPU, else per CPU (torchrun's rule);
// the operator then counts one process per pod in WORLD_SIZE.
TEST(Kubernetes, PyTorchJobNprocAuto) {
  auto p = Plan(kPyTorchJobArgs, PyTorchJobPod("worker", 0, "auto", 2), HostFacts{8, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->local_world_size, 8);
  EXPECT_EQ(p->world_size, 16);
  EXPECT_EQ(p->describe, "PET_NNODES=2 PET_NPROC_PER_NODE=8 (auto) PET_NODE_RANK=1");
  p = Plan(kPyTorchJobArgs, PyTorchJobPod("worker", 0, "auto", 2), HostFacts{8, 4});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->world_size, 8);
}

TEST(Kubernetes, PyTorchJobDisagreementsNameBothSources) {
  EXPECT_EQ(Error({"--nnodes=3"}, PyTorchJobPod("master", 0)),
            "--nnodes=3 disagrees with PET_NNODES=2 from the environment; drop the flag or fix "
            "the variable");
  EXPECT_TRUE(Error({"--nnodes=2", "--nproc-per-node=2"}, PyTorchJobPod("master", 0)).empty());
  EnvMap env = PyTorchJobPod("worker", 0);
  env["MASTER_ADDR"] = "elsewhere";
  EXPECT_EQ(Error({}, env),
            "PET_MASTER_ADDR=braid-gpt-master-0 disagrees with MASTER_ADDR=elsewhere in the "
            "environment; set them to the same value, or give --master_addr");
  env = PyTorchJobPod("worker", 0);
  env["MASTER_PORT"] = "1";
  EXPECT_THAT(Error({}, env), HasSubstr("PET_MASTER_PORT=23456 disagrees with MASTER_PORT=1"));
  env = PyTorchJobPod("worker", 0);
  env["RANK"] = "0";
  EXPECT_EQ(Error({}, env),
            "RANK=0 disagrees with PET_NODE_RANK=1 (a pod's RANK is its node rank here); fix one "
            "of them");
  env = PyTorchJobPod("worker", 0);
  env["WORLD_SIZE"] = "5";
  EXPECT_THAT(Error({}, env), HasSubstr("WORLD_SIZE=5 disagrees with PET_NNODES=2 x "
                                        "PET_NPROC_PER_NODE=2 (world size 4)"));
  env = PyTorchJobPod("worker", 0);
  env["JOB_COMPLETION_INDEX"] = "0";
  EXPECT_THAT(Error({}, env), HasSubstr("PET_NODE_RANK=1 disagrees with JOB_COMPLETION_INDEX=0"));
  // An elastic PyTorchJob (PET_NNODES=MIN:MAX) is an elastic job here too (launcher/elastic.h):
  // the bounds reach the flags as --nnodes=1:4 would.
  env = PyTorchJobPod("worker", 0);
  env["PET_NNODES"] = "1:4";
  absl::StatusOr<LaunchFlags> elastic = FlagsWithEnvironment(Flags({}), env, HostFacts{});
  ASSERT_TRUE(elastic.ok()) << elastic.status();
  EXPECT_EQ(elastic->nnodes_min, 1);
  EXPECT_EQ(elastic->nnodes, 4);
  EXPECT_TRUE(elastic->Elastic());
  EXPECT_EQ(elastic->Origin("nnodes"), "PET_NNODES");
}

// Node 0's address on the command line overrides the environment's, as $MASTER_ADDR always could.
TEST(Kubernetes, CommandLineMasterOverridesTheEnvironment) {
  auto p = Plan({"--master_addr=10.0.0.7", "--master_port=999"}, PyTorchJobPod("worker", 0));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->master_addr, "10.0.0.7");
  EXPECT_EQ(p->master_port, 999);
  p = Plan({"--rdzv_endpoint=10.0.0.8:998"}, PyTorchJobPod("worker", 0));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->master_addr, "10.0.0.8");
}

// torchrun reads PET_<FLAG> for any of its flags; the rendezvous ones too.
TEST(Kubernetes, ElasticStyleRendezvousVariables) {
  EnvMap env = {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "1"},
                {"PET_RDZV_ENDPOINT", "braid-gpt-master-0:29400"}, {"PET_RDZV_BACKEND", "c10d"},
                {"PET_RDZV_ID", "job-17"}, {"PET_MAX_RESTARTS", "3"}};
  auto p = Plan({}, env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->master_addr, "braid-gpt-master-0");
  EXPECT_EQ(p->master_port, 29400);
  EXPECT_EQ(p->run_id, "job-17");
  EXPECT_EQ(p->max_restarts, 3);
  env["PET_RDZV_BACKEND"] = "etcd";
  EXPECT_THAT(Error({}, env), HasSubstr("PET_RDZV_BACKEND=etcd: Braid's launchers meet"));
}

// Older operators (and anything speaking torch's env://) give only RANK and WORLD_SIZE.
TEST(TorchEnv, OneWorkerPerProcessOrOneLauncherPerNode) {
  EnvMap env = PodBase("old-worker-0");
  for (auto& [k, v] : EnvMap{{"MASTER_ADDR", "old-master-0"}, {"MASTER_PORT", "23456"},
                             {"WORLD_SIZE", "3"}, {"RANK", "2"}}) {
    env[k] = v;
  }
  auto p = Plan({}, env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, LayoutSource::kTorchEnv);
  EXPECT_EQ(p->world_size, 3);
  EXPECT_EQ(p->num_launchers, 3);
  EXPECT_EQ(p->launcher_id, 2);
  EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(2, 0)));
  EXPECT_EQ(p->master_addr, "old-master-0");
  // One launcher per pod, spawning its workers.
  p = Plan({"--nproc_per_node=2"}, env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->world_size, 6);
  EXPECT_EQ(p->node_rank, 2);
  EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(4, 0), std::make_pair(5, 1)));
  EXPECT_THAT(Error({"--nnodes=2", "--nproc_per_node=2"}, env),
              HasSubstr("--nnodes=2 disagrees with WORLD_SIZE=3"));
  // Several processes per node, as torchrun's own workers see it.
  env["LOCAL_RANK"] = "1";
  env["LOCAL_WORLD_SIZE"] = "3";
  env["WORLD_SIZE"] = "6";
  env["RANK"] = "4";
  p = Plan({}, env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->nnodes, 2);
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->local_world_size, 3);
  EXPECT_THAT(Workers(*p), ElementsAre(std::make_pair(4, 1)));
  // Forced off, the variables are ignored.
  p = Plan({"--scheduler=none"}, env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->world_size, 1);
  EXPECT_THAT(Error({"--scheduler=env"}, {}), HasSubstr("RANK is not set"));
}

TEST(MakeLaunchPlan, StandaloneIgnoresTheEnvironmentsMaster) {
  EnvMap env = {{"MASTER_ADDR", "10.9.9.9"}, {"MASTER_PORT", "4321"}, {"PET_NNODES", "4"}};
  auto p = Plan({"--standalone", "--nproc_per_node=3"}, env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->nnodes, 1);
  EXPECT_EQ(p->world_size, 3);
  EXPECT_EQ(p->master_addr, "127.0.0.1");
  EXPECT_FALSE(p->master_port_given);  // a free port
}

TEST(MakeLaunchPlan, NprocKindsMustBeResolved) {
  auto f = ParseLaunchFlags({"--nproc_per_node=auto"});
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(MakeLaunchPlan(*f, {}).ok());
  auto p = Plan({"--nproc_per_node=gpu"}, {}, HostFacts{4, 2});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->world_size, 2);
}

TEST(DescribePlan, WhatDryRunPrints) {
  auto p = Plan(kIndexedJobArgs, IndexedJobPod(1));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(DescribePlan(*p),
            "layout: --nnodes=2 --nproc_per_node=2 JOB_COMPLETION_INDEX=1 (from flags)\n"
            "world_size=4 nnodes=2 node_rank=1 local_world_size=2\n"
            "launchers=2 launcher_id=1\n"
            "master=braid-gpt-0.braid-gpt:29500\n"
            "worker rank=2 local_rank=0\n"
            "worker rank=3 local_rank=1\n");
  p = Plan({}, {});
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(DescribePlan(*p), HasSubstr("master=127.0.0.1:<free port>\n"));
}

TEST(WorkerEnvironment, TorchrunsNamesToo) {
  auto p = Plan({"--nnodes=2", "--node_rank=1", "--nproc_per_node=2", "--master_addr=a",
                 "--role=trainer", "--rdzv_id=j1", "--max_restarts=2"},
                {});
  ASSERT_TRUE(p.ok()) << p.status();
  EnvMap env = WorkerEnvironment(*p, p->workers[1], "secret", 1);
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["ROLE_NAME"], "trainer");
  EXPECT_EQ(env["ROLE_RANK"], "3");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "4");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "j1");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "2");
}

TEST(WorkerEnvironment, Contract) {
  auto p = MakeLaunchPlan(
      Flags({"--nnodes=2", "--node_rank=1", "--nproc_per_node=3", "--master_addr=10.0.0.1",
             "--master_port=2222"}),
      {});
  ASSERT_TRUE(p.ok());
  EnvMap env = WorkerEnvironment(*p, p->workers[2], "secret", 1);
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["WORLD_SIZE"], "6");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
  EXPECT_EQ(env["NODE_RANK"], "1");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "2222");
  EXPECT_EQ(env["BRAID_JOB_TOKEN"], "secret");
  EXPECT_EQ(env["BRAID_RESTART_COUNT"], "1");
}

}  // namespace
}  // namespace braid::launcher
