#include "launcher/evaluation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"
#include "launcher/config/config.h"
#include "launcher/mixed_precision/mixed_precision.h"
#include "core/ops.h"
#include "core/registry.h"

namespace braid::launcher {

absl::StatusOr<std::unique_ptr<Evaluation>> Evaluation::Create(const config::TrainConfig& cfg,
                                                               Device device, DType input_dtype) {
  if (!cfg.has_eval()) return std::unique_ptr<Evaluation>();
  // The dataset brings its validation split (DatasetSpec::validation), windows as long as the
  // model's context.
  BRAID_ASSIGN_OR_RETURN(DatasetSpec data, Registry::Get().GetDataset(cfg.data().dataset()));
  BRAID_ASSIGN_OR_RETURN(ModelSpec model, Registry::Get().GetModel(cfg.model().name()));
  if (!data.validation) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval needs a validation split, which data.dataset \"", cfg.data().dataset(),
        "\" does not provide: remove the eval section"));
  }
  const config::Sections sections = config::SectionsOf(cfg);  // read while loading, not kept
  BatchSourceRequest request;
  request.config = &sections;
  request.batch = cfg.train_micro_batch_size_per_gpu();
  request.context = model.context ? model.context(cfg.model()) : 1;
  request.device = device;
  BRAID_ASSIGN_OR_RETURN(std::vector<Batch> batches, data.validation(request));
  auto e = std::unique_ptr<Evaluation>(new Evaluation());
  e->every_steps_ = cfg.eval().every_steps();
  // The model's own loss (ModelSpec::loss), the one it trains with; cross-entropy when it names none.
  e->loss_ = model.loss ? model.loss : [](const Tensor& output, const Batch& b) {
    return ops::CrossEntropy(output, b.targets);
  };
  for (Batch& b : batches) e->batches_.push_back(input_dtype == DType::kF32 ? b : CastInputs(b, input_dtype));
  return e;
}

bool Evaluation::Due(int step, int steps) const {
  return (every_steps_ > 0 && (step + 1) % every_steps_ == 0) || step == steps - 1;
}

absl::StatusOr<EvalResult> Evaluation::Run(Strategy& strategy, Module& model) const {
  model.Eval();
  const CriterionFn& criterion = loss_;
  absl::StatusOr<double> loss = strategy.EvaluateLoss(
      batches_, [&criterion](Module& m, const Batch& b) { return criterion(m(b.inputs), b); });
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
