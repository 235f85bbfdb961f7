#include "launcher/optimization.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/check.h"
#include "core/lr_schedule.h"
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
    // Registered by core (AdamW, Adam, SGD) or a plugin; validation checked the name.
    absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
        Registry::Get().MakeOptimizer(cfg.optimizer().type(), std::move(groups), cfg.optimizer());
    BRAID_CHECK(optimizer.ok()) << optimizer.status().ToString();
    return std::move(*optimizer);
  };
}

namespace {

deepspeed_lr::OneCycleParams OneCycleParamsOf(const TrainConfig& cfg) {
  const auto& s = cfg.scheduler().params();
  deepspeed_lr::OneCycleParams p{s.cycle_min_lr(),          s.cycle_max_lr(),
                                 s.cycle_first_step_size(), s.cycle_second_step_size(),
                                 s.decay_step_size(),       s.decay_lr_rate()};
  p.cycle_min_mom = s.cycle_min_mom();
  p.cycle_max_mom = s.cycle_max_mom();
  p.decay_mom_rate = s.decay_mom_rate();
  return p;
}

}  // namespace

BetasSchedule MakeBetasSchedule(const TrainConfig& cfg) {
  if (cfg.scheduler().type() != "OneCycle" || !cfg.scheduler().params().cycle_momentum()) {
    return nullptr;
  }
  return [p = OneCycleParamsOf(cfg)](int64_t step) {
    return std::make_pair(float(deepspeed_lr::OneCycleMomentum(p, step)),
                          float(deepspeed_lr::kOneCycleBeta2));
  };
}

std::unique_ptr<LrSchedule> MakeSchedule(const TrainConfig& cfg) {
  namespace ds = deepspeed_lr;
  const std::string& type = cfg.scheduler().type();
  const auto& s = cfg.scheduler().params();
  const ds::WarmupType warmup_type =
      s.warmup_type() == "linear" ? ds::WarmupType::kLinear : ds::WarmupType::kLog;
  if (type == "WarmupCosine") {
    return WarmupCosineLr(float(s.warmup_max_lr()), float(s.min_lr()), s.warmup_num_steps(),
                          s.total_num_steps(), float(s.warmup_min_lr()));
  }
  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    ds::WarmupParams w{s.warmup_min_lr(), s.warmup_max_lr(), s.warmup_num_steps(), warmup_type};
    return type == "WarmupLR" ? ds::WarmupLR(w) : ds::WarmupDecayLR(w, s.total_num_steps());
  }
  if (type == "WarmupCosineLR") {
    // The ratios are of the configured rate, never of the optimizer's current one (DeepSpeed
    // reads the latter at construction, which after a resume is the schedule's last value).
    return ds::WarmupCosineLR({cfg.optimizer().params().lr(), s.total_num_steps(),
                               s.warmup_min_ratio(), s.warmup_num_steps(), s.cos_min_ratio(),
                               warmup_type});
  }
  if (type == "OneCycle") return ds::OneCycle(OneCycleParamsOf(cfg));
  if (type == "LRRangeTest") {
    return ds::LRRangeTest({s.lr_range_test_min_lr(), s.lr_range_test_step_size(),
                            s.lr_range_test_step_rate(), s.lr_range_test_staircase()});
  }
  BRAID_CHECK(type == "Constant" || type.empty())
      << "scheduler.type \"" << type << "\" passed validation but has no schedule here";
  return ConstantLr(float(cfg.optimizer().params().lr()));
}

}  // namespace braid::launcher
