#include "backends/in_process/in_process_communicator.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Runs fn(comm of rank r) on one thread per rank.
void RunRanks(std::vector<std::unique_ptr<Communicator>>& comms,
              const std::function<void(Communicator&)>& fn) {
  std::vector<std::thread> threads;
  for (auto& c : comms) threads.emplace_back([&fn, &c] { fn(*c); });
  for (auto& t : threads) t.join();
}

void RunRanks(int n, const std::function<void(Communicator&)>& fn) {
  auto comms = MakeInProcessGroup(n);
  RunRanks(comms, fn);
}

// Rank r's distinct, non-integer input values.
std::vector<float> Values(int rank, int64_t n, int salt = 0) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = 0.37f * float((rank * 7 + i * 3 + salt) % 11) - 1.1f * rank;
  return v;
}

// The reduction a serial loop over ranks 0..n-1 computes, element by element.
template <typename T>
std::vector<T> SerialReduce(const std::vector<std::vector<T>>& in, ReduceOp op) {
  std::vector<T> out = in[0];
  for (size_t r = 1; r < in.size(); ++r) {
    for (size_t i = 0; i < out.size(); ++i) {
      T v = in[r][i];
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) out[i] += v;
      if (op == ReduceOp::kMax) out[i] = std::max(out[i], v);
      if (op == ReduceOp::kMin) out[i] = std::min(out[i], v);
    }
  }
  if (op == ReduceOp::kAvg) {
    for (T& v : out) v /= T(in.size());
  }
  return out;
}

std::vector<std::vector<float>> AllValues(int n, int64_t count, int salt = 0) {
  std::vector<std::vector<float>> v;
  for (int r = 0; r < n; ++r) v.push_back(Values(r, count, salt));
  return v;
}

const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

class InProcessTest : public ::testing::TestWithParam<int> {};

TEST_P(InProcessTest, AllReduceEveryOpMatchesSerialLoop) {
  const int n = GetParam();
  for (ReduceOp op : kAllOps) {
    SCOPED_TRACE(ReduceOpName(op));
    auto expected = SerialReduce(AllValues(n, 13), op);
    RunRanks(n, [&](Communicator& c) {
      EXPECT_EQ(c.size(), n);
      Tensor t = Tensor::FromVector(Values(c.rank(), 13), {13});
      ASSERT_TRUE(c.AllReduce(t, op)->Wait().ok());
      EXPECT_EQ(t.ToVector<float>(), expected) << "rank " << c.rank();
    });
  }
}

TEST_P(InProcessTest, AllReduceIntegers) {
  const int n = GetParam();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<std::vector<int32_t>> in32;
    std::vector<std::vector<int64_t>> in64;
    for (int r = 0; r < n; ++r) {
      in32.push_back({r * 5 - 7, 3 - r, 1 << 20, -r * r});
      in64.push_back({int64_t(r) << 40, -int64_t(r) * 3, 11, r % 2});
    }
    auto want32 = SerialReduce(in32, op);
    auto want64 = SerialReduce(in64, op);
    RunRanks(n, [&](Communicator& c) {
      Tensor a = Tensor::FromVector(in32[c.rank()], {4});
      Tensor b = Tensor::FromVector(in64[c.rank()], {2, 2});
      auto wa = c.AllReduce(a, op);
      auto wb = c.AllReduce(b, op);
      ASSERT_TRUE(wa->Wait().ok());
      ASSERT_TRUE(wb->Wait().ok());
      EXPECT_EQ(a.ToVector<int32_t>(), want32);
      EXPECT_EQ(b.ToVector<int64_t>(), want64);
    });
  }
}

TEST_P(InProcessTest, ReduceScatterEvenAndUneven) {
  const int n = GetParam();
  std::vector<int64_t> uneven = {3, 0, 5, 2};  // includes an empty block
  uneven.resize(n);
  uneven[n - 1] += 1;
  for (bool even : {true, false}) {
    std::vector<int64_t> counts = even ? std::vector<int64_t>(n, 4) : uneven;
    int64_t total = 0;
    std::vector<int64_t> offset;
    for (int64_t c : counts) {
      offset.push_back(total);
      total += c;
    }
    for (ReduceOp op : kAllOps) {
      auto full = SerialReduce(AllValues(n, total), op);
      RunRanks(n, [&](Communicator& c) {
        int r = c.rank();
        Tensor in = Tensor::FromVector(Values(r, total), {total});
        Tensor out = Tensor::Full({counts[r]}, 99.0f);
        ASSERT_TRUE(
            c.ReduceScatter(in, out, op, even ? std::vector<int64_t>{} : counts)->Wait().ok());
        std::vector<float> want(full.begin() + offset[r], full.begin() + offset[r] + counts[r]);
        EXPECT_EQ(out.ToVector<float>(), want) << "rank " << r << " op " << ReduceOpName(op);
      });
    }
    // In place: the output is this rank's block of the input.
    auto full = SerialReduce(AllValues(n, total), ReduceOp::kSum);
    RunRanks(n, [&](Communicator& c) {
      int r = c.rank();
      Tensor in = Tensor::FromVector(Values(r, total), {total});
      Tensor out = in.FlatRange(offset[r], counts[r]);
      ASSERT_TRUE(c.ReduceScatter(in, out, ReduceOp::kSum, counts)->Wait().ok());
      std::vector<float> want(full.begin() + offset[r], full.begin() + offset[r] + counts[r]);
      EXPECT_EQ(out.ToVector<float>(), want);
    });
  }
}

TEST_P(InProcessTest, AllGatherEvenUnevenAndInPlace) {
  const int n = GetParam();
  for (bool even : {true, false}) {
    std::vector<int64_t> counts;
    for (int r = 0; r < n; ++r) counts.push_back(even ? 3 : (r * 2 + 1) % 4);  // 1,3,1,3
    std::vector<float> want;
    for (int r = 0; r < n; ++r) {
      auto v = Values(r, counts[r]);
      want.insert(want.end(), v.begin(), v.end());
    }
    const int64_t total = int64_t(want.size());
    RunRanks(n, [&](Communicator& c) {
      int r = c.rank();
      Tensor in = Tensor::FromVector(Values(r, counts[r]), {counts[r]});
      Tensor out = Tensor::Zeros({total});
      ASSERT_TRUE(c.AllGather(in, out, even ? std::vector<int64_t>{} : counts)->Wait().ok());
      EXPECT_EQ(out.ToVector<float>(), want) << "rank " << r;
      // In place, as ZeRO gathers its flat buffer: each rank's input is its block of the output.
      Tensor buf = Tensor::Zeros({total});
      int64_t off = 0;
      for (int q = 0; q < r; ++q) off += counts[q];
      Tensor mine = buf.FlatRange(off, counts[r]);
      mine.CopyFrom(in);
      ASSERT_TRUE(c.AllGather(mine, buf, counts)->Wait().ok());
      EXPECT_EQ(buf.ToVector<float>(), want) << "rank " << r;
    });
  }
}

TEST_P(InProcessTest, BroadcastAndReduceFromEveryRoot) {
  const int n = GetParam();
  for (int root = 0; root < n; ++root) {
    auto sum = SerialReduce(AllValues(n, 6), ReduceOp::kSum);
    auto max = SerialReduce(AllValues(n, 6), ReduceOp::kMax);
    RunRanks(n, [&](Communicator& c) {
      int r = c.rank();
      Tensor b = Tensor::FromVector(Values(r, 6), {2, 3});
      Tensor ids = Tensor::FromVector(std::vector<int32_t>{r, r + 1}, {2});
      ASSERT_TRUE(c.Broadcast(b, root)->Wait().ok());
      ASSERT_TRUE(c.Broadcast(ids, root)->Wait().ok());
      EXPECT_EQ(b.ToVector<float>(), Values(root, 6));
      EXPECT_EQ(ids.ToVector<int32_t>(), (std::vector<int32_t>{root, root + 1}));

      Tensor s = Tensor::FromVector(Values(r, 6), {6});
      Tensor m = Tensor::FromVector(Values(r, 6), {6});
      ASSERT_TRUE(c.Reduce(s, root, ReduceOp::kSum)->Wait().ok());
      ASSERT_TRUE(c.Reduce(m, root, ReduceOp::kMax)->Wait().ok());
      if (r == root) {
        EXPECT_EQ(s.ToVector<float>(), sum);
        EXPECT_EQ(m.ToVector<float>(), max);
      }
    });
  }
}

TEST_P(InProcessTest, SendRecvRingAndTagsOutOfOrder) {
  const int n = GetParam();
  RunRanks(n, [&](Communicator& c) {
    int r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
    Tensor a = Tensor::FromVector(Values(r, 5, 1), {5});
    Tensor b = Tensor::FromVector(Values(r, 3, 2), {3});
    // Two messages to the next rank, received there in the opposite order, matched by tag.
    auto s1 = c.Send(a, next, /*tag=*/1);
    auto s2 = c.Send(b, next, /*tag=*/2);
    Tensor rb = Tensor::Zeros({3}), ra = Tensor::Zeros({5});
    ASSERT_TRUE(c.Recv(rb, prev, 2)->Wait().ok());
    ASSERT_TRUE(c.Recv(ra, prev, 1)->Wait().ok());
    ASSERT_TRUE(s1->Wait().ok());
    ASSERT_TRUE(s2->Wait().ok());
    EXPECT_EQ(ra.ToVector<float>(), Values(prev, 5, 1));
    EXPECT_EQ(rb.ToVector<float>(), Values(prev, 3, 2));
    // Same tag twice: messages arrive in order.
    Tensor x = Tensor::Full({2}, float(r)), y = Tensor::Full({2}, float(r) + 0.5f);
    auto w1 = c.Send(x, next, 7);
    auto w2 = c.Send(y, next, 7);
    Tensor g1 = Tensor::Zeros({2}), g2 = Tensor::Zeros({2});
    ASSERT_TRUE(c.Recv(g1, prev, 7)->Wait().ok());
    ASSERT_TRUE(c.Recv(g2, prev, 7)->Wait().ok());
    ASSERT_TRUE(w1->Wait().ok() && w2->Wait().ok());
    EXPECT_EQ(g1.ToVector<float>(), std::vector<float>(2, float(prev)));
    EXPECT_EQ(g2.ToVector<float>(), std::vector<float>(2, float(prev) + 0.5f));
  });
}

TEST_P(InProcessTest, BarrierWaitsForEveryRank) {
  const int n = GetParam();
  std::atomic<int> before{0};
  RunRanks(n, [&](Communicator& c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * c.rank()));
    before++;
    ASSERT_TRUE(c.Barrier()->Wait().ok());
    EXPECT_EQ(before.load(), n);
  });
}

TEST_P(InProcessTest, SubGroupsRenumberAndReduceAmongMembersOnly) {
  const int n = GetParam();
  // The last rank and rank 0, in that order: sub-rank 0 is the old rank n-1.
  std::vector<int> members = {n - 1, 0};
  auto sub_sum =
      SerialReduce(std::vector<std::vector<float>>{Values(n - 1, 4), Values(0, 4)}, ReduceOp::kSum);
  auto world_sum = SerialReduce(AllValues(n, 4), ReduceOp::kSum);
  RunRanks(n, [&](Communicator& c) {
    absl::StatusOr<std::unique_ptr<Communicator>> sub = c.NewGroup(members);
    ASSERT_TRUE(sub.ok()) << sub.status();
    bool member = c.rank() == 0 || c.rank() == n - 1;
    ASSERT_EQ(*sub != nullptr, member) << "rank " << c.rank();
    if (member) {
      EXPECT_EQ((*sub)->size(), 2);
      EXPECT_EQ((*sub)->rank(), c.rank() == n - 1 ? 0 : 1);
      Tensor t = Tensor::FromVector(Values(c.rank(), 4), {4});
      ASSERT_TRUE((*sub)->AllReduce(t, ReduceOp::kSum)->Wait().ok());
      EXPECT_EQ(t.ToVector<float>(), sub_sum);
    }
    // The parent group carries on independently.
    Tensor w = Tensor::FromVector(Values(c.rank(), 4), {4});
    ASSERT_TRUE(c.AllReduce(w, ReduceOp::kSum)->Wait().ok());
    EXPECT_EQ(w.ToVector<float>(), world_sum);
  });
}

// ---- The reduction rule (CheckReduction, core/communicator.h) --------------------------------

const DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32,
                            DType::kI64, DType::kU8,   DType::kI8};

// The rule, written out pair by pair: avg of an integer dtype is the only refusal.
bool RuleAccepts(ReduceOp op, DType t) {
  const bool integer =
      t == DType::kI32 || t == DType::kI64 || t == DType::kU8 || t == DType::kI8;
  return !(op == ReduceOp::kAvg && integer);
}

TEST(ReductionRule, EveryOpAndDtypePair) {
  // The lists above hold every op and dtype: the values after them have no name.
  EXPECT_STREQ(ReduceOpName(ReduceOp(int(ReduceOp::kMin) + 1)), "unknown");
  EXPECT_STREQ(DTypeName(DType(int(DType::kI8) + 1)), "?");
  int refused = 0;
  for (ReduceOp op : kAllOps) {
    for (DType t : kAllDTypes) {
      SCOPED_TRACE(absl::StrCat(ReduceOpName(op), " ", DTypeName(t)));
      absl::Status st = CheckReduction(op, t);
      EXPECT_EQ(st.ok(), RuleAccepts(op, t)) << st;
      EXPECT_TRUE(CheckReduction(op, t, "AllReduce on rank 3").ok() == st.ok());
      if (st.ok()) continue;
      ++refused;
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
      const std::string msg(st.message());
      EXPECT_THAT(msg, HasSubstr(absl::StrCat("cannot reduce ", DTypeName(t), " with ",
                                              ReduceOpName(op))));
      EXPECT_THAT(msg, HasSubstr(absl::StrCat("avg needs a floating dtype, got ", DTypeName(t))));
      EXPECT_EQ(std::string(CheckReduction(op, t, "AllReduce on rank 3").message()),
                "AllReduce on rank 3: " + msg);
    }
  }
  EXPECT_EQ(refused, 4);  // avg of i32, i64, u8, i8
  // Values outside the enums are refused, not waved through to a backend's kernels.
  EXPECT_FALSE(CheckReduction(ReduceOp(int(ReduceOp::kMin) + 1), DType::kF32).ok());
  EXPECT_FALSE(CheckReduction(ReduceOp::kSum, DType(int(DType::kI8) + 1)).ok());
}

// Small integers, exact in every dtype (u8 ones non-negative); sums of 4 ranks stay in i8/u8.
float RuleInput(DType t, int rank, int64_t i) {
  return float((rank * 7 + i * 3) % 7) - (t == DType::kU8 ? 0.0f : 3.0f);
}

// AllReduce, ReduceScatter and Reduce take exactly the pairs of the rule: accepted pairs give the
// serial loop's result in every dtype, refused ones CheckReduction's error on every rank.
TEST_P(InProcessTest, EveryOpAndDtypeFollowsTheReductionRule) {
  const int n = GetParam();
  const int64_t count = 2 * n;  // two elements per rank in ReduceScatter
  for (ReduceOp op : kAllOps) {
    for (DType t : kAllDTypes) {
      SCOPED_TRACE(absl::StrCat(ReduceOpName(op), " ", DTypeName(t)));
      const absl::Status rule = CheckReduction(op, t);
      std::vector<std::vector<float>> in(n);
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < count; ++i) in[r].push_back(RuleInput(t, r, i));
      }
      // The serial result, rounded to the dtype the way a reduction in float/int64 would be.
      const std::vector<float> want =
          Tensor::FromVector(SerialReduce(in, op), {count}).To(t).ToFloatVector();
      RunRanks(n, [&](Communicator& c) {
        const int r = c.rank();
        auto expect = [&](const absl::Status& st, const char* what) {
          if (rule.ok()) {
            EXPECT_TRUE(st.ok()) << what << ": " << st;
          } else {
            EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what << ": " << st;
            EXPECT_THAT(std::string(st.message()), HasSubstr(std::string(rule.message())))
                << what;
          }
          return st.ok();
        };
        Tensor a = Tensor::FromVector(in[r], {count}).To(t);
        if (expect(c.AllReduce(a, op)->Wait(), "AllReduce")) {
          EXPECT_EQ(a.ToFloatVector(), want) << "AllReduce";
        }
        Tensor full = Tensor::FromVector(in[r], {count}).To(t);
        Tensor block = Tensor::Empty({2}, t);
        if (expect(c.ReduceScatter(full, block, op)->Wait(), "ReduceScatter")) {
          EXPECT_EQ(block.ToFloatVector(), std::vector<float>(want.begin() + 2 * r,
                                                              want.begin() + 2 * r + 2))
              << "ReduceScatter";
        }
        Tensor b = Tensor::FromVector(in[r], {count}).To(t);
        if (expect(c.Reduce(b, n - 1, op)->Wait(), "Reduce") && r == n - 1) {
          EXPECT_EQ(b.ToFloatVector(), want) << "Reduce";
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, InProcessTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

TEST(InProcessCommunicatorTest, WorkIsAsyncUntilTheLastRankArrives) {
  auto comms = MakeInProcessGroup(2);
  absl::Notification issued;
  RunRanks(comms, [&](Communicator& c) {
    Tensor t = Tensor::Full({3}, float(c.rank() + 1));
    if (c.rank() == 0) {
      auto w = c.AllReduce(t, ReduceOp::kSum);
      EXPECT_FALSE(w->IsCompleted());
      issued.Notify();
      ASSERT_TRUE(w->Wait().ok());
      EXPECT_TRUE(w->IsCompleted());
    } else {
      issued.WaitForNotification();
      ASSERT_TRUE(c.AllReduce(t, ReduceOp::kSum)->Wait().ok());
    }
    EXPECT_EQ(t.ToVector<float>(), std::vector<float>(3, 3.0f));
  });
}

TEST(InProcessCommunicatorTest, TimeoutNamesOpSequenceGroupMissingRankAndRecentOps) {
  auto comms = MakeInProcessGroup(3, "trainers");
  for (auto& c : comms) c->set_timeout(absl::Milliseconds(200));
  // A rank arrives when it issues the collective; the timeout runs from Wait. Ranks 0 and 1
  // both issue the all-reduce before either waits, so "arrived: 0,1" holds however slowly
  // their threads are scheduled (a rank still on its way after the other's 200 ms would
  // otherwise be reported missing too).
  absl::Barrier both_issued(2);
  RunRanks(comms, [&](Communicator& c) {
    ASSERT_TRUE(c.Barrier()->Wait().ok());
    if (c.rank() == 2) return;  // never joins the all-reduce
    Tensor t = Tensor::Zeros({16});
    std::shared_ptr<Work> w = c.AllReduce(t, ReduceOp::kSum);
    both_issued.Block();
    absl::Status s = w->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("AllReduce(sum, f32, 16 elements) #1"), HasSubstr("'trainers'"),
                      HasSubstr("rank(s) 2 did not arrive"), HasSubstr("arrived: 0,1"),
                      HasSubstr("#1 AllReduce(sum, f32, 16 elements) 64 B"),
                      HasSubstr("rank 2: #0 Barrier() 0 B")));
  });
}

TEST(InProcessCommunicatorTest, RecvTimeoutNamesThePeer) {
  auto comms = MakeInProcessGroup(2);
  comms[0]->set_timeout(absl::Milliseconds(50));
  Tensor t = Tensor::Zeros({2});
  absl::Status s = comms[0]->Recv(t, 1, 5)->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("Recv from rank 1 (tag 5"), HasSubstr("rank 1 has not posted")));
}

TEST(InProcessCommunicatorTest, MismatchedCollectivesFailOnEveryRankNamingBoth) {
  RunRanks(2, [&](Communicator& c) {
    Tensor t = Tensor::Zeros({8});
    absl::Status s =
        c.rank() == 0 ? c.AllReduce(t, ReduceOp::kSum)->Wait() : c.Broadcast(t, 0)->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("mismatch at #0"), HasSubstr("AllReduce(sum, f32, 8 elements)"),
                      HasSubstr("Broadcast(root 0, f32, 8 elements)")));
    // Same op, different sizes.
    Tensor u = Tensor::Zeros({c.rank() == 0 ? 4 : 5});
    absl::Status s2 = c.AllReduce(u, ReduceOp::kMax)->Wait();
    EXPECT_THAT(std::string(s2.message()), AllOf(HasSubstr("4 elements"), HasSubstr("5 elements")));
  });
}

TEST(InProcessCommunicatorTest, InvalidCallOnOneRankFailsTheCollectiveEverywhere) {
  RunRanks(3, [&](Communicator& c) {
    Tensor in = Tensor::Zeros({9});
    Tensor out = Tensor::Zeros({c.rank() == 1 ? 2 : 3});  // rank 1's block is the wrong size
    absl::Status s = c.ReduceScatter(in, out, ReduceOp::kSum)->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("on rank 1"));
    Tensor bad = Tensor::Zeros({7});
    absl::Status counts = c.AllGather(bad, in, {2, 2})->Wait();
    EXPECT_THAT(std::string(counts.message()), HasSubstr("one non-negative count per rank"));
    Tensor ints = Tensor::FromVector(std::vector<int32_t>{1, 2}, {2});
    absl::Status avg = c.AllReduce(ints, ReduceOp::kAvg)->Wait();
    EXPECT_THAT(std::string(avg.message()), HasSubstr("cannot reduce i32 with avg"));
  });
}

TEST(InProcessCommunicatorTest, NewGroupRejectsBadRankLists) {
  RunRanks(2, [&](Communicator& c) {
    EXPECT_FALSE(c.NewGroup({0, 0}).ok());
    EXPECT_FALSE(c.NewGroup({0, 2}).ok());
    // The group still works after the failed calls.
    Tensor t = Tensor::Full({1}, 1.0f);
    ASSERT_TRUE(c.AllReduce(t, ReduceOp::kSum)->Wait().ok());
    EXPECT_EQ(t.item(), 2.0f);
  });
}

TEST(InProcessCommunicatorTest, SingleRankGroupCompletesImmediately) {
  auto comms = MakeInProcessGroup(1);
  Tensor t = Tensor::Full({2}, 3.0f);
  auto w = comms[0]->AllReduce(t, ReduceOp::kAvg);
  EXPECT_TRUE(w->IsCompleted());
  EXPECT_TRUE(w->Wait().ok());
  EXPECT_EQ(t.ToVector<float>(), std::vector<float>(2, 3.0f));
  EXPECT_EQ(std::string(ReduceOpName(ReduceOp::kMin)), "min");
  EXPECT_TRUE(CompletedWork()->IsCompleted());
  EXPECT_EQ(CompletedWork(absl::AbortedError("x"))->Wait().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace braid
