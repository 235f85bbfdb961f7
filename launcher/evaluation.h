// Held-out evaluation of a language model during training (the config's `eval` section): the
// validation loss and perplexity on fixed batches of the dataset's validation split, which the
// dataset supplies (DatasetSpec::validation; a prepared token data set's, models/data), through
// the strategy's EvaluateLoss, so it runs under every strategy and layout on the model as that
// strategy holds it. The loss is the model's own (ModelSpec::loss, the one it trains with), or
// cross-entropy when its registration names none. Split from trainer.cc.
#ifndef BRAID_LAUNCHER_EVALUATION_H_
#define BRAID_LAUNCHER_EVALUATION_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/batch.h"
#include "launcher/config/train_config.pb.h"
#include "core/module.h"
#include "core/strategy.h"

namespace braid::launcher {

struct EvalResult {
  double loss = 0;        // the model's loss, mean over the batches (cross-entropy: nats per token)
  double perplexity = 0;  // exp(loss): a perplexity when the loss is a cross-entropy
};

class Evaluation {
 public:
  // Null when the config has no eval section. Reads the dataset's validation split; one-line
  // errors when there is none, naming what to do. Every rank
  // evaluates the same batches (so the figure needs no reduction and equals one process's);
  // `input_dtype`: the dtype floating inputs are cast to (mixed precision), or f32.
  static absl::StatusOr<std::unique_ptr<Evaluation>> Create(const config::TrainConfig& cfg,
                                                            Device device, DType input_dtype);

  // Whether to evaluate after step index `step` (0-based) of `steps`.
  bool Due(int step, int steps) const;
  // The model in eval mode meanwhile (and back to training mode after); a collective: every
  // rank calls it at the same point.
  absl::StatusOr<EvalResult> Run(Strategy& strategy, Module& model) const;

  // The progress-output line and the metrics line ({"step": s, "val_loss": ..., "val_ppl": ...})
  // for an evaluation after step index `step`.
  static std::string Line(int step, int steps, const EvalResult& r);
  static std::string MetricJson(int step, const EvalResult& r);

  int64_t tokens() const;  // per evaluation

 private:
  Evaluation() = default;
  int every_steps_ = 0;
  std::vector<Batch> batches_;
  CriterionFn loss_;
};

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_EVALUATION_H_
