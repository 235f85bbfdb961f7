// Every collective of the Gloo communicator on 2, 3 and 4 processes over loopback, every dtype,
// checked bit for bit against a serial computation on the same (integer-valued) inputs.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/gloo/test_util.h"
#include "core/communicator.h"
#include "gtest/gtest.h"

namespace braid::gloo_test {
namespace {

const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

// The ops that reduce dtype t: those core's rule (CheckReduction) accepts.
std::vector<ReduceOp> OpsFor(DType t) {
  std::vector<ReduceOp> ops;
  for (ReduceOp op : kAllOps) {
    if (CheckReduction(op, t).ok()) ops.push_back(op);
  }
  return ops;
}

std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::string Case(DType t, ReduceOp op, int64_t n) {
  return absl::StrCat(DTypeName(t), " ", ReduceOpName(op), " n=", n);
}

// One communicator per way of running all-reduce, so that each algorithm meets every case:
// the default (direct exchange for small buffers, ring above), ring only with tiny segments
// (many segments per chunk), bcube only and direct only. Several communicators in one process also
// exercise the per-process store prefixes.
const std::vector<std::map<std::string, std::string>>& AllreduceConfigs() {
  static const auto* configs = new std::vector<std::map<std::string, std::string>>{
      {},
      {{"allreduce_algorithm", "ring"}, {"segment_bytes", "256"}},
      {{"allreduce_algorithm", "bcube"}},
      {{"allreduce_algorithm", "direct"}},
  };
  return *configs;
}

class CollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

TEST_P(CollectivesTest, AllReduceEveryDtypeOpSizeAndAlgorithm) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    for (const auto& config : AllreduceConfigs()) {
      auto comm = MakeGloo(rank, n, &store, absl::Seconds(30), config);
      ASSERT_TRUE(comm.ok()) << comm.status();
      SCOPED_TRACE(absl::StrCat("allreduce config #", &config - &AllreduceConfigs()[0]));
      int salt = 0;
      for (DType t : AllDTypes()) {
        for (ReduceOp op : OpsFor(t)) {
          for (int64_t count :
               {int64_t(0), int64_t(1), int64_t(7), int64_t(1001), int64_t(20001)}) {
            ++salt;
            Tensor x = Input(t, rank, count, salt);
            absl::Status st = (*comm)->AllReduce(x, op)->Wait();
            ASSERT_TRUE(st.ok()) << Case(t, op, count) << ": " << st;
            EXPECT_TRUE(SameValues(x, SerialReduce(t, op, Iota(n), count, salt)))
                << Case(t, op, count);
          }
        }
      }
    }
  });
}

TEST_P(CollectivesTest, LargeF32AllReduceWithEveryAlgorithm) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    for (const auto& config : AllreduceConfigs()) {
      if (config.count("segment_bytes")) continue;  // 20k segments of 256 B: slow, covered above
      auto comm = MakeGloo(rank, n, &store, absl::Seconds(30), config);
      ASSERT_TRUE(comm.ok()) << comm.status();
      // 5 MiB: above every size threshold of the default policy (so: ring), several segments.
      const int64_t count = (5 << 20) / 4 + 5;
      Tensor x = Input(DType::kF32, rank, count, 5);
      ASSERT_TRUE((*comm)->AllReduce(x, ReduceOp::kSum)->Wait().ok());
      EXPECT_TRUE(SameValues(x, SerialReduce(DType::kF32, ReduceOp::kSum, Iota(n), count, 5)))
          << "allreduce config #" << &config - &AllreduceConfigs()[0];
    }
  });
}

// Block q of `counts` starts at the sum of the blocks before it.
int64_t Offset(const std::vector<int64_t>& counts, int q) {
  int64_t o = 0;
  for (int i = 0; i < q; ++i) o += counts[i];
  return o;
}

std::vector<std::vector<int64_t>> BlockLayouts(int n) {
  std::vector<std::vector<int64_t>> layouts;
  layouts.push_back(std::vector<int64_t>(n, 1));
  layouts.push_back(std::vector<int64_t>(n, 37));
  std::vector<int64_t> uneven;  // with an empty block
  for (int q = 0; q < n; ++q) uneven.push_back(q == 1 ? 0 : 5 + 3 * q);
  layouts.push_back(uneven);
  std::vector<int64_t> skewed(n, 2);  // one rank holds almost everything
  skewed[n - 1] = 5000;
  layouts.push_back(skewed);
  return layouts;
}

TEST_P(CollectivesTest, ReduceScatterEqualAndUnevenBlocks) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    // Tiny segments as well as the default, so that blocks travel in many pieces.
    for (const char* segment : {"1048576", "64"}) {
      auto comm = MakeGloo(rank, n, &store, absl::Seconds(30), {{"segment_bytes", segment}});
      ASSERT_TRUE(comm.ok()) << comm.status();
      int salt = 100;
      for (DType t : AllDTypes()) {
        for (ReduceOp op : OpsFor(t)) {
          for (const auto& counts : BlockLayouts(n)) {
            ++salt;
            const int64_t total = Offset(counts, n);
            const bool equal = counts[0] == counts.back();
            SCOPED_TRACE(absl::StrCat(Case(t, op, total), " blocks ", absl::StrJoin(counts, ","),
                                      " segment ", segment, equal ? " (as equal blocks)" : ""));
            Tensor in = Input(t, rank, total, salt);
            Tensor before = Range(in, 0, total);
            Tensor out = Tensor::Empty({counts[rank]}, t);
            absl::Status st =
                (*comm)
                    ->ReduceScatter(in, out, op, equal ? std::vector<int64_t>{} : counts)
                    ->Wait();
            ASSERT_TRUE(st.ok()) << st;
            Tensor want = Range(SerialReduce(t, op, Iota(n), total, salt), Offset(counts, rank),
                                counts[rank]);
            EXPECT_TRUE(SameValues(out, want));
            EXPECT_TRUE(SameValues(in, before)) << "the input must be left unchanged";
          }
        }
      }
    }
  });
}

TEST_P(CollectivesTest, LargeReduceScatter) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    auto comm = MakeGloo(rank, n, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    const int64_t block = (5 << 20) / 4 / n;  // 5 MiB in all: several segments per block
    Tensor in = Input(DType::kF32, rank, block * n, 9);
    Tensor out = Tensor::Empty({block}, DType::kF32);
    ASSERT_TRUE((*comm)->ReduceScatter(in, out, ReduceOp::kSum)->Wait().ok());
    EXPECT_TRUE(
        SameValues(out, Range(SerialReduce(DType::kF32, ReduceOp::kSum, Iota(n), block * n, 9),
                              rank * block, block)));
  });
}

TEST_P(CollectivesTest, AllGatherEqualUnevenAndInPlace) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    auto comm = MakeGloo(rank, n, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    int salt = 200;
    auto layouts = BlockLayouts(n);
    layouts.push_back(std::vector<int64_t>(n, 300000));  // 1.2 MB blocks of f32
    for (DType t : AllDTypes()) {
      for (const auto& counts : layouts) {
        for (bool in_place : {false, true}) {
          ++salt;
          const int64_t total = Offset(counts, n);
          const bool equal = counts[0] == counts.back();
          SCOPED_TRACE(absl::StrCat(DTypeName(t), " blocks ", absl::StrJoin(counts, ","),
                                    in_place ? " in place" : ""));
          Tensor out = Tensor::Zeros({total}, t);
          Tensor in = Input(t, rank, counts[rank], salt + rank);
          if (in_place) {
            // ZeRO's layout: the input is this rank's block of the output.
            Tensor block = out.FlatRange(Offset(counts, rank), counts[rank], {counts[rank]});
            block.CopyFrom(in);
            in = block;
          }
          absl::Status st =
              (*comm)->AllGather(in, out, equal ? std::vector<int64_t>{} : counts)->Wait();
          ASSERT_TRUE(st.ok()) << st;
          for (int q = 0; q < n; ++q) {
            EXPECT_TRUE(SameValues(Range(out, Offset(counts, q), counts[q]),
                                   Input(t, q, counts[q], salt + q)))
                << "block of rank " << q;
          }
        }
      }
    }
  });
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    auto comm = MakeGloo(rank, n, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    int salt = 300;
    for (DType t : AllDTypes()) {
      for (int64_t count : {int64_t(0), int64_t(1), int64_t(999), int64_t(300001)}) {
        for (int root = 0; root < n; ++root) {
          ++salt;
          Tensor x = Input(t, rank, count, salt);
          ASSERT_TRUE((*comm)->Broadcast(x, root)->Wait().ok());
          EXPECT_TRUE(SameValues(x, Input(t, root, count, salt)))
              << DTypeName(t) << " n=" << count << " root " << root;
        }
      }
    }
  });
}

TEST_P(CollectivesTest, ReduceToEveryRoot) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    auto comm = MakeGloo(rank, n, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    int salt = 400;
    for (DType t : AllDTypes()) {
      for (ReduceOp op : OpsFor(t)) {
        for (int64_t count : {int64_t(1), int64_t(1001), int64_t(300001)}) {
          for (int root = 0; root < n; ++root) {
            ++salt;
            Tensor x = Input(t, rank, count, salt);
            ASSERT_TRUE((*comm)->Reduce(x, root, op)->Wait().ok());
            if (rank == root) {
              EXPECT_TRUE(SameValues(x, SerialReduce(t, op, Iota(n), count, salt)))
                  << Case(t, op, count) << " root " << root;
            }
          }
        }
      }
    }
  });
}

// Gloo takes exactly the (op, dtype) pairs of core's rule (CheckReduction) in every reducing
// collective: accepted pairs give the serial result, refused ones fail on every rank with the
// rule's message.
TEST_P(CollectivesTest, EveryOpAndDtypeFollowsTheCoreReductionRule) {
  const int n = world();
  FileStore store(FreshDir());
  RunRanks(n, [&](int rank) {
    // A refused call breaks the communicator it was issued on (its peers would wait for it in
    // vain), so refused pairs go to a communicator of their own.
    auto accepting = MakeGloo(rank, n, &store);
    ASSERT_TRUE(accepting.ok()) << accepting.status();
    auto refusing = MakeGloo(rank, n, &store);
    ASSERT_TRUE(refusing.ok()) << refusing.status();
    const int64_t block = 3;
    const int64_t count = block * n;
    int salt = 500;
    int pairs = 0, refused = 0;
    for (ReduceOp op : kAllOps) {
      for (DType t : AllDTypes()) {
        ++salt;
        ++pairs;
        const absl::Status rule = CheckReduction(op, t);
        refused += !rule.ok();
        SCOPED_TRACE(Case(t, op, count));
        Communicator& c = rule.ok() ? **accepting : **refusing;
        auto check = [&](const absl::Status& st, const char* what) {
          if (rule.ok()) {
            EXPECT_TRUE(st.ok()) << what << ": " << st;
          } else {
            EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what << ": " << st;
            EXPECT_NE(std::string(st.message()).find(std::string(rule.message())),
                      std::string::npos)
                << what << " should fail with the rule's message; got: " << st;
          }
          return st.ok();
        };
        const Tensor want = rule.ok() ? SerialReduce(t, op, Iota(n), count, salt) : Tensor();
        Tensor all = Input(t, rank, count, salt);
        if (check(c.AllReduce(all, op)->Wait(), "AllReduce")) {
          EXPECT_TRUE(SameValues(all, want)) << "AllReduce";
        }
        Tensor in = Input(t, rank, count, salt);
        Tensor out = Tensor::Empty({block}, t);
        if (check(c.ReduceScatter(in, out, op)->Wait(), "ReduceScatter")) {
          EXPECT_TRUE(SameValues(out, Range(want, rank * block, block))) << "ReduceScatter";
        }
        Tensor x = Input(t, rank, count, salt);
        if (check(c.Reduce(x, n - 1, op)->Wait(), "Reduce") && rank == n - 1) {
          EXPECT_TRUE(SameValues(x, want)) << "Reduce";
        }
      }
    }
    EXPECT_EQ(pairs, 4 * 7);
    EXPECT_EQ(refused, 4);  // avg of i32, i64, u8, i8
  });
}

// After the barrier every rank must have announced its arrival (announced before entering it):
// a barrier that let a rank through early would fail this, given the staggered arrivals.
TEST_P(CollectivesTest, BarrierWaitsForEveryRank) {
  const int n = world();
  FileStore store(FreshDir());
  FileStore marks(FreshDir("marks"));
  RunRanks(n, [&](int rank) {
    auto comm = MakeGloo(rank, n, &store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    for (int round = 0; round < 3; ++round) {
      absl::SleepFor(absl::Milliseconds(40 * ((rank + round) % n)));
      ASSERT_TRUE(marks.Set(absl::StrCat("round", round, "/rank", rank), "here").ok());
      ASSERT_TRUE((*comm)->Barrier()->Wait().ok());
      for (int q = 0; q < n; ++q) {
        EXPECT_TRUE(marks.Get(absl::StrCat("round", round, "/rank", q), absl::ZeroDuration()).ok())
            << "rank " << q << " had not reached barrier " << round;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "ranks");
                         });

}  // namespace
}  // namespace braid::gloo_test
