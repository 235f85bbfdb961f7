#include "core/micro_batches.h"

#include <string>
#include <vector>

#include "core/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// y = w * x, loss = mean((y - t)^2): one parameter, so every gradient is easy to write down.
class Scalar : public Module {
 public:
  Scalar() : Module("Scalar") { w_ = RegisterParameter("w", Tensor::Full({1, 1}, 2.0f)); }
  Tensor Forward(const Tensor& x) override { return ops::Linear(x, w_, Tensor()); }
  Tensor w_;
};

LossFn Mse() {
  return [](Module& m, const Batch& b) {
    Tensor d = ops::Sub(m(b.inputs), b.targets);
    return ops::Mean(ops::Mul(d, d));
  };
}

Batch Make(std::vector<float> x, std::vector<float> t) {
  int64_t n = int64_t(x.size());
  return {Tensor::FromVector(x, {n, 1}), Tensor::FromVector(t, {n, 1})};
}

// The accumulated gradient is the mean over micro-batches (1/k), i.e. the gradient of the
// concatenation when the micro-batches are equal: the factor a wrong scaling would break.
TEST(RunMicroBatches, GradientIsTheMeanOverMicroBatches) {
  Scalar m;
  std::vector<Batch> mbs = {Make({1, 2}, {0, 0}), Make({3, 4}, {1, 1}), Make({0, 1}, {1, 0})};
  StepStats stats;
  ASSERT_TRUE(RunMicroBatches("test", m, mbs, Mse(), &stats).ok());
  // d/dw mean((w x - t)^2) = mean(2 x (w x - t)), w = 2.
  auto grad = [](std::vector<float> x, std::vector<float> t) {
    double g = 0;
    for (size_t i = 0; i < x.size(); ++i) g += 2 * x[i] * (2 * x[i] - t[i]);
    return g / double(x.size());
  };
  double want = (grad({1, 2}, {0, 0}) + grad({3, 4}, {1, 1}) + grad({0, 1}, {1, 0})) / 3;
  EXPECT_NEAR(m.w_.grad().item(), want, 1e-5 * want);
  auto loss = [](std::vector<float> x, std::vector<float> t) {
    double l = 0;
    for (size_t i = 0; i < x.size(); ++i) l += (2 * x[i] - t[i]) * (2 * x[i] - t[i]);
    return l / double(x.size());
  };
  EXPECT_NEAR(stats.loss, (loss({1, 2}, {0, 0}) + loss({3, 4}, {1, 1}) + loss({0, 1}, {1, 0})) / 3,
              1e-5);
  EXPECT_GE(stats.forward_s, 0);
  EXPECT_GE(stats.backward_s, 0);
}

TEST(RunMicroBatches, EventsRunInOrderWithLastMarked) {
  Scalar m;
  std::vector<std::string> log;
  MicroBatchEvents ev;
  ev.before_forward = [&](int i, bool last) { log.push_back("fwd" + std::to_string(i) + (last ? "L" : "")); };
  ev.before_backward = [&](int i, bool, const Tensor& loss) {
    EXPECT_TRUE(loss.requires_grad());
    log.push_back("bwd" + std::to_string(i));
  };
  ev.after_backward = [&](int i, bool) { log.push_back("done" + std::to_string(i)); };
  StepStats stats;
  ASSERT_TRUE(RunMicroBatches("test", m, {Make({1}, {0}), Make({2}, {0})}, Mse(), &stats, ev).ok());
  EXPECT_THAT(log, ElementsAre("fwd0", "bwd0", "done0", "fwd1L", "bwd1", "done1"));
}

TEST(RunMicroBatches, ABadLossNamesTheStrategyAndMicroBatchAndCallsOnBadLoss) {
  Scalar m;
  int bad = -1;
  MicroBatchEvents ev;
  ev.on_bad_loss = [&](int i) { bad = i; };
  int calls = 0;
  LossFn detached = [&](Module& mod, const Batch& b) {
    Tensor l = Mse()(mod, b);
    return ++calls == 2 ? l.Detach() : l;
  };
  StepStats stats;
  absl::Status st =
      RunMicroBatches("mine", m, {Make({1}, {0}), Make({2}, {0})}, detached, &stats, ev);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("strategy 'mine': the loss of micro-batch 1 is"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("depends on no trainable parameter"));
  EXPECT_EQ(bad, 1);
  EXPECT_EQ(RunMicroBatches("mine", m, {}, Mse(), &stats).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace braid
