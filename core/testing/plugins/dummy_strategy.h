// A strategy that does nothing, for the test plugins.
#ifndef BRAID_CORE_TESTING_PLUGINS_DUMMY_STRATEGY_H_
#define BRAID_CORE_TESTING_PLUGINS_DUMMY_STRATEGY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/strategy.h"

namespace braid::testing {

class DummyStrategy : public Strategy {
 public:
  explicit DummyStrategy(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  absl::Status Setup(Module&, const OptimizerFactory&, const StrategyContext&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>&, const LossFn&) override {
    return StepStats{};
  }
  Optimizer* optimizer() override { return nullptr; }
  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override {
    return std::map<std::string, Tensor>{};
  }
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>&) override {
    return absl::OkStatus();
  }
  int data_parallel_rank() const override { return 0; }
  int data_parallel_size() const override { return 1; }
  absl::Status Evaluate(const std::function<void(Module&)>&) override { return absl::OkStatus(); }

 private:
  std::string name_;
};

}  // namespace braid::testing

#endif  // BRAID_CORE_TESTING_PLUGINS_DUMMY_STRATEGY_H_
