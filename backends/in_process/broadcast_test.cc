// BroadcastTensors / BroadcastModuleState on 3 ranks as threads: every rank ends with the root's
// values, across dtypes, with a cap small enough to split the tensors over several collectives.
#include "core/broadcast.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/in_process/in_process_communicator.h"
#include "core/module.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

// Rank r's own values: r * 100 + i, so a rank that kept its own (or got the wrong root's) shows.
std::vector<Tensor> RankTensors(int rank) {
  std::vector<Tensor> out;
  for (int64_t n : {3, 1, 17, 5}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(rank * 100 + i);
    out.push_back(Tensor::FromVector(v, {n}));
  }
  Tensor half = Tensor::Full({4}, float(rank + 1));
  half.ConvertTo(DType::kBF16);
  out.push_back(half);
  return out;
}

void OnRanks(int n, const std::function<void(int, Communicator&)>& body) {
  std::vector<std::unique_ptr<Communicator>> group = MakeInProcessGroup(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r, *group[size_t(r)]); });
  for (auto& t : threads) t.join();
}

TEST(BroadcastTensors, EveryRankGetsTheRootsValues) {
  for (int64_t cap : {int64_t(8), int64_t(1) << 20}) {  // 8 bytes: one tensor per collective
    std::vector<std::vector<Tensor>> mine(3);
    for (int r = 0; r < 3; ++r) mine[size_t(r)] = RankTensors(r);
    OnRanks(3, [&](int r, Communicator& comm) {
      EXPECT_TRUE(BroadcastTensors(mine[size_t(r)], comm, /*root=*/1, cap).ok());
    });
    const std::vector<Tensor> want = RankTensors(1);
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(mine[size_t(r)].size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(mine[size_t(r)][i].dtype(), want[i].dtype());
        EXPECT_EQ(mine[size_t(r)][i].ToFloatVector(), want[i].ToFloatVector())
            << "rank " << r << ", tensor " << i << ", cap " << cap;
      }
    }
  }
}

class Tiny : public Module {
 public:
  explicit Tiny(float v) : Module("Tiny") {
    w_ = RegisterParameter("w", Tensor::Full({2, 3}, v));
    RegisterBuffer("count", Tensor::Full({1}, v * 10));
  }
  Tensor Forward(const Tensor& x) override { return x; }

 private:
  Tensor w_;
};

TEST(BroadcastModuleState, ParametersAndBuffersComeFromTheRoot) {
  std::vector<std::unique_ptr<Tiny>> models;
  for (int r = 0; r < 2; ++r) models.push_back(std::make_unique<Tiny>(float(r + 1)));
  OnRanks(2, [&](int r, Communicator& comm) {
    EXPECT_TRUE(BroadcastModuleState(*models[size_t(r)], comm, /*root=*/0).ok());
  });
  for (int r = 0; r < 2; ++r) {
    auto state = models[size_t(r)]->StateDict();
    EXPECT_EQ(state.at("w").ToFloatVector(), std::vector<float>(6, 1.0f)) << "rank " << r;
    EXPECT_EQ(state.at("count").ToFloatVector(), std::vector<float>{10.0f}) << "rank " << r;
  }
}

}  // namespace
}  // namespace braid
