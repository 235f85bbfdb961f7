#include "launcher/hostfile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace braid::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<HostSlots> Parse(const std::string& text) {
  auto h = ParseHostfile(text, "hosts");
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : std::vector<HostSlots>{};
}

std::string ParseError(const std::string& text) {
  auto h = ParseHostfile(text, "hosts");
  return h.ok() ? "" : std::string(h.status().message());
}

// "host:slot,slot host2:slot" for compact expectations.
std::string Show(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const HostSlots& h : hosts) {
    if (!out.empty()) out += " ";
    out += h.host + ":";
    for (size_t i = 0; i < h.slots.size(); ++i) out += (i ? "," : "") + std::to_string(h.slots[i]);
  }
  return out;
}

TEST(ParseHostfile, DeepSpeedsFormWithCommentsAndBlankLines) {
  auto h = Parse(
      "# two machines\n"
      "worker-0 slots=4\n"
      "\n"
      "   worker-1\tslots=2   # the small one\n"
      "10.0.0.3 slots=1");  // no final newline
  EXPECT_EQ(Show(h), "worker-0:0,1,2,3 worker-1:0,1 10.0.0.3:0");
}

TEST(ParseHostfile, BadLinesNameTheFileAndLine) {
  EXPECT_EQ(ParseError("a slots=1\nb slots=x\n"),
            "hosts:2: 'b slots=x': the slots must be written slots=N with N a number >= 1 (each "
            "line is 'HOST slots=N', e.g. 'worker-1 slots=4'; '#' starts a comment)");
  EXPECT_THAT(ParseError("a slots=1\n\n# c\nb\n"), HasSubstr("hosts:4: 'b': expected a host and its slots"));
  EXPECT_THAT(ParseError("a slots=0"), HasSubstr("hosts:1: 'a slots=0': the slots must be"));
  EXPECT_THAT(ParseError("a slots=-2"), HasSubstr("hosts:1:"));
  EXPECT_THAT(ParseError("a 4"), HasSubstr("hosts:1: 'a 4': the slots must be written slots=N"));
  EXPECT_THAT(ParseError("a slots=1 extra"), HasSubstr("hosts:1: 'a slots=1 extra': expected a host and its slots"));
  EXPECT_THAT(ParseError("a slots=1\nb slots=1\na slots=2\n"),
              HasSubstr("hosts:3: 'a slots=2': a is listed twice (first on line 1)"));
  EXPECT_THAT(ParseError("-oProxyCommand=x slots=1"), HasSubstr("may not start with '-'"));
  EXPECT_THAT(ParseError("a@b slots=1"), HasSubstr("hosts:1:"));
  EXPECT_EQ(ParseError("# nothing\n\n"), "hosts: lists no host; write one line per host, 'HOST slots=N'");
  EXPECT_THAT(ParseError(""), HasSubstr("lists no host"));
}

TEST(ReadHostfile, MissingFile) {
  auto h = ReadHostfile("/nonexistent/braid-hostfile");
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("--hostfile=/nonexistent/braid-hostfile: cannot read it"));
}

const char kHosts[] = "worker-0 slots=4\nworker-1 slots=4\nworker-2 slots=2\n";

std::string Filtered(const std::string& include, const std::string& exclude) {
  auto f = FilterHosts(Parse(kHosts), include, exclude);
  return f.ok() ? Show(*f) : "error: " + std::string(f.status().message());
}

TEST(FilterHosts, IncludeAsDeepSpeed) {
  EXPECT_EQ(Filtered("", ""), "worker-0:0,1,2,3 worker-1:0,1,2,3 worker-2:0,1");
  EXPECT_EQ(Filtered("worker-1", ""), "worker-1:0,1,2,3");
  // The hostfile's order, whatever the filter's; slots sorted, repeats dropped.
  EXPECT_EQ(Filtered("worker-2@worker-0:2,0,2", ""), "worker-0:0,2 worker-2:0,1");
}

TEST(FilterHosts, ExcludeAsDeepSpeed) {
  EXPECT_EQ(Filtered("", "worker-1:0,3"), "worker-0:0,1,2,3 worker-1:1,2 worker-2:0,1");
  EXPECT_EQ(Filtered("", "worker-0@worker-2:1"), "worker-1:0,1,2,3 worker-2:0");
  // A host left without slots is no node.
  EXPECT_EQ(Filtered("", "worker-2:0,1"), "worker-0:0,1,2,3 worker-1:0,1,2,3");
}

TEST(FilterHosts, Errors) {
  EXPECT_EQ(Filtered("worker-0", "worker-1"),
            "error: --include and --exclude were both given; give one of them (DeepSpeed's rule too)");
  EXPECT_EQ(Filtered("worker-9", ""),
            "error: --include=worker-9: host 'worker-9' is not in the hostfile (it lists worker-0, "
            "worker-1, worker-2)");
  EXPECT_EQ(Filtered("", "worker-2:2"),
            "error: --exclude=worker-2:2: host worker-2 has no slot 2 (the hostfile gives it "
            "slots=2: 0..1)");
  EXPECT_THAT(Filtered("worker-0:a", ""), HasSubstr("'worker-0:a': slots are numbers"));
  EXPECT_THAT(Filtered("worker-0@", ""), HasSubstr("an empty host"));
  EXPECT_EQ(Filtered("", "worker-0@worker-1@worker-2"),
            "error: --exclude=worker-0@worker-1@worker-2 leaves no host to run on");
}

TEST(SelectNodes, AllSlotsMustMatch) {
  auto n = SelectNodes(Parse("a slots=2\nb slots=2\n"), 0, 0);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->nproc_per_node, 2);
  EXPECT_EQ(Show(n->nodes), "a:0,1 b:0,1");
  auto uneven = SelectNodes(Parse(kHosts), 0, 0);
  ASSERT_FALSE(uneven.ok());
  EXPECT_THAT(uneven.status().message(),
              HasSubstr("the hosts have different numbers of slots (worker-0: 4, worker-1: 4, "
                        "worker-2: 2); Braid starts the same number of workers on every node"));
}

TEST(SelectNodes, NnodesAndNprocPerNodeTakeTheFirst) {
  // DeepSpeed's --num_nodes and --num_gpus: the first hosts, the first slots of each.
  auto n = SelectNodes(Parse(kHosts), 2, 0);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(Show(n->nodes), "worker-0:0,1,2,3 worker-1:0,1,2,3");
  n = SelectNodes(Parse(kHosts), 0, 2);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->nproc_per_node, 2);
  EXPECT_EQ(Show(n->nodes), "worker-0:0,1 worker-1:0,1 worker-2:0,1");
  EXPECT_THAT(SelectNodes(Parse(kHosts), 4, 0).status().message(),
              HasSubstr("--nnodes=4 but the hostfile (after --include/--exclude) has only 3 host(s)"));
  EXPECT_THAT(SelectNodes(Parse(kHosts), 0, 3).status().message(),
              HasSubstr("--nproc_per_node=3 but host worker-2 has only 2 slot(s)"));
}

TEST(SelectNodes, AfterAFilter) {
  auto f = FilterHosts(Parse(kHosts), "worker-0:1,3@worker-2", "");
  ASSERT_TRUE(f.ok()) << f.status();
  auto n = SelectNodes(*f, 0, 0);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->nproc_per_node, 2);
  EXPECT_EQ(Show(n->nodes), "worker-0:1,3 worker-2:0,1");
}

}  // namespace
}  // namespace braid::launcher
