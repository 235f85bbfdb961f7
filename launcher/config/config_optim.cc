// Validation of the optimizer and scheduler sections (part of ValidateConfigWith, config.cc):
// the registered optimizers and DeepSpeed's names Braid lacks, the schedulers with DeepSpeed's
// parameter names, and which params each type takes.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launcher/config/config_internal.h"
#include "core/registry.h"
#include "google/protobuf/descriptor.h"

namespace braid::config::internal {
namespace {

namespace pb = google::protobuf;

constexpr double kDefaultLr = 1e-3;

// Optimizers a DeepSpeed config may name (DeepSpeed's own, and the torch.optim classes it falls
// back to) that Braid has not: refused by name with the nearest Braid optimizer, unless a plugin
// registered the name (then it is an ordinary registered optimizer).
struct Missing {
  const char* name;
  const char* what;     // what Braid lacks
  const char* nearest;  // a Braid optimizer
};
constexpr Missing kMissingOptimizers[] = {
    {"Lamb", "LAMB's layer-wise trust ratio", "AdamW"},
    {"OneBitAdam", "1-bit Adam's compressed gradient communication", "Adam"},
    {"ZeroOneAdam", "0/1 Adam's compressed gradient communication", "Adam"},
    {"OneBitLamb", "1-bit LAMB's trust ratio and compressed communication", "AdamW"},
    {"Lion", "Lion's sign update", "AdamW"},
    {"MuAdam", "muP's width-scaled learning rates", "Adam"},
    {"MuAdamW", "muP's width-scaled learning rates", "AdamW"},
    {"MuSGD", "muP's width-scaled learning rates", "SGD"},
    {"Adagrad", "Adagrad's accumulated squares", "Adam"},
    {"RMSprop", "RMSprop", "Adam"},
    {"Adamax", "Adamax's infinity norm", "Adam"},
    {"NAdam", "Nesterov-accelerated Adam", "Adam"},
    {"RAdam", "rectified Adam", "Adam"},
    {"Adadelta", "Adadelta", "Adam"},
    {"LBFGS", "L-BFGS", "SGD"},
    {"SparseAdam", "sparse gradients", "Adam"},
};

// The SchedulerParams fields each scheduler.type takes.
struct SchedulerSpec {
  const char* type;
  std::vector<std::string> params;
};
const std::vector<SchedulerSpec>& Schedulers() {
  static const auto* specs = new std::vector<SchedulerSpec>{
      {"Constant", {}},
      {"WarmupCosine",
       {"warmup_num_steps", "total_num_steps", "warmup_max_lr", "warmup_min_lr", "min_lr"}},
      {"WarmupLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"}},
      {"WarmupDecayLR",
       {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"}},
      {"WarmupCosineLR",
       {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
        "warmup_type"}},
      {"OneCycle",
       {"cycle_min_lr", "cycle_max_lr", "cycle_first_step_size", "cycle_second_step_size",
        "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size",
        "decay_lr_rate", "cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate"}},
      {"LRRangeTest",
       {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
        "lr_range_test_staircase"}},
  };
  return *specs;
}


// The peak rate of the warm-up schedules that name it (WarmupCosine, WarmupLR, WarmupDecayLR):
// it and optimizer.params.lr are one number (ValidateConfigWith already copied a peak given
// alone into the optimizer). Returns false when the optimizer's rate is unusable (reported with
// the optimizer).
bool CheckPeak(Checker& c, TrainConfig* cfg) {
  SchedulerParams* p = cfg->mutable_scheduler()->mutable_params();
  const OptimizerParams& opt = cfg->optimizer().params();
  if (!(std::isfinite(opt.lr()) && opt.lr() > 0)) return false;
  if (!p->has_warmup_max_lr()) {
    p->set_warmup_max_lr(opt.lr());
  } else if (p->warmup_max_lr() != opt.lr()) {
    c.Error(absl::StrCat("scheduler.params.warmup_max_lr (", Num(p->warmup_max_lr()),
                         ") != optimizer.params.lr (", Num(opt.lr()),
                         "): they are the same peak rate; give one of them"));
    return false;
  }
  return true;
}

// A rate in [0, peak], named "scheduler.params.<name>".
void CheckBelowPeak(Checker& c, const std::string& name, double v, double peak) {
  if (c.NonNegativeReal(absl::StrCat("scheduler.params.", name), v) && v > peak) {
    c.Error(absl::StrCat("scheduler.params.", name, " (", Num(v),
                         ") > the peak rate scheduler.params.warmup_max_lr (", Num(peak), ")"));
  }
}

// total_num_steps (default: steps), and the warm-up it must exceed. `strictly`: the cosine and
// the decay of DeepSpeed's schedules need at least one step after the warm-up.
void CheckTotalSteps(Checker& c, TrainConfig* cfg, bool strictly) {
  SchedulerParams* p = cfg->mutable_scheduler()->mutable_params();
  if (!p->has_total_num_steps()) {
    if (cfg->steps() < 1) return;  // reported with steps
    p->set_total_num_steps(cfg->steps());
  }
  bool ok = c.NonNegative("scheduler.params.warmup_num_steps", p->warmup_num_steps());
  ok &= c.Positive("scheduler.params.total_num_steps", p->total_num_steps());
  if (!ok) return;
  if (!strictly && p->warmup_num_steps() > p->total_num_steps()) {
    c.Error(absl::StrCat("scheduler.params.warmup_num_steps (", p->warmup_num_steps(),
                         ") > scheduler.params.total_num_steps (", p->total_num_steps(), ")"));
  }
  // DeepSpeed counts a warm-up shorter than 2 steps as 2.
  const int64_t warmup = std::max<int64_t>(2, p->warmup_num_steps());
  if (strictly && p->total_num_steps() <= warmup) {
    c.Error(absl::StrCat("scheduler.params.total_num_steps (", p->total_num_steps(),
                         ") must be > the warm-up's ", warmup,
                         " steps (warmup_num_steps, at least 2 as in DeepSpeed) for ",
                         cfg->scheduler().type()));
  }
}

void CheckWarmupType(Checker& c, SchedulerParams* p) {
  c.Name(p->mutable_warmup_type(), "scheduler.params.warmup_type", {"log", "linear"}, "log");
}

void CheckOneCycle(Checker& c, TrainConfig* cfg) {
  SchedulerParams* p = cfg->mutable_scheduler()->mutable_params();
  if (!p->has_cycle_min_lr()) c.Error("scheduler.params.cycle_min_lr is required by OneCycle");
  if (!p->has_cycle_max_lr()) c.Error("scheduler.params.cycle_max_lr is required by OneCycle");
  if (p->has_cycle_min_lr()) c.NonNegativeReal("scheduler.params.cycle_min_lr", p->cycle_min_lr());
  if (p->has_cycle_max_lr()) c.PositiveReal("scheduler.params.cycle_max_lr", p->cycle_max_lr());
  if (!p->has_cycle_first_step_size()) p->set_cycle_first_step_size(2000);
  if (!p->has_cycle_second_step_size()) p->set_cycle_second_step_size(p->cycle_first_step_size());
  c.Positive("scheduler.params.cycle_first_step_size", p->cycle_first_step_size());
  c.Positive("scheduler.params.cycle_second_step_size", p->cycle_second_step_size());
  if (!p->has_cycle_first_stair_count()) p->set_cycle_first_stair_count(0);
  if (!p->has_cycle_second_stair_count()) {
    p->set_cycle_second_stair_count(p->cycle_first_stair_count());
  }
  c.NonNegative("scheduler.params.cycle_first_stair_count", p->cycle_first_stair_count());
  c.NonNegative("scheduler.params.cycle_second_stair_count", p->cycle_second_stair_count());
  if (!p->has_decay_step_size()) p->set_decay_step_size(0);
  c.NonNegative("scheduler.params.decay_step_size", p->decay_step_size());
  if (!p->has_decay_lr_rate()) p->set_decay_lr_rate(0.0);
  c.NonNegativeReal("scheduler.params.decay_lr_rate", p->decay_lr_rate());
  // DeepSpeed cycles Adam's beta1 inversely to the rate (betas (momentum, 0.99)) unless told
  // not to, and only for an optimizer with betas: for any other it turns cycling off with a
  // warning. Braid does the same, with a note (ignored_fields).
  if (!p->has_cycle_momentum()) p->set_cycle_momentum(true);  // DeepSpeed's default
  if (!p->has_cycle_min_mom()) p->set_cycle_min_mom(0.8);
  if (!p->has_cycle_max_mom()) p->set_cycle_max_mom(0.9);
  if (!p->has_decay_mom_rate()) p->set_decay_mom_rate(0.0);
  if (!p->cycle_momentum()) return;
  const std::string& type = cfg->optimizer().type();
  if (!absl::EqualsIgnoreCase(type, "Adam") && !absl::EqualsIgnoreCase(type, "AdamW") &&
      !absl::EqualsIgnoreCase(type, "Adam8bit")) {
    p->set_cycle_momentum(false);
    cfg->add_ignored_fields(absl::StrCat("scheduler.params.cycle_momentum (", type, ")"));
    return;
  }
  const double lo = p->cycle_min_mom(), hi = p->cycle_max_mom();
  if (!(lo >= 0 && lo <= hi && hi < 1)) {
    c.Error(absl::StrCat("scheduler.params.cycle_min_mom (", Num(lo), ") and cycle_max_mom (",
                         Num(hi), ") must satisfy 0 <= cycle_min_mom <= cycle_max_mom < 1 (they "
                         "are Adam's beta1)"));
    return;
  }
  c.NonNegativeReal("scheduler.params.decay_mom_rate", p->decay_mom_rate());
  // After the cycle DeepSpeed grows beta1 as cycle_max_mom x (1 + decay_mom_rate x interval);
  // Adam's bias correction breaks once it reaches 1, so the run's last step must stay below.
  const int64_t total = int64_t(p->cycle_first_step_size()) + p->cycle_second_step_size();
  if (p->decay_step_size() > 0 && p->decay_mom_rate() > 0 && cfg->steps() > total) {
    const double last = hi * (1 + p->decay_mom_rate() * double(cfg->steps() - total) /
                                      double(p->decay_step_size()));
    if (last >= 1) {
      c.Error(absl::StrCat("scheduler.params.decay_mom_rate (", Num(p->decay_mom_rate()),
                           ") grows beta1 to ", Num(last), " by step ", cfg->steps(),
                           "; Adam needs beta1 < 1: lower decay_mom_rate or raise "
                           "decay_step_size"));
    }
  }
}

}  // namespace

void CheckOptimizer(Checker& c, TrainConfig* cfg) {
  const Registry& registry = Registry::Get();
  OptimizerConfig* opt = cfg->mutable_optimizer();
  const std::vector<std::string> known = registry.OptimizerNames();
  bool registered = opt->type().empty();
  for (const std::string& k : known) registered |= absl::EqualsIgnoreCase(k, opt->type());
  if (!registered) {
    for (const Missing& m : kMissingOptimizers) {
      if (!absl::EqualsIgnoreCase(m.name, opt->type())) continue;
      c.Error(absl::StrCat("optimizer.type ", Quoted(opt->type()),
                           " is a DeepSpeed optimizer Braid does not have (", m.what, "); use ",
                           Quoted(m.nearest), ", the nearest, or a plugin that registers ",
                           Quoted(m.name), " (known: ", absl::StrJoin(known, ", "), ")"));
      return;
    }
  }
  if (!c.Name(opt->mutable_type(), "optimizer.type", known, registry.DefaultOptimizer())) return;
  absl::StatusOr<OptimizerSpec> spec = registry.GetOptimizer(opt->type());
  if (!spec.ok()) {
    c.Error(std::string(spec.status().message()));
    return;
  }
  OptimizerParams* p = opt->mutable_params();
  if (!p->has_lr()) p->set_lr(kDefaultLr);
  c.PositiveReal("optimizer.params.lr", p->lr());
  if (p->has_weight_decay()) c.NonNegativeReal("optimizer.params.weight_decay", p->weight_decay());
  // Every optimizer takes lr and weight_decay; the other params belong to those that name them.
  for (const pb::FieldDescriptor* f : SetFields(*p, {"lr", "weight_decay"})) {
    if (Has(spec->params, f->name())) continue;
    std::vector<std::string> takers;
    for (const std::string& name : known) {
      absl::StatusOr<OptimizerSpec> other = registry.GetOptimizer(name);
      if (other.ok() && Has(other->params, f->name())) takers.push_back(name);
    }
    c.Error(absl::StrCat("optimizer.params.", f->name(), " applies to ",
                         takers.empty() ? "no registered optimizer"
                                        : absl::StrCat(JoinWords(takers, "and"), " only"),
                         " (optimizer.type is ", Quoted(opt->type()), ")"));
  }
  if (spec->validate) {
    ConfigProblems problems;
    spec->validate(opt, &problems);
    for (std::string& problem : problems) c.Error(std::move(problem));
  }
}

void CheckScheduler(Checker& c, TrainConfig* cfg) {
  SchedulerConfig* s = cfg->mutable_scheduler();
  std::vector<std::string> types;
  for (const SchedulerSpec& spec : Schedulers()) types.push_back(spec.type);
  if (!c.Name(s->mutable_type(), "scheduler.type", types, "Constant")) return;
  const std::string& type = s->type();
  SchedulerParams* p = s->mutable_params();

  // Params of another type: named, with the types that take them.
  const SchedulerSpec* spec = nullptr;
  for (const SchedulerSpec& sp : Schedulers()) {
    if (sp.type == type) spec = &sp;
  }
  bool foreign = false;
  for (const pb::FieldDescriptor* f : SetFields(*p, spec->params)) {
    std::vector<std::string> takers;
    for (const SchedulerSpec& sp : Schedulers()) {
      if (Has(sp.params, f->name())) takers.push_back(Quoted(sp.type));
    }
    c.Error(absl::StrCat("scheduler.params.", f->name(), " applies to scheduler.type ",
                         JoinWords(takers, "and"), " only (the type is ", Quoted(type),
                         "); remove it or change the type"));
    foreign = true;
  }
  if (foreign) return;

  if (type == "WarmupCosine") {
    if (!p->has_warmup_num_steps()) p->set_warmup_num_steps(0);
    CheckTotalSteps(c, cfg, /*strictly=*/false);
    if (!p->has_warmup_min_lr()) p->set_warmup_min_lr(0.0);
    if (!p->has_min_lr()) p->set_min_lr(0.0);
    if (!CheckPeak(c, cfg)) return;
    CheckBelowPeak(c, "warmup_min_lr", p->warmup_min_lr(), p->warmup_max_lr());
    CheckBelowPeak(c, "min_lr", p->min_lr(), p->warmup_max_lr());
  } else if (type == "WarmupLR" || type == "WarmupDecayLR") {
    if (!p->has_warmup_num_steps()) p->set_warmup_num_steps(1000);  // DeepSpeed's
    if (type == "WarmupDecayLR") {
      CheckTotalSteps(c, cfg, /*strictly=*/true);
    } else {
      c.NonNegative("scheduler.params.warmup_num_steps", p->warmup_num_steps());
    }
    CheckWarmupType(c, p);
    if (!p->has_warmup_min_lr()) p->set_warmup_min_lr(0.0);
    if (!CheckPeak(c, cfg)) return;
    CheckBelowPeak(c, "warmup_min_lr", p->warmup_min_lr(), p->warmup_max_lr());
  } else if (type == "WarmupCosineLR") {
    if (!p->has_warmup_num_steps()) p->set_warmup_num_steps(1000);  // DeepSpeed's
    CheckTotalSteps(c, cfg, /*strictly=*/true);
    CheckWarmupType(c, p);
    if (!p->has_warmup_min_ratio()) p->set_warmup_min_ratio(0.0);
    if (!p->has_cos_min_ratio()) p->set_cos_min_ratio(1e-4);
    for (const auto& [name, v] : {std::make_pair("warmup_min_ratio", p->warmup_min_ratio()),
                                  std::make_pair("cos_min_ratio", p->cos_min_ratio())}) {
      if (!(v >= 0 && v <= 1)) {
        c.Error(absl::StrCat("scheduler.params.", name, " (", Num(v),
                             ") must be in [0, 1]: a fraction of optimizer.params.lr"));
      }
    }
  } else if (type == "OneCycle") {
    CheckOneCycle(c, cfg);
  } else if (type == "LRRangeTest") {
    if (!p->has_lr_range_test_min_lr()) p->set_lr_range_test_min_lr(1e-3);
    if (!p->has_lr_range_test_step_size()) p->set_lr_range_test_step_size(2000);
    if (!p->has_lr_range_test_step_rate()) p->set_lr_range_test_step_rate(1.0);
    if (!p->has_lr_range_test_staircase()) p->set_lr_range_test_staircase(false);
    c.PositiveReal("scheduler.params.lr_range_test_min_lr", p->lr_range_test_min_lr());
    c.Positive("scheduler.params.lr_range_test_step_size", p->lr_range_test_step_size());
    c.NonNegativeReal("scheduler.params.lr_range_test_step_rate", p->lr_range_test_step_rate());
  }
}

}  // namespace braid::config::internal

namespace braid::config {

bool IsDeepSpeedOptimizerBraidLacks(const std::string& type) {
  for (const internal::Missing& m : internal::kMissingOptimizers) {
    if (absl::EqualsIgnoreCase(m.name, type)) return true;
  }
  return false;
}

}  // namespace braid::config
