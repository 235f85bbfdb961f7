#include "launcher/elastic.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/store.h"

namespace braid::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Arrival = RoundAdmission::Arrival;
using Decision = RoundAdmission::Decision;

// Time only moves when a test says so.
const absl::Time kT0 = absl::FromUnixSeconds(1000000);
absl::Time fake_now = kT0;
absl::Time FakeNow() { return fake_now; }

RoundRules Rules(int lo, int hi) {
  return {lo, hi, absl::Seconds(10), absl::Seconds(300)};
}

TEST(RoundAdmissionTest, ClosesAtOnceWhenMaxArrive) {
  RoundAdmission a(Rules(2, 3), kT0);
  EXPECT_EQ(a.Arrive(2, kT0), Arrival::kAdmitted);
  EXPECT_EQ(a.Decide(kT0), Decision::kWait);
  EXPECT_EQ(a.Arrive(0, kT0 + absl::Seconds(1)), Arrival::kAdmitted);
  EXPECT_EQ(a.Decide(kT0 + absl::Seconds(1)), Decision::kWait);  // min is in: the last call runs
  EXPECT_EQ(a.Arrive(1, kT0 + absl::Seconds(2)), Arrival::kAdmitted);
  EXPECT_EQ(a.Decide(kT0 + absl::Seconds(2)), Decision::kClose);
  EXPECT_THAT(a.Members(), ElementsAre(0, 1, 2));  // ranked by identity, not arrival
  EXPECT_EQ(a.Arrive(3, kT0 + absl::Seconds(2)), Arrival::kFull);
  EXPECT_THAT(a.Members(), ElementsAre(0, 1, 2));
}

TEST(RoundAdmissionTest, LastCallStartsWhenMinArrive) {
  RoundAdmission a(Rules(2, 3), kT0);
  a.Arrive(0, kT0 + absl::Seconds(5));
  EXPECT_EQ(a.Decide(kT0 + absl::Seconds(100)), Decision::kWait);  // below min: no last call
  a.Arrive(1, kT0 + absl::Seconds(100));
  EXPECT_EQ(a.NextDeadline(), kT0 + absl::Seconds(110));
  EXPECT_EQ(a.Decide(kT0 + absl::Seconds(110) - absl::Nanoseconds(1)), Decision::kWait);
  EXPECT_EQ(a.Decide(kT0 + absl::Seconds(110)), Decision::kClose);
  EXPECT_THAT(a.Members(), ElementsAre(0, 1));
}

TEST(RoundAdmissionTest, TimesOutBelowMin) {
  RoundAdmission a(Rules(2, 3), kT0);
  a.Arrive(0, kT0);
  EXPECT_EQ(a.NextDeadline(), kT0 + absl::Seconds(300));
  EXPECT_EQ(a.Decide(kT0 + absl::Seconds(299)), Decision::kWait);
  EXPECT_EQ(a.Decide(kT0 + absl::Seconds(300)), Decision::kTimeout);
}

TEST(RoundAdmissionTest, DuplicateIdentityAndFixedSize) {
  RoundAdmission a(Rules(2, 2), kT0);  // --nnodes=2 is 2:2
  EXPECT_EQ(a.Arrive(1, kT0), Arrival::kAdmitted);
  EXPECT_EQ(a.Arrive(1, kT0), Arrival::kDuplicate);
  EXPECT_EQ(a.Decide(kT0), Decision::kWait);
  EXPECT_EQ(a.Arrive(0, kT0), Arrival::kAdmitted);
  EXPECT_EQ(a.Decide(kT0), Decision::kClose);  // max: no last call
}

TEST(RoundAdmissionTest, ZeroLastCallClosesAtMin) {
  RoundRules r = Rules(1, 3);
  r.last_call = absl::ZeroDuration();
  RoundAdmission a(r, kT0);
  a.Arrive(0, kT0);
  EXPECT_EQ(a.Decide(kT0), Decision::kClose);
}

TEST(RoundResultTest, RoundTrips) {
  RoundResult r{{0, 2}, {"a", "c"}, "round 1: node 1 (host b) lost", ""};
  auto back = RoundResult::Parse(r.Serialize());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_THAT(back->members, ElementsAre(0, 2));
  EXPECT_THAT(back->hosts, ElementsAre("a", "c"));
  EXPECT_EQ(back->note, r.note);
  EXPECT_EQ(back->RankOf(2), 1);
  EXPECT_EQ(back->RankOf(1), -1);
  EXPECT_FALSE(RoundResult::Parse("members=0,x\nhosts=a,b").ok());
}

// Three launchers over one store, node 0 coordinating; every step is an explicit call.
class ElasticRendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override { fake_now = kT0; }
  std::unique_ptr<ElasticRendezvous> Node(int id, int max_restarts = 0) {
    return std::make_unique<ElasticRendezvous>(&store_, id, absl::StrCat("h", id), Rules(2, 3),
                                               max_restarts, &FakeNow);
  }
  RoundResult MustResult(ElasticRendezvous& r, int round) {
    auto res = r.Result(round);
    EXPECT_TRUE(res.ok()) << res.status();
    EXPECT_TRUE(res.ok() && res->has_value()) << "round " << round << " has no result";
    return res.ok() && res->has_value() ? **res : RoundResult{};
  }
  InMemoryStore store_;
};

TEST_F(ElasticRendezvousTest, LossThenJoin) {
  auto n0 = Node(0, /*max_restarts=*/0), n1 = Node(1), n2 = Node(2);
  ASSERT_EQ(*n1->Join(0), 0);
  ASSERT_EQ(*n0->Join(0), 0);
  ASSERT_TRUE(n0->Coordinate(0, {}).ok());
  EXPECT_FALSE(n1->Result(0)->has_value());  // 2 of 3: the last call runs
  ASSERT_EQ(*n2->Join(0), 0);
  ASSERT_TRUE(n0->Coordinate(0, {}).ok());
  RoundResult r0 = MustResult(*n2, 0);
  EXPECT_THAT(r0.members, ElementsAre(0, 1, 2));
  EXPECT_THAT(r0.hosts, ElementsAre("h0", "h1", "h2"));
  EXPECT_EQ(r0.note, "round 0: starting with 3 node(s): node 0 (host h0), node 1 (host h1), node 2 (host h2)");
  EXPECT_FALSE(n0->Waiting(1, {0, 1, 2})->has_value());

  // Node 2 dies at step 10; the checkpoint of step 8 is the newest.
  ASSERT_TRUE(store_.Set(CheckpointStepKey(), "8").ok());
  ASSERT_EQ(*n0->Join(1), 1);
  ASSERT_EQ(*n1->Join(1), 1);
  PreviousRound failed{true, "rank 2 (node 2) was killed by signal 9"};
  ASSERT_TRUE(n0->Coordinate(1, failed).ok());
  fake_now += absl::Seconds(9);
  ASSERT_TRUE(n0->Coordinate(1, failed).ok());
  EXPECT_FALSE(n1->Result(1)->has_value());
  fake_now += absl::Seconds(1);  // the last call is over
  ASSERT_TRUE(n0->Coordinate(1, failed).ok());
  RoundResult r1 = MustResult(*n1, 1);
  EXPECT_THAT(r1.members, ElementsAre(0, 1));
  EXPECT_TRUE(r1.error.empty()) << r1.error;  // a lost node is no restart
  EXPECT_EQ(r1.note, "round 1: node 2 (host h2) lost (not back within --rdzv_last_call_s after: rank 2 "
                     "(node 2) was killed by signal 9); continuing with 2 node(s) from the checkpoint of step 8");

  // Node 2 comes back while round 1 runs: it waits for round 2, and the running round sees it.
  // (A survivor that failed first and already joined round 2 is no newcomer.)
  ASSERT_EQ(*n1->Join(2), 2);
  EXPECT_FALSE(n0->Waiting(2, {0, 1})->has_value());
  auto again = Node(2);
  ASSERT_EQ(*again->Join(0), 2);
  auto waiting = n0->Waiting(2, {0, 1});
  ASSERT_TRUE(waiting.ok() && waiting->has_value());
  EXPECT_EQ(**waiting, "node 2 (host h2)");
  ASSERT_TRUE(store_.Set(CheckpointStepKey(), "16").ok());
  ASSERT_EQ(*n0->Join(2), 2);
  ASSERT_TRUE(n0->Coordinate(2, {false, "node 2 (host h2) waits to join"}).ok());
  RoundResult r2 = MustResult(*again, 2);
  EXPECT_THAT(r2.members, ElementsAre(0, 1, 2));
  EXPECT_EQ(r2.note, "round 2: node 2 (host h2) joined; continuing with 3 node(s) from the checkpoint of step 16");
}

TEST_F(ElasticRendezvousTest, LateJoinerWaitsForTheNextRound) {
  auto n0 = Node(0), n1 = Node(1), n2 = Node(2);
  ASSERT_EQ(*n0->Join(0), 0);
  ASSERT_EQ(*n1->Join(0), 0);
  ASSERT_TRUE(n0->Coordinate(0, {}).ok());
  fake_now += absl::Seconds(10);
  ASSERT_TRUE(n0->Coordinate(0, {}).ok());  // closes with 2
  // Node 2 read no published round before the close: it registered in round 0 too late.
  ASSERT_TRUE(store_.Add("braid.launcher/elastic/0/joined", 1).ok());
  ASSERT_TRUE(store_.Set("braid.launcher/elastic/0/joiner/2", "2\nh2").ok());
  EXPECT_EQ(MustResult(*n2, 0).RankOf(2), -1);
  // Its next attempt goes to round 1, which the running round sees as a waiting node.
  ASSERT_EQ(*n2->Join(1), 1);
  EXPECT_TRUE(n0->Waiting(1, {0, 1})->has_value());
  // A newcomer reads the published round and goes after it as well.
  EXPECT_EQ(*Node(1)->Join(0), 1);
}

TEST_F(ElasticRendezvousTest, FailureWithoutLossCountsAgainstMaxRestarts) {
  auto n0 = Node(0, /*max_restarts=*/1), n1 = Node(1);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(*n0->Join(round), round);
    ASSERT_EQ(*n1->Join(round), round);
    PreviousRound prev{round > 0, "rank 1 (node 1) exited with code 3"};
    ASSERT_TRUE(n0->Coordinate(round, prev).ok());
    fake_now += absl::Seconds(10);
    ASSERT_TRUE(n0->Coordinate(round, prev).ok());
  }
  EXPECT_TRUE(MustResult(*n1, 0).error.empty());
  RoundResult r1 = MustResult(*n1, 1);
  EXPECT_TRUE(r1.error.empty());
  EXPECT_THAT(r1.note, HasSubstr("restart 1 of --max_restarts=1 after: rank 1 (node 1) exited with code 3"));
  EXPECT_EQ(MustResult(*n1, 2).error,
            "rank 1 (node 1) exited with code 3; no node was lost and the worker group has failed 2 "
            "time(s) (--max_restarts=1): stopping");
}

TEST_F(ElasticRendezvousTest, AwaitDecidesAsTheClockMoves) {
  auto n0 = Node(0), n1 = Node(1);
  ASSERT_EQ(*n0->Join(0), 0);
  ASSERT_EQ(*n1->Join(0), 0);
  int pauses = 0;
  auto result = n0->Await(0, {}, [&] {
    ++pauses;
    fake_now += absl::Seconds(1);  // each pause is a second of the last call
    return false;
  });
  ASSERT_TRUE(result.ok() && result->has_value()) << result.status();
  EXPECT_THAT((*result)->members, ElementsAre(0, 1));
  EXPECT_EQ(pauses, 10);  // --rdzv_last_call_s (10 s here) after the second arrival
  // Giving up (a signal) while nothing is decided returns no result.
  ASSERT_EQ(*n1->Join(1), 1);
  auto given_up = n1->Await(1, {}, [] { return true; });
  ASSERT_TRUE(given_up.ok());
  EXPECT_FALSE(given_up->has_value());
}

TEST_F(ElasticRendezvousTest, TooFewNodesTimesOut) {
  auto n0 = Node(0);
  ASSERT_EQ(*n0->Join(0), 0);
  ASSERT_TRUE(n0->Coordinate(0, {}).ok());
  fake_now += absl::Seconds(300);
  ASSERT_TRUE(n0->Coordinate(0, {}).ok());
  EXPECT_EQ(MustResult(*n0, 0).error,
            "only 1 node(s) (node 0 (host h0)) joined round 0 within 5m; --nnodes=2:3 needs at "
            "least 2. Start the launchers of the other nodes (or raise --rdzv_timeout_s)");
}

TEST_F(ElasticRendezvousTest, TwoLaunchersClaimOneIdentity) {
  auto n0 = Node(0), a = Node(1), b = std::make_unique<ElasticRendezvous>(&store_, 1, "other", Rules(2, 3), 0, &FakeNow);
  ASSERT_EQ(*n0->Join(0), 0);
  ASSERT_EQ(*a->Join(0), 0);
  ASSERT_EQ(*b->Join(0), 0);
  ASSERT_TRUE(n0->Coordinate(0, {}).ok());
  EXPECT_EQ(MustResult(*n0, 0).error,
            "two launchers claim to be node 1 (hosts h1 and other): give each node its own "
            "--node_rank, 0..MAX-1");
}

}  // namespace
}  // namespace braid::launcher
