#include "plugins/zero/zero_options.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/config/sections.pb.h"

namespace braid::zero {

absl::Status Error(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat("strategy 'zero': ", msg));
}
absl::Status Invalid(const std::string& msg) {
  return Error(absl::StatusCode::kInvalidArgument, msg);
}
double Seconds(absl::Time from) { return absl::ToDoubleSeconds(absl::Now() - from); }

absl::StatusOr<Options> ParseOptions(const StrategyContext& ctx) {
  Options o;
  if (ctx.config != nullptr) {
    const config::ZeroOptimizationConfig& z = ctx.config->zero_optimization();
    o.stage = z.stage();
    if (z.has_overlap_comm()) o.overlap_comm = z.overlap_comm();
    // DeepSpeed's settings that Braid does not implement are errors, never silently ignored.
    // (Its bucket sizes only tune its own implementation: validation accepts them with a note.)
    std::vector<std::string> unsupported;
    if (z.has_contiguous_gradients() && !z.contiguous_gradients()) {
      unsupported.push_back("contiguous_gradients: false");
    }
    if (z.has_reduce_scatter() && !z.reduce_scatter()) unsupported.push_back("reduce_scatter: false");
    if (z.has_allgather_partitions() && !z.allgather_partitions()) {
      unsupported.push_back("allgather_partitions: false");
    }
    if (z.has_stage3_prefetch_bucket_size()) o.prefetch_elements = z.stage3_prefetch_bucket_size();
    if (z.has_stage3_param_persistence_threshold()) {
      o.persistence_threshold = z.stage3_param_persistence_threshold();
    }
    o.offload_optimizer = z.offload_optimizer().device() == "cpu";
    o.offload_param = z.offload_param().device() == "cpu";
    o.pin_memory = (o.offload_optimizer && z.offload_optimizer().pin_memory()) ||
                   (o.offload_param && z.offload_param().pin_memory());
    if (!unsupported.empty()) {
      return Invalid(absl::StrCat(
          "zero_optimization: ", absl::StrJoin(unsupported, ", "),
          " not supported: Braid reduce-scatters and all-gathers one layer (block) at a time, "
          "into contiguous flat buffers; remove ",
          unsupported.size() == 1 ? "it" : "them"));
    }
  }
  for (const auto& [k, v] : ctx.options) {
    if (k == "stage") {
      if (!absl::SimpleAtoi(v, &o.stage)) return Invalid(absl::StrCat("option stage='", v, "' is not 1, 2 or 3"));
    } else if (k == "overlap_comm") {
      if (v != "true" && v != "false") {
        return Invalid(absl::StrCat("option overlap_comm='", v, "' is not true or false"));
      }
      o.overlap_comm = v == "true";
    } else if (k == "offload_optimizer") {
      if (v != "cpu" && v != "none") {
        return Invalid(absl::StrCat("option offload_optimizer='", v, "' is not cpu or none"));
      }
      o.offload_optimizer = v == "cpu";
    } else if (k == "offload_param") {
      if (v != "cpu" && v != "none") {
        return Invalid(absl::StrCat("option offload_param='", v, "' is not cpu or none"));
      }
      o.offload_param = v == "cpu";
    } else if (k == "pin_memory") {
      if (v != "true" && v != "false") {
        return Invalid(absl::StrCat("option pin_memory='", v, "' is not true or false"));
      }
      o.pin_memory = v == "true";
    } else if (k == "prefetch_elements") {
      if (!absl::SimpleAtoi(v, &o.prefetch_elements) || o.prefetch_elements < -1) {
        return Invalid(absl::StrCat("option prefetch_elements='", v,
                                    "' is not a number of elements >= 0 (or -1: the next layer)"));
      }
    } else if (k == "param_persistence_threshold") {
      if (!absl::SimpleAtoi(v, &o.persistence_threshold) || o.persistence_threshold < 0) {
        return Invalid(absl::StrCat("option param_persistence_threshold='", v,
                                    "' is not a number of elements >= 0"));
      }
    } else {
      return Invalid(absl::StrCat("unknown option '", k,
                                  "' (known: stage, overlap_comm, offload_optimizer, offload_param, "
                                  "pin_memory, prefetch_elements, param_persistence_threshold)"));
    }
  }
  if (o.stage < 1 || o.stage > 3) {
    return Invalid(absl::StrCat("ZeRO stage ", o.stage,
                                " is not 1, 2 or 3; set zero_optimization.stage (stage 0 is plain "
                                "data parallelism: use strategy ddp)"));
  }
  if (o.offload_param && o.stage != 3) {
    return Invalid(absl::StrCat("offload_param needs stage 3 (stage ", o.stage,
                                " keeps full parameters on every rank); set zero_optimization.stage "
                                "3, or offload only the optimizer (offload_optimizer)"));
  }
  return o;
}

}  // namespace braid::zero
