#include "launcher/hostfile_launch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdio.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

LaunchFlags Flags(std::vector<std::string> args) {
  auto f = ParseLaunchFlags(args);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : LaunchFlags{};
}

std::string Hostfile(const std::string& text) {
  static int n = 0;
  std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/hosts", n++);
  std::ofstream(path) << text;
  return path;
}

HostfileContext Context() {
  HostfileContext c;
  c.launcher_path = "/opt/braid/launcher/launcher";
  c.cwd = "/home/u/my run";
  c.env = {{"PATH", "/usr/bin"},          {"HOME", "/home/u"},
           {"BRAID_DATA_DIR", "/data"},   {"BRAID_JOB_TOKEN", "s3cret-token"},
           {"OMP_NUM_THREADS", "2"},      {"NCCL_DEBUG", "INFO"},
           {"BRAID_SSH_OPTIONS", "-F /home/u/ssh_config  -o ConnectTimeout=5"}};
  return c;
}

std::vector<NodeStart> Plan(const std::vector<std::string>& args) {
  LaunchFlags f = Flags(args);
  auto nodes = HostfileNodesFor(f);
  EXPECT_TRUE(nodes.ok()) << nodes.status();
  if (!nodes.ok()) return {};
  auto starts = PlanHostfileNodes(f, *nodes, Context());
  EXPECT_TRUE(starts.ok()) << starts.status();
  return starts.ok() ? *starts : std::vector<NodeStart>{};
}

std::string NodesError(const std::vector<std::string>& args) {
  auto nodes = HostfileNodesFor(Flags(args));
  return nodes.ok() ? "" : std::string(nodes.status().message());
}

// What a POSIX shell makes of a command line: its words, one per line.
std::string ShellWords(const std::string& command) {
  std::string script = "for w in " + command + "; do printf '%s\\n' \"$w\"; done";
  std::string cmd = "/bin/sh -c " + ShellQuote(script);
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[256];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  pclose(p);
  return out;
}

TEST(ShellQuote, ASingleWordWhateverItHolds) {
  EXPECT_EQ(ShellQuote("--nnodes=2"), "--nnodes=2");
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote(""), "''");
  for (const std::string w : {"it's", "$HOME", "a;b", "`x`", "\"q\"", "a\\b", "*", "x\ny"}) {
    EXPECT_EQ(ShellWords(ShellQuote(w)), w + "\n") << w;
  }
}

TEST(PlanHostfileNodes, NodeZeroHereTheOthersOverSsh) {
  std::string hosts = Hostfile("w0 slots=2\nw1 slots=2\n");
  std::vector<NodeStart> n = Plan({"--hostfile=" + hosts, "--ssh_port=2222", "--max_restarts=1",
                                   "--log_dir=logs", "--", "--config=c.pbtxt", "--steps=3"});
  ASSERT_EQ(n.size(), 2u);
  EXPECT_TRUE(n[0].local);
  EXPECT_EQ(n[0].host, "w0");
  EXPECT_THAT(n[0].argv,
              ElementsAre("/opt/braid/launcher/launcher", "--nnodes=2", "--node_rank=0",
                          "--nproc_per_node=2", "--master_addr=w0", "--master_port=29500",
                          "--scheduler=none", "--job_token_file=-", "--watch_stdin",
                          "--log_dir=logs", "--max_restarts=1", "--", "--config=c.pbtxt",
                          "--steps=3"));
  EXPECT_TRUE(n[0].env_overrides.empty());
  EXPECT_FALSE(n[1].local);
  ASSERT_EQ(n[1].argv.size(), 12u);
  EXPECT_THAT(std::vector<std::string>(n[1].argv.begin(), n[1].argv.end() - 1),
              ElementsAre("ssh", "-T", "-o", "BatchMode=yes", "-p", "2222", "-F",
                          "/home/u/ssh_config", "-o", "ConnectTimeout=5", "w1"));
  // The remote command, as the remote shell splits it: the Braid and NCCL variables, never the
  // token, then the same launcher as node 0's but for the node rank.
  const std::string& remote = n[1].argv.back();
  EXPECT_THAT(remote, testing::StartsWith("cd '/home/u/my run' && exec env "));
  const std::string words = ShellWords(remote.substr(remote.find("exec ") + 5));
  EXPECT_EQ(words,
            "env\nBRAID_DATA_DIR=/data\nNCCL_DEBUG=INFO\nOMP_NUM_THREADS=2\n"
            "/opt/braid/launcher/launcher\n--nnodes=2\n--node_rank=1\n--nproc_per_node=2\n"
            "--master_addr=w0\n--master_port=29500\n--scheduler=none\n--job_token_file=-\n"
            "--watch_stdin\n--log_dir=logs\n--max_restarts=1\n--\n--config=c.pbtxt\n--steps=3\n");
  // The token travels on standard input only.
  for (const NodeStart& s : n) {
    EXPECT_THAT(absl::StrJoin(s.argv, " "), Not(HasSubstr("s3cret")));
  }
  EXPECT_THAT(DescribeHostfileNodes(n), Not(HasSubstr("s3cret")));
}

TEST(PlanHostfileNodes, MasterAndChosenSlots) {
  std::string hosts = Hostfile("w0 slots=4\nw1 slots=4\nw2 slots=4\n");
  std::vector<NodeStart> n = Plan({"--hostfile", hosts, "--exclude=w0@w2:0,2",
                                   "--master_addr=10.0.0.2", "--master_port=30000",
                                   "--program=./probe", "--nproc_per_node=2"});
  ASSERT_EQ(n.size(), 2u);
  EXPECT_EQ(n[0].host, "w1");  // w0 excluded: w1 is node 0, here
  EXPECT_THAT(n[0].argv, testing::Contains("--master_addr=10.0.0.2"));
  EXPECT_THAT(n[0].argv, testing::Contains("--master_port=30000"));
  EXPECT_THAT(n[0].argv, testing::Contains("--program=./probe"));
  EXPECT_THAT(n[0].argv, testing::Contains("--nproc_per_node=2"));
  // w1 keeps 4 slots, w2 slots 1 and 3: --nproc_per_node=2 takes w1's first two (its own
  // devices 0 and 1, nothing to set) and w2's two, which become its visible devices.
  EXPECT_TRUE(n[0].env_overrides.empty());
  EXPECT_THAT(n[1].argv.back(), HasSubstr(" CUDA_VISIBLE_DEVICES=1,3 "));
}

TEST(HostfileNodesFor, FlagsThatDoNotGoWithAHostfile) {
  std::string hosts = Hostfile("a slots=1\nb slots=1\n");
  EXPECT_THAT(NodesError({"--hostfile=" + hosts, "--node_rank=1"}),
              HasSubstr("--node_rank does not go with --hostfile: the node ranks follow the hostfile's order"));
  EXPECT_THAT(NodesError({"--hostfile=" + hosts, "--nproc_per_node=auto"}),
              HasSubstr("--nproc_per_node=auto does not go with --hostfile"));
  EXPECT_THAT(NodesError({"--hostfile=" + hosts, "--scheduler=slurm"}), HasSubstr("--scheduler does not go"));
  EXPECT_THAT(NodesError({"--hostfile=" + hosts, "--standalone"}), HasSubstr("--standalone does not go"));
  // The hostfile's own errors come through with file and line.
  std::string bad = Hostfile("a slots=1\nb slot=1\n");
  EXPECT_THAT(NodesError({"--hostfile=" + bad}), HasSubstr(bad + ":2: 'b slot=1':"));
  EXPECT_THAT(NodesError({"--hostfile=" + hosts, "--include=c"}), HasSubstr("host 'c' is not in the hostfile"));
  EXPECT_THAT(NodesError({"--hostfile=" + hosts, "--nnodes=3"}), HasSubstr("has only 2 host(s)"));
}

TEST(HostfileNodesFor, NnodesAndNprocPerNodeCut) {
  std::string hosts = Hostfile("w0 slots=4\nw1 slots=4\nw2 slots=2\n");
  std::vector<NodeStart> n = Plan({"--hostfile=" + hosts, "--nnodes=2", "--nproc_per_node=3"});
  ASSERT_EQ(n.size(), 2u);
  EXPECT_THAT(n[0].argv, testing::Contains("--nnodes=2"));
  EXPECT_THAT(n[0].argv, testing::Contains("--nproc_per_node=3"));
  EXPECT_THAT(n[1].argv.back(), Not(HasSubstr("CUDA_VISIBLE_DEVICES")));  // slots 0..2
}

}  // namespace
}  // namespace braid::launcher
