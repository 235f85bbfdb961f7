#include "launcher/evaluation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/mixed_precision.h"
#include "core/ops.h"
#include "models/data/token_manifest.h"
#include "models/data/validation_batches.h"

namespace braid::launcher {

absl::StatusOr<std::unique_ptr<Evaluation>> Evaluation::Create(const config::TrainConfig& cfg,
                                                               Device device, DType input_dtype) {
  if (!cfg.has_eval()) return std::unique_ptr<Evaluation>();
  const std::string& path = cfg.data().path();
  if (cfg.data().dataset() != "tokens" || !data::IsTokenDatasetPath(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval needs a validation split: set data { dataset: \"tokens\" path: \"<folder>\" } to a "
        "data set prepared with bazel run //tools:prepare_data -- --val_fraction=0.1 ... (data.path is \"",
        path, "\")"));
  }
  BRAID_ASSIGN_OR_RETURN(data::TokenDataset set, data::TokenDataset::Open(path));
  BRAID_ASSIGN_OR_RETURN(std::shared_ptr<const data::TokenFile> tokens,
                         set.Tokens(data::Split::kValidation));
  auto e = std::unique_ptr<Evaluation>(new Evaluation());
  e->every_steps_ = cfg.eval().every_steps();
  BRAID_ASSIGN_OR_RETURN(
      std::vector<Batch> batches,
      data::ValidationBatches(*tokens, cfg.eval().batches(), cfg.train_micro_batch_size_per_gpu(),
                              cfg.model().block_size(), device));
  for (Batch& b : batches) e->batches_.push_back(input_dtype == DType::kF32 ? b : CastInputs(b, input_dtype));
  return e;
}

bool Evaluation::Due(int step, int steps) const {
  return (every_steps_ > 0 && (step + 1) % every_steps_ == 0) || step == steps - 1;
}

absl::StatusOr<EvalResult> Evaluation::Run(Strategy& strategy, Module& model) const {
  model.Eval();
  absl::StatusOr<double> loss = strategy.EvaluateLoss(batches_, [](Module& m, const Batch& b) {
    return ops::CrossEntropy(m(b.inputs), b.targets);
  });
  model.Train();
  if (!loss.ok()) return loss.status();
  return EvalResult{*loss, std::exp(*loss)};
}

std::string Evaluation::Line(int step, int steps, const EvalResult& r) {
  return absl::StrFormat("eval %*d/%d | val loss %.4f | val ppl %.2f", int(std::to_string(steps).size()),
                         step + 1, steps, r.loss, r.perplexity);
}

std::string Evaluation::MetricJson(int step, const EvalResult& r) {
  // %.9g: a float's loss round-trips; the equivalence tests compare these figures.
  // JSON has no inf: a perplexity past double's range (a diverged model) is null.
  return absl::StrFormat("{\"step\": %d, \"val_loss\": %.9g, \"val_ppl\": %s}", step, r.loss,
                         std::isfinite(r.perplexity) ? absl::StrFormat("%.9g", r.perplexity)
                                                     : std::string("null"));
}

int64_t Evaluation::tokens() const {
  int64_t n = 0;
  for (const Batch& b : batches_) n += b.inputs.numel();
  return n;
}

}  // namespace braid::launcher
