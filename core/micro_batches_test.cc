#include "core/micro_batches.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/optimizer.h"
#include "core/scalar_reads.h"
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

// read_loss_later leaves the mean loss on the device (stats.loss untouched) and
// ReadStepScalarsAndClip reads it with the gradient norm: the same loss as the immediate read,
// the same norm as ClipGradNorm, and clipping applied (the CPU side of the one-read step that
// tests/device_sync counts on the fake GPU).
TEST(ReadStepScalarsAndClip, ReadsTheDeferredLossAndTheNormAndClips) {
  std::vector<Batch> mbs = {Make({1, 2}, {0, 0}), Make({3, 4}, {1, 1})};
  Scalar now, later;
  StepStats read_now, deferred;
  ASSERT_TRUE(RunMicroBatches("test", now, mbs, Mse(), &read_now).ok());
  MicroBatchEvents ev;
  ev.read_loss_later = true;
  deferred.loss = -1.0f;
  ASSERT_TRUE(RunMicroBatches("test", later, mbs, Mse(), &deferred, ev).ok());
  EXPECT_EQ(deferred.loss, -1.0f);  // not read yet
  ASSERT_TRUE(deferred.device_loss.defined());
  const float want_norm = ClipGradNorm(now.Parameters(), 0.0f);  // measures only
  ASSERT_GT(want_norm, 1.0f);
  auto opt = MakeSgd({ParamGroup{later.Parameters(), 0.1f, 0.0f}});
  ReadStepScalarsAndClip(*opt, later.Parameters(), /*max_norm=*/1.0f,
                         [](double local) { return local; }, &deferred);
  EXPECT_EQ(deferred.loss, read_now.loss);
  EXPECT_EQ(deferred.grad_norm, want_norm);
  // Clipped to norm 1 (within the 1e-6 PyTorch's rule adds to the norm).
  EXPECT_NEAR(std::abs(later.w_.grad().item()), 1.0f, 1e-5f);
}

TEST(ReadScalars, ReadsEachScalarAndUndefinedAsZero) {
  Tensor a = Tensor::Full({}, 2.5f), b = Tensor::Full({1}, -0.75f).To(DType::kBF16);
  EXPECT_THAT(ReadScalars({a, Tensor(), b}), ElementsAre(2.5f, 0.0f, -0.75f));
  EXPECT_TRUE(ReadScalars({}).empty());
  EXPECT_DEATH(ReadScalars({Tensor::Full({2}, 1.0f)}), "not a one-element floating tensor");
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
