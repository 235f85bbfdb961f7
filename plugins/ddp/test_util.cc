// The shared helpers of the ddp plugin's tests (test_util.h).
#include "plugins/ddp/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/module.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/strategy.h"
#include "core/tensor.h"
#include "core/testing/compare.h"
#include "gtest/gtest.h"
#include "models/mlp/mlp.h"
#include "third_party/runfiles.h"

namespace braid::ddp_test {

using ::bazel::tools::cpp::runfiles::Runfiles;

std::unique_ptr<Module> MakeMlp(uint64_t seed) {
  models::MlpConfig c;
  c.in = kIn;
  c.hidden = kHidden;
  c.out = kClasses;
  c.seed = seed;
  return std::make_unique<models::Mlp>(c);
}

Batch MlpRows(int step, int first, int rows) {
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int r = first; r < first + rows; ++r) {
    for (int c = 0; c < kIn; ++c) x.push_back(std::sin(0.37f * float(step * 101 + r * 13 + c)));
    y.push_back(int32_t((step * 7 + r * 3) % kClasses));
  }
  return Batch{Tensor::FromVector(x, {rows, kIn}), Tensor::FromVector(y, {rows})};
}

Tensor CrossEntropyLoss(Module& model, const Batch& batch) {
  return ops::CrossEntropy(model(batch.inputs), batch.targets);
}

std::unique_ptr<Optimizer> AdamW(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Tensor> params;
  for (const auto& [n, p] : named) params.push_back(p);
  return MakeAdamW({ParamGroup{params, 0.01f, 0.1f}});
}

StateDict Snapshot(const Module& m) {
  StateDict out;
  for (const auto& [n, t] : m.StateDict()) out[n] = t.Clone();
  return out;
}

float MaxDiff(const StateDict& a, const StateDict& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    std::vector<float> x = t.ToFloatVector(), y = it->second.ToFloatVector();
    EXPECT_EQ(x.size(), y.size()) << name;
    // +infinity (never NaN) on a NaN or inf on either side, so std::max keeps it.
    worst = std::max(worst, testing::MaxAbsDiff(x, y));
  }
  return float(worst);
}

std::string PluginPath() {
  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
  EXPECT_NE(runfiles, nullptr) << error;
  return runfiles == nullptr ? "" : runfiles->Rlocation("braid/plugins/ddp/libbraid_ddp.so");
}

}  // namespace braid::ddp_test
