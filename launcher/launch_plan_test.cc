#include "launcher/launch_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace braid::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

LaunchFlags Flags(std::vector<std::string> args) {
  auto f = ParseLaunchFlags(args);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : LaunchFlags{};
}

std::string Error(std::vector<std::string> args, const EnvMap& env = {}) {
  auto f = ParseLaunchFlags(args);
  if (!f.ok()) return std::string(f.status().message());
  auto p = MakeLaunchPlan(*f, env);
  return p.ok() ? "" : std::string(p.status().message());
}

std::vector<std::pair<int, int>> Workers(const LaunchPlan& p) {
  std::vector<std::pair<int, int>> out;
  for (const WorkerPlan& w : p.workers) out.push_back({w.rank, w.local_rank});
  return out;
}

TEST(ParseLaunchFlags, Defaults) {
  LaunchFlags f = Flags({});
  EXPECT_EQ(f.nnodes, 1);
  EXPECT_EQ(f.node_rank, 0);
  EXPECT_EQ(f.nproc_per_node, 1);
  EXPECT_EQ(f.max_restarts, 0);
  EXPECT_TRUE(f.program.empty());
  EXPECT_TRUE(f.program_args.empty());
  EXPECT_FALSE(f.help);
}

TEST(ParseLaunchFlags, LauncherFlagsBeforeDashDashProgramFlagsEverywhere) {
  LaunchFlags f = Flags({"--nnodes=2", "--config=a.pbtxt", "--node_rank", "1", "--steps=3",
                         "positional", "--nproc_per_node=4", "--", "--nnodes=7", "--log_dir=x"});
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.nproc_per_node, 4);
  // Unknown flags before "--" and everything after it belong to the program, in order.
  EXPECT_THAT(f.program_args,
              ElementsAre("--config=a.pbtxt", "--steps=3", "positional", "--nnodes=7", "--log_dir=x"));
  EXPECT_TRUE(f.Given("nnodes"));
  EXPECT_TRUE(f.Given("node_rank"));
  EXPECT_FALSE(f.Given("master_port"));
}

TEST(ParseLaunchFlags, AllLauncherFlags) {
  LaunchFlags f = Flags({"--master_addr=10.1.2.3", "--master_port=1234", "--log_dir=/tmp/l",
                         "--max_restarts=2", "--program=/bin/true", "--scheduler=none",
                         "--connect_timeout_s=1.5", "--rdzv_timeout_s=7", "--stop_grace_s=0.5",
                         "--heartbeat_timeout_s=9", "--tail_lines=3", "--help"});
  EXPECT_EQ(f.master_addr, "10.1.2.3");
  EXPECT_EQ(f.master_port, 1234);
  EXPECT_EQ(f.log_dir, "/tmp/l");
  EXPECT_EQ(f.max_restarts, 2);
  EXPECT_EQ(f.program, "/bin/true");
  EXPECT_EQ(f.scheduler, SchedulerMode::kNone);
  EXPECT_DOUBLE_EQ(f.connect_timeout_s, 1.5);
  EXPECT_DOUBLE_EQ(f.rdzv_timeout_s, 7);
  EXPECT_DOUBLE_EQ(f.stop_grace_s, 0.5);
  EXPECT_DOUBLE_EQ(f.heartbeat_timeout_s, 9);
  EXPECT_EQ(f.tail_lines, 3);
  EXPECT_TRUE(f.help);
}

TEST(ParseLaunchFlags, BadValuesNameTheFlag) {
  EXPECT_THAT(Error({"--nnodes=two"}), HasSubstr("--nnodes wants an integer, got 'two'"));
  EXPECT_THAT(Error({"--nproc_per_node=0"}), HasSubstr("--nproc_per_node"));
  EXPECT_THAT(Error({"--master_port=70000"}), HasSubstr("--master_port"));
  EXPECT_THAT(Error({"--max_restarts=-1"}), HasSubstr("--max_restarts"));
  EXPECT_THAT(Error({"--scheduler=pbs"}), HasSubstr("auto, none, slurm, mpi"));
  EXPECT_THAT(Error({"--stop_grace_s=0"}), HasSubstr("--stop_grace_s"));
  EXPECT_THAT(Error({"--node_rank"}), HasSubstr("--node_rank needs a value"));
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
  auto p = MakeLaunchPlan(Flags({"--nnodes=2", "--node_rank=1"}), env);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->master_addr, "10.9.9.9");
  EXPECT_EQ(p->master_port, 4321);
  EXPECT_TRUE(p->master_port_given);
  p = MakeLaunchPlan(Flags({"--master_addr=10.1.1.1", "--master_port=555"}), env);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->master_addr, "10.1.1.1");
  EXPECT_EQ(p->master_port, 555);
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
  EXPECT_THAT(Error({"--scheduler=mpi"}), HasSubstr("OMPI_COMM_WORLD_RANK is not set"));
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
