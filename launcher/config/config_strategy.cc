// The strategy side of validation: the parallel layout against the world size, and the
// feature sections (fp16, bf16, zero_optimization) against what the chosen strategy declares
// (StrategyTraits, possibly from a plugin); also the feature names (ZeroFeatureName,
// RequestedFeatures). Separate from the other section checks (config.cc) because these are the
// ones that ask about strategies. No strategy is known here by name: which strategies serve a
// layout is the composer's answer (StrategyCatalog::compose), and what a strategy implements its
// declared features'.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launcher/config/config.h"
#include "launcher/config/config_internal.h"

namespace braid::config {
namespace internal {
namespace {

// "plugin libbraid_zero.so" for a plugin's file, the origin itself otherwise ("built-in").
std::string DescribeOrigin(const std::string& origin) {
  if (absl::EndsWith(origin, ".so")) {
    return absl::StrCat("plugin ", origin.substr(origin.rfind('/') + 1));
  }
  return origin;
}

// Checks feature sections against what the chosen strategy declares, asking the catalog only
// when a section needs a feature (so a config without one loads no plugin to be validated).
class FeatureCheck {
 public:
  FeatureCheck(Checker& c, const StrategyCatalog& catalog, const std::string& strategy,
               const std::string& path)
      : c_(c), catalog_(catalog), strategy_(strategy), path_(path) {}

  void Require(const std::string& section, const std::string& feature) {
    if (strategy_.empty() && !path_.empty()) return;  // a path without a name: reported there
    if (!asked_) {
      asked_ = true;
      absl::StatusOr<std::vector<std::string>> features = std::vector<std::string>();
      if (catalog_.features_of) features = catalog_.features_of(strategy_);
      if (features.ok()) {
        features_ = *std::move(features);
      } else {
        // Without the strategy its features are unknown: one problem, not one per section.
        unknown_ = true;
        c_.Error(absl::StrCat("strategy.name ", Quoted(strategy_), " (needed to check ", section,
                              "): ", features.status().message()));
      }
    }
    if (unknown_ || Has(features_, feature)) return;
    FeatureProviders found;
    if (catalog_.providers_of) found = catalog_.providers_of(feature);
    std::string message =
        absl::StrCat(section, " needs a strategy that provides ", Quoted(feature), "; strategy ",
                     Quoted(strategy_), " does not");
    if (!found.strategies.empty()) {
      std::vector<std::string> uses;
      for (const FeatureProvider& p : found.strategies) {
        uses.push_back(absl::StrCat(Quoted(p.strategy), " (", DescribeOrigin(p.origin), ")"));
      }
      absl::StrAppend(&message, "; use strategy.name ", JoinWords(uses, "or"));
    } else {
      absl::StrAppend(&message, ", and no ", catalog_.searched,
                      " does: it is not available yet; remove the section or add a plugin "
                      "whose strategy provides it");
    }
    if (!found.unloadable.empty()) {
      absl::StrAppend(&message, " (plugin files that could not be loaded while looking: ",
                      absl::StrJoin(found.unloadable, ", "), ")");
    }
    c_.Error(std::move(message));
  }

 private:
  Checker& c_;
  const StrategyCatalog& catalog_;
  const std::string strategy_, path_;
  bool asked_ = false, unknown_ = false;
  std::vector<std::string> features_;
};

}  // namespace

void CheckFeatures(Checker& c, TrainConfig* cfg, const StrategyCatalog& catalog,
                   const std::string& state_holder) {
  FeatureCheck features(c, catalog, state_holder, cfg->strategy().path());
  if (cfg->fp16().enabled()) {
    features.Require("fp16", kFeatureFp16);
    Fp16Config* f = cfg->mutable_fp16();
    if (f->has_loss_scale()) c.NonNegativeReal("fp16.loss_scale", f->loss_scale());
    if (f->has_initial_scale_power() &&
        (f->initial_scale_power() < 0 || f->initial_scale_power() > 63)) {
      c.Error(absl::StrCat("fp16.initial_scale_power (", f->initial_scale_power(),
                           ") must be in [0, 63]"));
    }
    if (f->has_loss_scale_window()) c.Positive("fp16.loss_scale_window", f->loss_scale_window());
    if (f->has_hysteresis()) c.Positive("fp16.hysteresis", f->hysteresis());
    if (f->has_min_loss_scale()) c.PositiveReal("fp16.min_loss_scale", f->min_loss_scale());
    if (!f->has_loss_scale()) f->set_loss_scale(0);
    if (!f->has_initial_scale_power()) f->set_initial_scale_power(16);
    if (!f->has_loss_scale_window()) f->set_loss_scale_window(1000);
    if (!f->has_hysteresis()) f->set_hysteresis(2);
    if (!f->has_min_loss_scale()) f->set_min_loss_scale(1);
    if (!f->has_consecutive_hysteresis()) f->set_consecutive_hysteresis(false);
  }
  if (cfg->bf16().enabled()) features.Require("bf16", kFeatureBf16);
  if (cfg->fp16().enabled() && cfg->bf16().enabled()) {
    c.Error("fp16.enabled and bf16.enabled are both true; enable at most one");
  }
  // DeepSpeed's values: "fp32", or the training precision's own name (the default).
  const std::string& comm_dtype = cfg->communication_data_type();
  const std::string half = cfg->fp16().enabled() ? "fp16" : cfg->bf16().enabled() ? "bf16" : "";
  if (!comm_dtype.empty() && comm_dtype != "fp32" && comm_dtype != half) {
    c.Error(absl::StrCat("communication_data_type ", Quoted(comm_dtype), " is unknown; known: \"fp32\"",
                         half.empty() ? "" : absl::StrCat(", \"", half, "\""),
                         " (default: the parameters' own dtype)"));
  } else if (comm_dtype == "fp32" && half.empty()) {
    c.Error("communication_data_type \"fp32\" applies under fp16 or bf16 only (gradients are "
            "already f32 without them); remove it or enable one");
  } else if (comm_dtype == "fp32") {
    features.Require("communication_data_type \"fp32\"", kFeatureCommFp32);
  }

  const ZeroOptimizationConfig& z = cfg->zero_optimization();
  if (z.stage() < 0 || z.stage() > 3) {
    c.Error(absl::StrCat("zero_optimization.stage (", z.stage(), ") must be 0, 1, 2 or 3"));
  } else if (z.stage() > 0) {
    features.Require(absl::StrCat("zero_optimization (stage ", z.stage(), ")"),
                     ZeroFeatureName(z.stage()));
  }
  // DeepSpeed's bucket sizes tune its own implementation (Braid reduces and gathers a layer at
  // a time): checked, then accepted with a note, as nearly every DeepSpeed config sets them.
  if (z.has_reduce_bucket_size()) {
    c.Positive("zero_optimization.reduce_bucket_size", z.reduce_bucket_size());
    cfg->add_ignored_fields("zero_optimization.reduce_bucket_size");
  }
  if (z.has_allgather_bucket_size()) {
    c.Positive("zero_optimization.allgather_bucket_size", z.allgather_bucket_size());
    cfg->add_ignored_fields("zero_optimization.allgather_bucket_size");
  }
  if (z.has_stage3_prefetch_bucket_size() && z.stage3_prefetch_bucket_size() < 0) {
    c.Error(absl::StrCat("zero_optimization.stage3_prefetch_bucket_size (",
                         z.stage3_prefetch_bucket_size(), ") must be >= 0"));
  }
  if (z.has_stage3_param_persistence_threshold() && z.stage3_param_persistence_threshold() < 0) {
    c.Error(absl::StrCat("zero_optimization.stage3_param_persistence_threshold (",
                         z.stage3_param_persistence_threshold(), ") must be >= 0"));
  }
  for (auto [field, off] : {std::pair<const char*, const OffloadConfig*>{"offload_optimizer", &z.offload_optimizer()},
                            {"offload_param", &z.offload_param()}}) {
    const std::string& d = off->device();
    if (!d.empty() && d != "none" && d != "cpu") {
      c.Error(absl::StrCat("zero_optimization.", field, ".device \"", d,
                           "\" is unknown; known: \"none\", \"cpu\"",
                           d == "nvme" ? " (Braid has no NVMe offload)" : ""));
    }
    // Page-locked buffers only speed copies between the host and a GPU: on a GPU the zero
    // strategy allocates the offloaded state pinned (core/pinned_host.h); a CPU run copies
    // nothing across, so DeepSpeed configs (which nearly all say true) load, with a note.
    if (off->pin_memory() && cfg->device() == "cpu") {
      cfg->add_ignored_fields(absl::StrCat("zero_optimization.", field, ".pin_memory"));
    }
  }
  // ZeRO-Infinity's parameter offload is stage 3's: stages 1 and 2 keep full parameters on
  // every rank, so there is no shard to keep elsewhere.
  if (z.offload_param().device() == "cpu") {
    if (z.stage() != 3) {
      c.Error(absl::StrCat("zero_optimization.offload_param needs stage 3 (stage ", z.stage(),
                           " keeps full parameters on every rank); set zero_optimization.stage 3, "
                           "or offload only the optimizer (offload_optimizer)"));
    } else if (z.offload_optimizer().device() != "cpu") {
      // The optimizer steps the shards where they live: said once, as DeepSpeed would keep it
      // on the device.
      cfg->add_ignored_fields("zero_optimization.offload_param (without offload_optimizer)");
    }
  }
}

// The parallel section against the world size: fills in data, and returns the data-parallel
// size (the world size when there is no section). Impossible layouts are one line each.
int CheckParallel(Checker& c, TrainConfig* cfg, int world, bool* layout_ok) {
  *layout_ok = false;
  if (!cfg->has_parallel()) {
    *layout_ok = true;
    return world;
  }
  ParallelConfig* p = cfg->mutable_parallel();
  if (!p->has_tensor()) p->set_tensor(1);
  if (!p->has_pipeline()) p->set_pipeline(1);
  bool ok = c.Positive("parallel.tensor", p->tensor());
  ok &= c.Positive("parallel.pipeline", p->pipeline());
  if (p->has_data()) ok &= c.Positive("parallel.data", p->data());
  if (!ok) return world;
  const int tp = p->tensor() * p->pipeline();
  if (!p->has_data()) {
    if (world % tp != 0) {
      c.Error(absl::StrCat("parallel.tensor (", p->tensor(), ") x parallel.pipeline (",
                           p->pipeline(), ") = ", tp, " does not divide the ", world,
                           " processes; change the sizes or the number of processes"));
      return world;
    }
    p->set_data(world / tp);
  }
  if (tp * p->data() != world) {
    c.Error(absl::StrCat("parallel layout tensor ", p->tensor(), " x pipeline ", p->pipeline(),
                         " x data ", p->data(), " = ", tp * p->data(), " ranks, but there are ",
                         world, " processes; make the product equal the number of processes"));
    return world;
  }
  *layout_ok = true;
  // Which layers serve these axes is the composer's question (StrategyCatalog::compose), asked
  // with the strategy's name; the strategy's options are passed on as written.
  if (p->sequence_parallel() && p->tensor() == 1) {
    c.Error("parallel.sequence_parallel splits activations over the tensor-parallel group, but "
            "parallel.tensor is 1; set parallel.tensor > 1 or turn it off");
  }
  if (p->tensor() > 1) {
    if (cfg->fp16().enabled() || cfg->bf16().enabled()) {
      c.Error(absl::StrCat(cfg->fp16().enabled() ? "fp16" : "bf16",
                           ".enabled with parallel.tensor > 1 is not supported yet: the "
                           "tensor-parallel layers compute in f32; turn one of them off"));
    }
  }
  return p->data();
}

}  // namespace internal

std::string ZeroFeatureName(int stage) { return absl::StrCat("zero", stage); }

std::vector<std::string> RequestedFeatures(const TrainConfig& cfg) {
  std::vector<std::string> features;
  if (cfg.fp16().enabled()) features.push_back(kFeatureFp16);
  if (cfg.bf16().enabled()) features.push_back(kFeatureBf16);
  const int stage = cfg.zero_optimization().stage();
  if (stage >= 1 && stage <= 3) features.push_back(ZeroFeatureName(stage));
  return features;
}

}  // namespace braid::config
