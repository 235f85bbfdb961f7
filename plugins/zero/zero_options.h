// The zero strategy's settings: DeepSpeed's zero_optimization section (the parts Braid has),
// or strategy options in tests. What Braid lacks is refused, naming it, never ignored.
#ifndef BRAID_PLUGINS_ZERO_ZERO_OPTIONS_H_
#define BRAID_PLUGINS_ZERO_ZERO_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/strategy.h"

namespace braid::zero {

inline constexpr char kName[] = "zero";

// "strategy 'zero': <msg>".
absl::Status Error(absl::StatusCode code, const std::string& msg);
absl::Status Invalid(const std::string& msg);
double Seconds(absl::Time from);

struct Options {
  int stage = 0;
  bool overlap_comm = true;  // stage 2/3: reduce-scatter each unit while backward goes on
  int64_t persistence_threshold = 0;  // stage 3: units this small stay gathered
  // Stage 3: parameter elements all-gathered ahead of use; -1 = the next unit whatever its size.
  int64_t prefetch_elements = -1;
  bool offload_optimizer = false;  // the optimizer's states and step in host memory
  // Stage 3 (ZeRO-Infinity): the parameter shards live in host memory between uses, brought to
  // the device per unit for its all-gather; the optimizer steps them there (so its state is on
  // the host too, as with offload_optimizer).
  bool offload_param = false;
  // Offloaded state in page-locked host memory where the training device's backend has it
  // (core/pinned_host.h): either section's pin_memory.
  bool pin_memory = false;
};

// From ctx.config's zero_optimization (when given), then ctx.options (stage, overlap_comm,
// offload_optimizer, offload_param, pin_memory, prefetch_elements, param_persistence_threshold).
absl::StatusOr<Options> ParseOptions(const StrategyContext& ctx);

}  // namespace braid::zero

#endif  // BRAID_PLUGINS_ZERO_ZERO_OPTIONS_H_
