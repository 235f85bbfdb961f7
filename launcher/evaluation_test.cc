// Held-out evaluation reports the model's own loss (ModelSpec::loss), the one it trains with,
// not a cross-entropy of its own: a model registered here with a label-smoothed cross-entropy is
// evaluated with exactly that loss, and its figure is not the plain cross-entropy's.
#include "launcher/evaluation.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/autograd.h"
#include "launcher/config/train_config.pb.h"
#include "core/ops.h"
#include "core/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::launcher {
namespace {

constexpr char kModel[] = "eval_loss_test_model";
constexpr char kData[] = "eval_loss_test_data";
constexpr int64_t kVocab = 8, kContext = 4, kBatch = 2;
constexpr float kSmoothing = 0.5f;

// A bigram table: logits [B, T, V] are rows of one [V, V] weight, with varied values.
class Bigram : public Module {
 public:
  explicit Bigram(Device d) : Module("Bigram") {
    std::vector<float> w(kVocab * kVocab);
    for (size_t i = 0; i < w.size(); ++i) w[i] = float((i * 37) % 11) * 0.4f - 2.0f;
    weight_ = RegisterParameter("weight", Tensor::FromVector(w, {kVocab, kVocab}, d));
  }
  Tensor Forward(const Tensor& ids) override { return ops::Embedding(weight_, ids); }

 private:
  Tensor weight_;
};

// Label smoothing: (1 - e) * cross-entropy + e * the mean over classes of -log p.
Tensor LabelSmoothed(const Tensor& logits, const Batch& b) {
  Tensor uniform = ops::Scale(ops::Mean(ops::Log(ops::Softmax(logits))), -1.0f);
  return ops::Add(ops::Scale(ops::CrossEntropy(logits, b.targets), 1.0f - kSmoothing),
                  ops::Scale(uniform, kSmoothing));
}

// Two validation batches of fixed ids; targets the next id.
std::vector<Batch> ValidationBatches() {
  std::vector<Batch> out;
  for (int k = 0; k < 2; ++k) {
    std::vector<int32_t> in, tg;
    for (int64_t i = 0; i < kBatch * kContext; ++i) {
      in.push_back(int32_t((5 * i + 3 * k + 1) % kVocab));
      tg.push_back(int32_t((5 * i + 3 * k + 2 + i % 3) % kVocab));
    }
    out.push_back({Tensor::FromVector(in, {kBatch, kContext}), Tensor::FromVector(tg, {kBatch, kContext})});
  }
  return out;
}

// Just enough of a strategy: the model as it is, forwards under NoGradGuard.
class PlainStrategy : public Strategy {
 public:
  explicit PlainStrategy(Module* m) : model_(m) {}
  std::string name() const override { return "plain"; }
  absl::Status Setup(Module&, const OptimizerFactory&, const StrategyContext&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>&, const LossFn&) override {
    return absl::UnimplementedError("evaluation only");
  }
  Optimizer* optimizer() override { return nullptr; }
  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override {
    return absl::UnimplementedError("evaluation only");
  }
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>&) override {
    return absl::UnimplementedError("evaluation only");
  }
  int data_parallel_rank() const override { return 0; }
  int data_parallel_size() const override { return 1; }
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    autograd::NoGradGuard no_grad;
    eval(*model_);
    return absl::OkStatus();
  }

 private:
  Module* model_;
};

void RegisterOnce(bool with_loss, const std::string& model_name) {
  if (Registry::Get().GetModel(model_name).ok()) return;
  ModelSpec model;
  model.build = [](const config::ModelConfig&, uint64_t, Device d) -> absl::StatusOr<std::unique_ptr<Module>> {
    return std::unique_ptr<Module>(std::make_unique<Bigram>(d));
  };
  model.takes = "tokens";
  model.context = [](const config::ModelConfig&) { return kContext; };
  if (with_loss) model.loss = LabelSmoothed;
  ASSERT_TRUE(Registry::Get().AddModel(model_name, std::move(model), "launcher/evaluation_test.cc").ok());
  if (Registry::Get().GetDataset(kData).ok()) return;
  DatasetSpec data;
  data.yields = "tokens";
  data.vocab_size = kVocab;
  data.validation = [](const BatchSourceRequest& r) -> absl::StatusOr<std::vector<Batch>> {
    EXPECT_EQ(r.batch, kBatch);
    EXPECT_EQ(r.context, kContext);
    return ValidationBatches();
  };
  ASSERT_TRUE(Registry::Get().AddDataset(kData, std::move(data), "launcher/evaluation_test.cc").ok());
}

config::TrainConfig Config(const std::string& model_name) {
  config::TrainConfig cfg;
  cfg.mutable_model()->set_name(model_name);
  cfg.mutable_data()->set_dataset(kData);
  cfg.set_train_micro_batch_size_per_gpu(int32_t(kBatch));
  cfg.mutable_eval()->set_every_steps(1);
  return cfg;
}

// Label smoothing and cross-entropy of one batch in double, from the logits: the oracle.
struct Oracle {
  double smoothed = 0, cross_entropy = 0;
};
Oracle ByHand(Module& model, const Batch& b) {
  std::vector<float> logits = model(b.inputs).ToFloatVector();
  std::vector<float> targets = b.targets.ToFloatVector();
  Oracle o;
  const size_t rows = targets.size();
  for (size_t r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * kVocab;
    double mx = x[0], sum = 0, mean_neg_logp = 0;
    for (int64_t v = 1; v < kVocab; ++v) mx = std::max(mx, double(x[v]));
    for (int64_t v = 0; v < kVocab; ++v) sum += std::exp(double(x[v]) - mx);
    const double lse = mx + std::log(sum);
    for (int64_t v = 0; v < kVocab; ++v) mean_neg_logp += (lse - double(x[v])) / double(kVocab);
    const double ce = lse - double(x[size_t(targets[r])]);
    o.cross_entropy += ce / double(rows);
    o.smoothed += ((1.0 - kSmoothing) * ce + kSmoothing * mean_neg_logp) / double(rows);
  }
  return o;
}

TEST(EvaluationTest, ReportsTheModelsOwnLossNotCrossEntropy) {
  RegisterOnce(/*with_loss=*/true, kModel);
  config::TrainConfig cfg = Config(kModel);
  absl::StatusOr<std::unique_ptr<Evaluation>> eval = Evaluation::Create(cfg, Device::CPU(), DType::kF32);
  ASSERT_TRUE(eval.ok()) << eval.status();
  ASSERT_NE(*eval, nullptr);
  Bigram model(Device::CPU());
  PlainStrategy strategy(&model);
  absl::StatusOr<EvalResult> r = (*eval)->Run(strategy, model);
  ASSERT_TRUE(r.ok()) << r.status();

  // Exactly the model's loss, averaged over the batches as the training program averages it.
  double want = 0, by_hand = 0, cross_entropy = 0;
  for (const Batch& b : ValidationBatches()) {
    want += double(LabelSmoothed(model(b.inputs), b).item()) / 2.0;
    const Oracle o = ByHand(model, b);
    by_hand += o.smoothed / 2.0;
    cross_entropy += o.cross_entropy / 2.0;
  }
  ASSERT_TRUE(std::isfinite(r->loss));
  EXPECT_EQ(r->loss, want);
  EXPECT_NEAR(r->loss, by_hand, 1e-5 * by_hand);
  // And not the cross-entropy: the two differ by far more than rounding here.
  EXPECT_GT(std::abs(cross_entropy - by_hand), 0.1) << cross_entropy << " vs " << by_hand;
  EXPECT_DOUBLE_EQ(r->perplexity, std::exp(r->loss));
  EXPECT_THAT(Evaluation::MetricJson(0, *r), ::testing::HasSubstr(absl::StrFormat("\"val_loss\": %.9g", want)));
}

TEST(EvaluationTest, AModelWithoutALossOfItsOwnIsEvaluatedByCrossEntropy) {
  const std::string name = absl::StrCat(kModel, "_ce");
  RegisterOnce(/*with_loss=*/false, name);
  absl::StatusOr<std::unique_ptr<Evaluation>> eval =
      Evaluation::Create(Config(name), Device::CPU(), DType::kF32);
  ASSERT_TRUE(eval.ok()) << eval.status();
  Bigram model(Device::CPU());
  PlainStrategy strategy(&model);
  absl::StatusOr<EvalResult> r = (*eval)->Run(strategy, model);
  ASSERT_TRUE(r.ok()) << r.status();
  double want = 0;
  for (const Batch& b : ValidationBatches()) want += ByHand(model, b).cross_entropy / 2.0;
  ASSERT_TRUE(std::isfinite(r->loss));
  EXPECT_NEAR(r->loss, want, 1e-5 * want);
}

}  // namespace
}  // namespace braid::launcher
