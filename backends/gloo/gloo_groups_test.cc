// The Gloo communicator beyond single collectives: loading and registration, sub-groups,
// asynchronous operation and overlap (point-to-point messages: gloo_p2p_test).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "backends/gloo/test_util.h"
#include "core/communicator.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::gloo_test {
namespace {

using ::testing::HasSubstr;

TEST(GlooPluginTest, RegistersTheGlooCommunicator) {
  ASSERT_TRUE(LoadPlugin(GlooPluginPath(), {}).ok());
  EXPECT_TRUE(Registry::Get().HasCommunicator("gloo"));
  FileStore store(FreshDir());
  // A world of one needs no peers. Still in a child: this process must stay thread-free for
  // the forks of the tests that follow.
  RunRanks(1, [&](int rank) {
    auto comm = MakeGloo(0, 1, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->name(), "gloo");
    EXPECT_EQ((*comm)->rank(), 0);
    EXPECT_EQ((*comm)->size(), 1);
    Tensor x = Input(DType::kF32, 0, 10, 1);
    ASSERT_TRUE((*comm)->AllReduce(x, ReduceOp::kAvg)->Wait().ok());
    EXPECT_TRUE(SameValues(x, Input(DType::kF32, 0, 10, 1)));
    Tensor out = Tensor::Zeros({10}, DType::kF32);
    ASSERT_TRUE((*comm)->AllGather(x, out)->Wait().ok());
    EXPECT_TRUE(SameValues(out, x));
    ASSERT_TRUE((*comm)->ReduceScatter(x, out, ReduceOp::kMax)->Wait().ok());
    EXPECT_TRUE(SameValues(out, x));
    ASSERT_TRUE((*comm)->Broadcast(x, 0)->Wait().ok());
    ASSERT_TRUE((*comm)->Reduce(x, 0, ReduceOp::kMin)->Wait().ok());
    EXPECT_TRUE(SameValues(x, Input(DType::kF32, 0, 10, 1)));
    EXPECT_TRUE((*comm)->Barrier()->Wait().ok());
  });
}

// Refused before any thread or socket exists, so this may run in the test process itself.
TEST(GlooPluginTest, BadOptionsAreRefusedByName) {
  ASSERT_TRUE(LoadPlugin(GlooPluginPath(), {}).ok());
  FileStore store(FreshDir());
  auto typo = MakeGloo(0, 1, &store, absl::Seconds(5), {{"hostnmae", "127.0.0.1"}});
  ASSERT_FALSE(typo.ok());
  EXPECT_THAT(std::string(typo.status().message()),
              HasSubstr("unknown gloo communicator option 'hostnmae'"));
  auto algo = MakeGloo(0, 1, &store, absl::Seconds(5), {{"allreduce_algorithm", "tree"}});
  ASSERT_FALSE(algo.ok());
  EXPECT_THAT(std::string(algo.status().message()), HasSubstr("allreduce_algorithm='tree'"));
  auto shm = MakeGloo(0, 1, &store, absl::Seconds(5), {{"shm", "maybe"}});
  EXPECT_THAT(std::string(shm.status().message()), HasSubstr("shm='maybe': use on or off"));
  auto ring = MakeGloo(0, 1, &store, absl::Seconds(5), {{"shm_ring_bytes", "8"}});
  EXPECT_THAT(std::string(ring.status().message()), HasSubstr("shm_ring_bytes='8' must be"));
  auto both =
      MakeGloo(0, 1, &store, absl::Seconds(5), {{"hostname", "127.0.0.1"}, {"iface", "lo"}});
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  CommunicatorOptions o;
  o.rank = 3;
  o.size = 2;
  o.store = &store;
  auto range = Registry::Get().MakeCommunicator("gloo", o);
  ASSERT_FALSE(range.ok());
  EXPECT_THAT(std::string(range.status().message()), HasSubstr("rank 3 is out of range"));
}

// The transport refuses an address or interface it cannot use; the error names it. (In a child:
// a transport device may start a thread, and this process must stay thread-free for forks.)
TEST(GlooPluginTest, UnusableAddressesAreNamed) {
  FileStore store(FreshDir());
  RunRanks(1, [&](int rank) {
    auto host = MakeGloo(0, 1, &store, absl::Seconds(5), {{"hostname", "no-such-host.invalid"}});
    ASSERT_FALSE(host.ok());
    EXPECT_THAT(std::string(host.status().message()), HasSubstr("hostname 'no-such-host.invalid'"));
    auto iface = MakeGloo(0, 1, &store, absl::Seconds(5), {{"iface", "nosuchif0"}});
    ASSERT_FALSE(iface.ok());
    EXPECT_THAT(std::string(iface.status().message()), HasSubstr("interface 'nosuchif0'"));
    // Loopback by interface name works.
    auto lo = MakeGloo(0, 1, &store, absl::Seconds(5), {{"iface", "lo"}});
    EXPECT_TRUE(lo.ok()) << lo.status();
  });
}

class GroupsTest : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

// Members pass the same list (in an order that differs from rank order, so the sub-group's
// numbering follows the list); non-members get nullptr; results cover only the members.
TEST_P(GroupsTest, SubGroupsReduceOverTheirMembersOnly) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    auto world_comm = MakeGloo(rank, n, &store);
    ASSERT_TRUE(world_comm.ok()) << world_comm.status();
    Communicator& w = **world_comm;
    const std::vector<int> members = {n - 1, 0};  // the last rank and rank 0, in that order
    auto sub = w.NewGroup(members);
    ASSERT_TRUE(sub.ok()) << sub.status();
    const bool member = rank == 0 || rank == n - 1;
    ASSERT_EQ(*sub != nullptr, member);
    // Everyone else makes the complementary group (for n = 2 that is empty: skip).
    std::vector<int> rest;
    for (int r = 1; r < n - 1; ++r) rest.push_back(r);
    std::unique_ptr<Communicator> other;
    if (!rest.empty()) {
      auto o = w.NewGroup(rest);
      ASSERT_TRUE(o.ok()) << o.status();
      other = std::move(*o);
      ASSERT_EQ(other != nullptr, !member);
    }
    // World and sub-group collectives in flight together.
    Tensor wx = Input(DType::kF32, rank, 1000, 11);
    auto wwork = w.AllReduce(wx, ReduceOp::kSum);
    if (member) {
      Communicator& s = **sub;
      EXPECT_EQ(s.size(), 2);
      EXPECT_EQ(s.rank(), rank == n - 1 ? 0 : 1);
      Tensor x = Input(DType::kI64, rank, 777, 12);
      ASSERT_TRUE(s.AllReduce(x, ReduceOp::kSum)->Wait().ok());
      EXPECT_TRUE(SameValues(x, SerialReduce(DType::kI64, ReduceOp::kSum, {n - 1, 0}, 777, 12)));
      Tensor g = Tensor::Zeros({2 * 5}, DType::kBF16);
      ASSERT_TRUE(s.AllGather(Input(DType::kBF16, rank, 5, 13), g)->Wait().ok());
      EXPECT_TRUE(SameValues(Range(g, 0, 5), Input(DType::kBF16, n - 1, 5, 13)));
      EXPECT_TRUE(SameValues(Range(g, 5, 5), Input(DType::kBF16, 0, 5, 13)));
      // A sub-group of the sub-group: its member 0 (world rank n - 1) alone.
      auto single = s.NewGroup({0});
      ASSERT_TRUE(single.ok()) << single.status();
      EXPECT_EQ(*single != nullptr, rank == n - 1);
      if (*single != nullptr) {
        Tensor y = Input(DType::kF32, rank, 3, 14);
        ASSERT_TRUE((*single)->AllReduce(y, ReduceOp::kSum)->Wait().ok());
        EXPECT_TRUE(SameValues(y, Input(DType::kF32, rank, 3, 14)));
      }
    } else if (other != nullptr) {
      Tensor x = Input(DType::kF32, rank, 50, 15);
      ASSERT_TRUE(other->AllReduce(x, ReduceOp::kMax)->Wait().ok());
      EXPECT_TRUE(SameValues(x, SerialReduce(DType::kF32, ReduceOp::kMax, rest, 50, 15)));
    }
    ASSERT_TRUE(wwork->Wait().ok());
    std::vector<int> all;
    for (int r = 0; r < n; ++r) all.push_back(r);
    EXPECT_TRUE(SameValues(wx, SerialReduce(DType::kF32, ReduceOp::kSum, all, 1000, 11)));
  });
}

TEST_P(GroupsTest, InvalidMemberListsAreRefused) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    auto comm = MakeGloo(rank, n, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    auto dup = (*comm)->NewGroup({0, 0});
    EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(dup.status().message()), HasSubstr("listed twice"));
    auto range = (*comm)->NewGroup({0, n});
    EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument);
    // The communicator is still usable: refused lists never reach the other ranks.
    Tensor x = Input(DType::kI32, rank, 4, 16);
    EXPECT_TRUE((*comm)->AllReduce(x, ReduceOp::kSum)->Wait().ok());
  });
}

// Members that pass different lists for one NewGroup are told so, naming both lists.
TEST(GroupsTest2, MembersDisagreeingOnTheListAreTold) {
  FileStore store(FreshDir());
  RunRanks(3, [&](int rank) {
    auto comm = MakeGloo(rank, 3, &store, absl::Seconds(5));
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<int> list = rank == 0 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2};
    auto sub = (*comm)->NewGroup(list);
    if (rank == 0 || rank == 1) {
      ASSERT_FALSE(sub.ok());
      EXPECT_THAT(std::string(sub.status().message()), HasSubstr("ranks=0,1"));
      EXPECT_THAT(std::string(sub.status().message()), HasSubstr("ranks=0,1,2"));
    }
  });
}

// Calls return at once: rank 0 issues every call, and sees none of those that need rank 1
// complete, while rank 1 has not even posted its side: rank 1 waits on a latch that rank 0
// releases only after issuing them (a call that blocked until every rank had called it would
// keep the latch shut and fail the test, not slow it down). Then several collectives and
// point-to-point messages in flight complete correctly whichever one is waited for first.
TEST_P(GroupsTest, CallsReturnAtOnceAndOverlap) {
  const int n = world();
  FileStore store(FreshDir());
  FileStore latch(FreshDir("latch"));
  RunRanks(n, [&](int rank) {
    auto comm = MakeGloo(rank, n, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    Communicator& c = **comm;
    ASSERT_TRUE(c.Barrier()->Wait().ok());
    if (rank == 1) {
      absl::Status opened = latch.Wait({"rank0_issued"}, absl::Seconds(60));
      ASSERT_TRUE(opened.ok()) << "rank 0 never finished issuing its calls (did one block until "
                                  "rank 1 joined it?): "
                               << opened;
    }
    Tensor a = Input(DType::kF32, rank, 1 << 16, 50);
    Tensor b = Input(DType::kBF16, rank, 1000, 51);
    Tensor gathered = Tensor::Zeros({3 * n}, DType::kI32);
    Tensor rs_out = Tensor::Zeros({2}, DType::kF32);
    Tensor rs_in = Input(DType::kF32, rank, 2 * n, 53);
    Tensor to_right = Input(DType::kF32, rank, 5000, 54);
    Tensor from_left = Tensor::Zeros({5000}, DType::kF32);
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    auto wa = c.AllReduce(a, ReduceOp::kSum);
    auto ws = c.Send(to_right, right, 1);  // point-to-point in flight with the collectives
    auto wb = c.AllReduce(b, ReduceOp::kAvg);
    auto wg = c.AllGather(Input(DType::kI32, rank, 3, 52), gathered);
    auto wv = c.Recv(from_left, left, 1);
    auto wr = c.ReduceScatter(rs_in, rs_out, ReduceOp::kMin);
    if (rank == 0) {
      // Rank 1 is still held at the latch: every collective needs it, so none can be done.
      EXPECT_FALSE(wa->IsCompleted()) << "completed while rank 1 had not called it yet";
      EXPECT_FALSE(wb->IsCompleted()) << "completed while rank 1 had not called it yet";
      EXPECT_FALSE(wg->IsCompleted()) << "completed while rank 1 had not called it yet";
      EXPECT_FALSE(wr->IsCompleted()) << "completed while rank 1 had not called it yet";
      if (left == 1) {
        EXPECT_FALSE(wv->IsCompleted()) << "received what rank 1 has not sent";
      }
      ASSERT_TRUE(latch.Set("rank0_issued", "yes").ok());
    }
    ASSERT_TRUE(wv->Wait().ok());
    ASSERT_TRUE(ws->Wait().ok());
    EXPECT_TRUE(SameValues(from_left, Input(DType::kF32, left, 5000, 54)));
    std::vector<int> all;
    for (int r = 0; r < n; ++r) all.push_back(r);
    ASSERT_TRUE(wr->Wait().ok());
    ASSERT_TRUE(wb->Wait().ok());
    ASSERT_TRUE(wg->Wait().ok());
    ASSERT_TRUE(wa->Wait().ok());
    EXPECT_TRUE(wa->IsCompleted());
    EXPECT_TRUE(SameValues(a, SerialReduce(DType::kF32, ReduceOp::kSum, all, 1 << 16, 50)));
    EXPECT_TRUE(SameValues(b, SerialReduce(DType::kBF16, ReduceOp::kAvg, all, 1000, 51)));
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(SameValues(Range(gathered, 3 * q, 3), Input(DType::kI32, q, 3, 52)));
    }
    EXPECT_TRUE(SameValues(
        rs_out, Range(SerialReduce(DType::kF32, ReduceOp::kMin, all, 2 * n, 53), 2 * rank, 2)));
  });
}

// The tensor handed to a call may be dropped by the caller before the Work completes.
TEST_P(GroupsTest, TheCommunicatorKeepsTensorsAlive) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    auto comm = MakeGloo(rank, n, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::shared_ptr<Work> w;
    {
      Tensor x = Input(DType::kF32, rank, 1 << 18, 60);
      w = (*comm)->AllReduce(x, ReduceOp::kSum);
    }
    EXPECT_TRUE(w->Wait().ok());
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GroupsTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "ranks");
                         });

}  // namespace
}  // namespace braid::gloo_test
