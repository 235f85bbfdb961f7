#include "core/testing/equivalence.h"

#include "core/testing/compare.h"
#include "gtest/gtest.h"

namespace braid::testing {

OptimizerFactory GroupedByWeightDecay(bool adamw, float lr, float weight_decay) {
  return [=](const std::vector<std::pair<std::string, Tensor>>& named) {
    ParamGroup decay, none;
    decay.lr = none.lr = lr;
    decay.weight_decay = weight_decay;
    for (auto& [n, t] : named) (t.weight_decay() ? decay : none).params.push_back(t);
    std::vector<ParamGroup> groups;
    for (ParamGroup* g : {&decay, &none}) {
      if (!g->params.empty()) groups.push_back(*g);
    }
    return adamw ? MakeAdamW(std::move(groups)) : MakeSgd(std::move(groups));
  };
}

double MaxRelativeDifference(const std::map<std::string, Tensor>& got,
                             const std::map<std::string, Tensor>& want, std::string* worst) {
  double max = 0;
  EXPECT_EQ(got.size(), want.size());
  for (auto& [n, w] : want) {
    auto it = got.find(n);
    if (it == got.end()) {
      ADD_FAILURE() << "missing " << n;
      continue;
    }
    std::vector<float> a = it->second.ToFloatVector(), b = w.ToFloatVector();
    EXPECT_EQ(a.size(), b.size()) << n;
    // +infinity for a NaN or inf on either side (or sizes that differ), so that comparing the
    // result with 0 or a tolerance fails on diverged weights.
    const double d = MaxRelDiff(a, b, /*floor=*/1);
    if (d > max) {
      max = d;
      *worst = n;
    }
  }
  return max;
}

}  // namespace braid::testing
