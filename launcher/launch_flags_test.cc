#include "launcher/launch_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace braid::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

LaunchFlags Flags(std::vector<std::string> args) {
  auto f = ParseLaunchFlags(args);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : LaunchFlags{};
}

std::string Error(std::vector<std::string> args) {
  auto f = ParseLaunchFlags(args);
  return f.ok() ? "" : std::string(f.status().message());
}

TEST(ParseLaunchFlags, Defaults) {
  LaunchFlags f = Flags({});
  EXPECT_EQ(f.nnodes, 1);
  EXPECT_EQ(f.node_rank, 0);
  EXPECT_EQ(f.nproc_per_node, 1);
  EXPECT_EQ(f.rdzv_backend, "static");
  EXPECT_EQ(f.rdzv_id, "none");
  EXPECT_EQ(f.role, "default");
  EXPECT_FALSE(f.standalone);
  EXPECT_TRUE(f.console.Default());
  EXPECT_THAT(f.program_args, IsEmpty());
}

// The README's commands: the training program's own flags before "--" still reach it.
TEST(ParseLaunchFlags, TrainingProgramFlagsBeforeDashDashAreKnownPassThroughs) {
  LaunchFlags f = Flags({"--nproc_per_node=2", "--config=launcher/configs/gpt-mini-ddp.pbtxt",
                         "--steps", "50", "--threads=2", "--print_config", "--save-to=w.st",
                         "--", "--strategy=ddp", "positional"});
  EXPECT_EQ(f.nproc_per_node, 2);
  EXPECT_THAT(f.program_args,
              ElementsAre("--config=launcher/configs/gpt-mini-ddp.pbtxt", "--steps=50",
                          "--threads=2", "--print_config", "--save_to=w.st", "--strategy=ddp",
                          "positional"));
  EXPECT_FALSE(f.Given("config"));  // not the launcher's
}

TEST(ParseLaunchFlags, EverythingAfterDashDashIsTheProgramsEvenLauncherFlags) {
  LaunchFlags f = Flags({"--nnodes=2", "--", "--nnodes=7", "--bogus", "x"});
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_THAT(f.program_args, ElementsAre("--nnodes=7", "--bogus", "x"));
}

TEST(ParseLaunchFlags, UnknownFlagIsAnErrorWithDidYouMean) {
  EXPECT_EQ(Error({"--nproc_per_nod=2"}),
            "unknown launcher flag --nproc_per_nod; did you mean --nproc_per_node? Arguments for "
            "the program go after --: launcher [launcher flags] -- --nproc_per_nod=2");
  EXPECT_THAT(Error({"--mastr-addr=x"}), HasSubstr("did you mean --master_addr?"));
  EXPECT_THAT(Error({"--confg=a.pbtxt"}), HasSubstr("did you mean --config?"));
  EXPECT_THAT(Error({"--lr=0.1"}), HasSubstr("unknown launcher flag --lr"));
  EXPECT_THAT(Error({"--lr=0.1"}), Not(HasSubstr("did you mean")));
  EXPECT_THAT(Error({"-x"}), HasSubstr("unknown launcher option -x"));
  // Other launchers' names for the same thing.
  EXPECT_THAT(Error({"--num_gpus=8"}), HasSubstr("did you mean --nproc_per_node?"));
  EXPECT_THAT(Error({"--num_nodes=2"}), HasSubstr("did you mean --nnodes?"));
  EXPECT_THAT(Error({"--machine_rank=1"}), HasSubstr("did you mean --node_rank?"));
  // An abbreviation of one flag.
  EXPECT_THAT(Error({"--heartbeat=5"}), HasSubstr("did you mean --heartbeat_timeout_s?"));
}

TEST(ParseLaunchFlags, DashedSpellings) {
  LaunchFlags f = Flags({"--nproc-per-node=4", "--node-rank=1", "--nnodes=2",
                         "--master-addr=10.0.0.1", "--master-port", "1234", "--max-restarts=3",
                         "--log-dir=/tmp/l", "--rdzv-id=job7", "--rdzv-backend=c10d"});
  EXPECT_EQ(f.nproc_per_node, 4);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.master_addr, "10.0.0.1");
  EXPECT_EQ(f.master_port, 1234);
  EXPECT_EQ(f.max_restarts, 3);
  EXPECT_EQ(f.log_dir, "/tmp/l");
  EXPECT_EQ(f.rdzv_id, "job7");
  EXPECT_EQ(f.rdzv_backend, "c10d");
  EXPECT_TRUE(f.Given("nproc_per_node"));
  EXPECT_EQ(f.Origin("nproc_per_node"), "--nproc_per_node");
}

TEST(ParseLaunchFlags, AllBraidFlags) {
  LaunchFlags f = Flags({"--log_dir=/tmp/l", "--program=/bin/true", "--scheduler=env",
                         "--connect_timeout_s=1.5", "--rdzv_timeout_s=7", "--stop_grace_s=0.5",
                         "--heartbeat_timeout_s=9", "--tail_lines=3", "--job_token_file=/s/t",
                         "--dry_run", "--help"});
  EXPECT_EQ(f.program, "/bin/true");
  EXPECT_EQ(f.scheduler, SchedulerMode::kTorchEnv);
  EXPECT_DOUBLE_EQ(f.connect_timeout_s, 1.5);
  EXPECT_DOUBLE_EQ(f.rdzv_timeout_s, 7);
  EXPECT_DOUBLE_EQ(f.stop_grace_s, 0.5);
  EXPECT_DOUBLE_EQ(f.heartbeat_timeout_s, 9);
  EXPECT_EQ(f.tail_lines, 3);
  EXPECT_EQ(f.job_token_file, "/s/t");
  EXPECT_TRUE(f.dry_run);
  EXPECT_TRUE(f.help);
  EXPECT_TRUE(Flags({"-h"}).help);
}

TEST(ParseLaunchFlags, BadValuesNameTheFlag) {
  EXPECT_THAT(Error({"--nnodes=two"}), HasSubstr("--nnodes wants an integer, got 'two'"));
  EXPECT_THAT(Error({"--nproc_per_node=0"}), HasSubstr("--nproc_per_node"));
  EXPECT_THAT(Error({"--nproc_per_node=xpu"}), HasSubstr("a number >= 1, auto, cpu or gpu"));
  EXPECT_THAT(Error({"--master_port=70000"}), HasSubstr("--master_port"));
  EXPECT_THAT(Error({"--max_restarts=-1"}), HasSubstr("--max_restarts"));
  EXPECT_THAT(Error({"--scheduler=pbs"}), HasSubstr("auto, none, slurm, mpi, env"));
  EXPECT_THAT(Error({"--stop_grace_s=0"}), HasSubstr("--stop_grace_s"));
  EXPECT_THAT(Error({"--node_rank"}), HasSubstr("--node_rank needs a value"));
  EXPECT_THAT(Error({"--standalone=maybe"}), HasSubstr("--standalone wants true or false"));
}

TEST(ParseLaunchFlags, NprocPerNodeKinds) {
  for (const char* k : {"auto", "cpu", "gpu"}) {
    LaunchFlags f = Flags({absl::StrCat("--nproc_per_node=", k)});
    EXPECT_EQ(f.nproc_per_node_kind, k);
    EXPECT_FALSE(f.nproc_resolved);
  }
}

TEST(ResolveNprocPerNode, AsTorchrun) {
  auto resolved = [](const char* kind, HostFacts host) -> std::string {
    LaunchFlags f = Flags({absl::StrCat("--nproc_per_node=", kind)});
    absl::Status st = ResolveNprocPerNode(&f, host);
    return st.ok() ? std::to_string(f.nproc_per_node) : std::string(st.message());
  };
  EXPECT_EQ(resolved("auto", {16, 4}), "4");   // one per GPU
  EXPECT_EQ(resolved("auto", {16, 0}), "16");  // no GPU: one per CPU
  EXPECT_EQ(resolved("cpu", {16, 4}), "16");
  EXPECT_EQ(resolved("gpu", {16, 8}), "8");
  EXPECT_THAT(resolved("gpu", {16, 0}), HasSubstr("--nproc_per_node=gpu: this machine shows no GPU"));
  EXPECT_EQ(resolved("3", {16, 8}), "3");  // a number stays
}

TEST(DetectHost, GpusFromCudaVisibleDevices) {
  EXPECT_EQ(DetectHost({{"CUDA_VISIBLE_DEVICES", "0,1,5"}}).gpus, 3);
  EXPECT_EQ(DetectHost({{"CUDA_VISIBLE_DEVICES", ""}}).gpus, 0);
  EXPECT_GE(DetectHost({}).cpus, 1);
}

TEST(ParseLaunchFlags, RdzvEndpointIsTheMaster) {
  LaunchFlags f = Flags({"--rdzv_endpoint=node0.example:29400", "--nnodes=2"});
  EXPECT_EQ(f.master_addr, "node0.example");
  EXPECT_EQ(f.master_port, 29400);
  EXPECT_EQ(f.Origin("master_addr"), "--rdzv_endpoint");
  EXPECT_TRUE(f.Given("master_port"));
  f = Flags({"--rdzv-endpoint=[fd00::1]:1234"});
  EXPECT_EQ(f.master_addr, "fd00::1");
  EXPECT_EQ(f.master_port, 1234);
  f = Flags({"--rdzv_endpoint=10.0.0.1"});  // no port: the default
  EXPECT_EQ(f.master_addr, "10.0.0.1");
  EXPECT_FALSE(f.Given("master_port"));
  // Agreeing twice is fine; disagreeing names both.
  EXPECT_EQ(Error({"--master_addr=a", "--rdzv_endpoint=a:5"}), "");
  EXPECT_EQ(Error({"--master_addr=a", "--rdzv_endpoint=b:5"}),
            "--master_addr=a disagrees with --rdzv_endpoint=b:5; give node 0's address once");
  EXPECT_THAT(Error({"--rdzv_endpoint=a:5", "--master_port=6"}),
              HasSubstr("--rdzv_endpoint=5 disagrees with --master_port=6"));
  EXPECT_THAT(Error({"--rdzv_endpoint=a:http"}), HasSubstr("--rdzv_endpoint wants a port"));
}

TEST(ParseLaunchFlags, RdzvBackend) {
  EXPECT_EQ(Flags({"--rdzv_backend=static"}).rdzv_backend, "static");
  EXPECT_EQ(Flags({"--rdzv_backend=c10d"}).rdzv_backend, "c10d");
  EXPECT_THAT(Error({"--rdzv_backend=etcd"}), HasSubstr("--rdzv_backend=etcd: Braid's launchers meet "
                                                        "in their own store"));
  EXPECT_THAT(Error({"--rdzv_backend=etcd-v2"}), HasSubstr("there is no etcd backend"));
  EXPECT_THAT(Error({"--rdzv_backend=zk"}), HasSubstr("static or c10d"));
}

TEST(ParseLaunchFlags, Standalone) {
  LaunchFlags f = Flags({"--standalone", "--nproc-per-node=2"});
  EXPECT_TRUE(f.standalone);
  EXPECT_TRUE(Flags({"--standalone", "--nnodes=1"}).standalone);
  EXPECT_THAT(Error({"--standalone", "--nnodes=2"}),
              HasSubstr("--standalone is a job of one node, but --nnodes=2"));
  EXPECT_THAT(Error({"--standalone", "--rdzv_endpoint=h:1"}),
              HasSubstr("--standalone serves the store on a free port of this machine, so "
                        "--rdzv_endpoint has nothing to say"));
  EXPECT_THAT(Error({"--master_port=5", "--standalone"}), HasSubstr("--master_port"));
}

TEST(ParseLaunchFlags, ElasticNodeCounts) {
  LaunchFlags fixed = Flags({"--nnodes=2:2"});
  EXPECT_EQ(fixed.nnodes, 2);
  EXPECT_FALSE(fixed.Elastic());
  EXPECT_EQ(LaunchFlagValue(fixed, "nnodes"), "2");
  LaunchFlags n = Flags({"--nnodes=3"});
  EXPECT_EQ(n.nnodes_min, 3);
  EXPECT_FALSE(n.Elastic());
  LaunchFlags e = Flags({"--nnodes=1:4", "--rdzv_last_call_s=2.5"});
  EXPECT_TRUE(e.Elastic());
  EXPECT_EQ(e.nnodes_min, 1);
  EXPECT_EQ(e.nnodes, 4);
  EXPECT_EQ(e.rdzv_last_call_s, 2.5);
  EXPECT_EQ(LaunchFlagValue(e, "nnodes"), "1:4");
  EXPECT_EQ(Flags({}).rdzv_last_call_s, 30);
  EXPECT_THAT(Error({"--nnodes=4:2"}), HasSubstr("--nnodes=4:2: MIN (4) is above MAX (2); write --nnodes=2:4"));
  EXPECT_THAT(Error({"--nnodes=0:2"}), HasSubstr("--nnodes"));
  EXPECT_THAT(Error({"--nnodes=1:2:3"}), HasSubstr("a number of nodes, or MIN:MAX"));
  EXPECT_THAT(Error({"--nnodes=1:2", "--hostfile=h"}),
              HasSubstr("--nnodes=1:2 (elastic) does not go with --hostfile"));
}

TEST(ParseLaunchFlags, TorchrunFlagsWithoutEffectAreAccepted) {
  LaunchFlags f = Flags({"--monitor-interval=0.1", "--start-method=spawn", "--no-python",
                         "--no_local_rank", "--role=trainer"});
  EXPECT_EQ(f.role, "trainer");
  EXPECT_THAT(Error({"--start_method=thread"}), HasSubstr("spawn, fork or forkserver"));
  EXPECT_THAT(Error({"--role=a b"}), HasSubstr("--role wants a name"));
}

TEST(ParseLaunchFlags, RefusedFlagsSayWhy) {
  EXPECT_THAT(Error({"--rdzv_conf=join_timeout=5"}),
              HasSubstr("--rdzv_conf is not supported: Braid's rendezvous takes no options"));
  EXPECT_THAT(Error({"-m", "pkg.train"}), HasSubstr("--module is not supported"));
  EXPECT_THAT(Error({"--run-path"}), HasSubstr("--run_path is not supported"));
  EXPECT_THAT(Error({"--launcher=pdsh"}), HasSubstr("--hostfile starts the nodes over OpenSSH"));
  EXPECT_THAT(Error({"--local_addr=x"}), HasSubstr("--local_addr is not supported"));
}

TEST(ParseLaunchFlags, HostfileFlagsAsDeepSpeed) {
  LaunchFlags f = Flags({"--hostfile", "hosts", "--include=a:0,1@b", "--ssh_port=2222",
                         "--max-restarts=1", "--watch_stdin", "--", "--config=x"});
  EXPECT_EQ(f.hostfile, "hosts");
  EXPECT_EQ(f.include, "a:0,1@b");
  EXPECT_EQ(f.ssh_port, 2222);
  EXPECT_TRUE(f.watch_stdin);
  // What the command line said, by canonical name: passed on to every node's launcher.
  EXPECT_EQ(f.command_line.at("hostfile"), "hosts");
  EXPECT_EQ(f.command_line.at("max_restarts"), "1");
  EXPECT_EQ(f.command_line.at("watch_stdin"), "true");
  EXPECT_THAT(Error({"--include=a"}), HasSubstr("--include selects hosts of a --hostfile, but no --hostfile was given"));
  EXPECT_THAT(Error({"--hostfile=h", "--ssh_port=0"}), HasSubstr("--ssh_port wants a port in 1..65535"));
  EXPECT_THAT(Error({"--hostfile="}), HasSubstr("--hostfile wants the path of a hostfile"));
}

TEST(ParseLaunchFlags, PositionalProgramAsTorchrun) {
  LaunchFlags f = Flags({"--nproc_per_node=2", "./my_prog", "--lr=0.1", "--nnodes=9", "--", "x"});
  EXPECT_EQ(f.program, "./my_prog");
  EXPECT_EQ(f.nnodes, 1);  // after the program, everything is its
  EXPECT_THAT(f.program_args, ElementsAre("--lr=0.1", "--nnodes=9", "--", "x"));
  EXPECT_THAT(Error({"--program=/bin/a", "./b"}), HasSubstr("two programs"));
  // The training program's flags before "--" belong to it alone.
  EXPECT_THAT(Error({"--config=a.pbtxt", "--program=/bin/sh"}),
              HasSubstr("--config is a flag of the training program (//launcher:train), but this "
                        "launcher runs /bin/sh"));
}

TEST(ParseLaunchFlags, ConsoleFlags) {
  LaunchFlags f = Flags({"--tee=3", "-r", "0:3,1:0", "--local-ranks-filter=0,2"});
  EXPECT_EQ(f.console.tee, (std::map<int, int>{{-1, 3}}));
  EXPECT_EQ(f.console.redirects, (std::map<int, int>{{0, 3}, {1, 0}}));
  EXPECT_THAT(f.console.local_ranks_filter, ElementsAre(0, 2));
  EXPECT_EQ(Flags({"-t3"}).console.tee, (std::map<int, int>{{-1, 3}}));
  EXPECT_THAT(Error({"--tee=1"}), HasSubstr("keeps a worker's stdout and stderr together in one log"));
  EXPECT_THAT(Error({"--redirects=0:2"}), HasSubstr("use 3 for both, or 0"));
  EXPECT_THAT(Error({"--tee=7"}), HasSubstr("--tee wants 0 (none), 3"));
  EXPECT_THAT(Error({"--local_ranks_filter=a"}), HasSubstr("--local_ranks_filter wants local ranks"));
}

TEST(ConsoleFor, DefaultIsRankZeroAloneUnprefixed) {
  ConsoleSpec c;
  ConsoleChoice r0 = ConsoleFor(c, "default", 0, 0);
  EXPECT_TRUE(r0.echo);
  EXPECT_TRUE(r0.tty_ok);
  EXPECT_EQ(r0.prefix, "");
  EXPECT_FALSE(ConsoleFor(c, "default", 1, 1).echo);
  EXPECT_FALSE(ConsoleFor(c, "default", 4, 0).echo);  // local rank 0 of node 1
}

TEST(ConsoleFor, TeeFilterRedirects) {
  ConsoleSpec tee_all;
  tee_all.tee = {{-1, 3}};
  for (int lr = 0; lr < 3; ++lr) {
    ConsoleChoice c = ConsoleFor(tee_all, "trainer", 4 + lr, lr);
    EXPECT_TRUE(c.echo);
    EXPECT_FALSE(c.tty_ok);  // several ranks share the console: pipes, whole lines
    EXPECT_EQ(c.prefix, absl::StrCat("[trainer", 4 + lr, "]:"));
  }
  ConsoleSpec filter;
  filter.local_ranks_filter = {1};
  EXPECT_FALSE(ConsoleFor(filter, "default", 0, 0).echo);
  EXPECT_TRUE(ConsoleFor(filter, "default", 1, 1).echo);
  ConsoleSpec tee_filtered = tee_all;
  tee_filtered.local_ranks_filter = {0, 2};
  EXPECT_TRUE(ConsoleFor(tee_filtered, "default", 0, 0).echo);
  EXPECT_FALSE(ConsoleFor(tee_filtered, "default", 1, 1).echo);
  EXPECT_TRUE(ConsoleFor(tee_filtered, "default", 2, 2).echo);
  ConsoleSpec redirect_all;
  redirect_all.redirects = {{-1, 3}};
  EXPECT_FALSE(ConsoleFor(redirect_all, "default", 0, 0).echo);  // logs only
  ConsoleSpec per_rank;
  per_rank.tee = {{0, 0}, {1, 3}};
  EXPECT_FALSE(ConsoleFor(per_rank, "default", 0, 0).echo);
  EXPECT_TRUE(ConsoleFor(per_rank, "default", 1, 1).echo);
}

TEST(SetLaunchFlag, NamesTheEnvironmentVariable) {
  LaunchFlags f;
  absl::Status st = SetLaunchFlag(&f, "nnodes", "x", "PET_NNODES");
  EXPECT_EQ(st.message(), "PET_NNODES wants an integer, got 'x'");
  ASSERT_TRUE(SetLaunchFlag(&f, "nnodes", "3", "PET_NNODES").ok());
  EXPECT_EQ(f.nnodes, 3);
  EXPECT_EQ(f.Origin("nnodes"), "PET_NNODES");
  EXPECT_EQ(LaunchFlagValue(f, "nnodes"), "3");
}

TEST(LauncherUsage, NamesTheTrainingProgramsFlags) {
  const std::string usage = LauncherUsage();
  for (const std::string& flag : TrainingProgramFlags()) {
    EXPECT_THAT(usage, HasSubstr("--" + flag)) << flag;
  }
}

}  // namespace
}  // namespace braid::launcher
