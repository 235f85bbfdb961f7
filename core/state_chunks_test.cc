// The run arithmetic sharded checkpoints rely on, against brute force over element positions.
#include "core/state_chunks.h"

#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace braid {
namespace {

// Global position of each local element of a run list.
std::vector<int64_t> Positions(const Runs& runs) {
  std::vector<int64_t> out;
  for (auto& [b, e] : runs) {
    for (int64_t i = b; i < e; ++i) out.push_back(i);
  }
  return out;
}

TEST(StateChunks, IntersectFindsEveryCommonElementAtItsLocalPositions) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    // Random disjoint run lists over [0, 60), in random order.
    auto random_runs = [&] {
      Runs r;
      for (int64_t at = 0; at < 60;) {
        const int64_t len = 1 + int64_t(rng() % 7), gap = int64_t(rng() % 4);
        if (rng() % 2) r.push_back({at, std::min<int64_t>(60, at + len)});
        at += len + gap;
      }
      std::shuffle(r.begin(), r.end(), rng);
      return r;
    };
    Runs a = random_runs(), b = random_runs();
    std::vector<int64_t> pa = Positions(a), pb = Positions(b);
    std::map<int64_t, int64_t> b_local;
    for (size_t i = 0; i < pb.size(); ++i) b_local[pb[i]] = int64_t(i);
    std::map<int64_t, int64_t> want;  // a's local -> b's local
    for (size_t i = 0; i < pa.size(); ++i) {
      auto it = b_local.find(pa[i]);
      if (it != b_local.end()) want[int64_t(i)] = it->second;
    }
    std::map<int64_t, int64_t> got;
    for (const Overlap& o : Intersect(a, b)) {
      for (int64_t k = 0; k < o.length; ++k) {
        EXPECT_TRUE(got.emplace(o.a_at + k, o.b_at + k).second) << "element given twice";
      }
    }
    EXPECT_EQ(got, want) << "trial " << trial;
  }
}

TEST(StateChunks, MapRunsComposesAndMergesAdjacentRuns) {
  // A part that is every other row of 4 of a [8, 4] tensor (rows 1, 3, 5, 7).
  auto part_to_global = [](int64_t b, int64_t e) {
    Runs out;
    for (int64_t i = b; i < e;) {
      const int64_t row = i / 4, col = i % 4, len = std::min(e - i, 4 - col);
      const int64_t at = (2 * row + 1) * 4 + col;
      out.push_back({at, at + len});
      i += len;
    }
    return out;
  };
  EXPECT_EQ(MapRuns({{2, 9}}, part_to_global), (Runs{{6, 8}, {12, 16}, {20, 21}}));
  // Contiguous in the global tensor: merged.
  EXPECT_EQ(MapRuns({{0, 2}, {2, 4}}, [](int64_t b, int64_t e) { return Runs{{10 + b, 10 + e}}; }),
            (Runs{{10, 14}}));
  EXPECT_EQ(RunsLength({{0, 3}, {10, 12}}), 5);
}

}  // namespace
}  // namespace braid
