#include "launcher/optimization.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/check.h"
#include "core/registry.h"

namespace braid::launcher {

using config::TrainConfig;

OptimizerFactory MakeOptimizerFactory(const TrainConfig& cfg) {
  return [cfg](const std::vector<std::pair<std::string, Tensor>>& named) {
    const auto& p = cfg.optimizer().params();
    // Weight decay where the model asks for it (Linear weights and embeddings, as GPT training
    // does; not biases or norms).
    ParamGroup decay, no_decay;
    decay.lr = no_decay.lr = float(p.lr());
    decay.weight_decay = float(p.weight_decay());
    no_decay.weight_decay = 0.0f;
    // By the attribute the model set (biases and norms off), not by shape: a strategy that
    // flattens or shards parameters hands over 1-D pieces that keep their parameter's attribute.
    for (auto& [name, t] : named) (t.weight_decay() ? decay : no_decay).params.push_back(t);
    std::vector<ParamGroup> groups;
    for (ParamGroup* g : {&decay, &no_decay}) {
      if (!g->params.empty()) groups.push_back(*g);
    }
    // Registered by core (AdamW, SGD) or a plugin; validation checked the name.
    absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
        Registry::Get().MakeOptimizer(cfg.optimizer().type(), std::move(groups), cfg.optimizer());
    BRAID_CHECK(optimizer.ok()) << optimizer.status().ToString();
    return std::move(*optimizer);
  };
}

std::unique_ptr<LrSchedule> MakeSchedule(const TrainConfig& cfg) {
  if (cfg.scheduler().type() == "WarmupCosine") {
    const auto& s = cfg.scheduler().params();
    return WarmupCosineLr(float(s.warmup_max_lr()), float(s.min_lr()), s.warmup_num_steps(),
                          s.total_num_steps(), float(s.warmup_min_lr()));
  }
  return ConstantLr(float(cfg.optimizer().params().lr()));
}

}  // namespace braid::launcher
