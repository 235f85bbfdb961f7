// Loss scaling for half-precision training: the state machine that decides, after each step,
// the factor the next step's loss is multiplied by.
//
// f16 has 5 exponent bits: gradients below 2^-24 flush to zero. Multiplying the loss by S moves
// the whole backward pass up by log2(S) binades; the optimizer divides S out again in f32. Too
// large an S overflows to inf, which the step detects (on any rank: the ranks agree) and skips.
// The dynamic rule is DeepSpeed's `DynamicLossScaler.update_scale` (its fp16 section's names;
// Megatron's scaler does the same), exactly as ../shared/PARALLELISM.md writes it out:
//  - a counter starts at `hysteresis`. An overflow with the counter above 1 only decrements it;
//    an overflow with the counter at 1 halves the scale (not below min_scale) and leaves the
//    counter at 1, so once hysteresis is used up every further overflow halves at once;
//  - every `window` clean steps since the last overflow double the scale and (unless
//    consecutive_hysteresis) reset the counter to `hysteresis`;
//  - with consecutive_hysteresis every clean step resets the counter: only `hysteresis`
//    overflows in a row shrink the scale.
// Nothing restores the counter when the scale halves: an earlier version did, so a run that
// overflowed steadily skipped `hysteresis` steps per halving where DeepSpeed skips one. Its
// checkpointed states (counter 1..hysteresis) are states of this rule too and resume as such.
// A static scale (loss_scale > 0 in the config) never changes; its overflows still skip.
#ifndef BRAID_LAUNCHER_MIXED_PRECISION_LOSS_SCALER_H_
#define BRAID_LAUNCHER_MIXED_PRECISION_LOSS_SCALER_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"

namespace braid {

struct LossScalerOptions {
  bool dynamic = true;
  float initial_scale = 65536.0f;  // 2^initial_scale_power
  int window = 1000;               // clean steps before the scale doubles
  int hysteresis = 2;              // the hysteresis-th overflow (counted as above) halves
  float min_scale = 1.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  // DeepSpeed's fp16.consecutive_hysteresis: a clean step restores the whole hysteresis.
  bool consecutive_hysteresis = false;
};

// Everything a checkpoint needs to resume the scaler exactly.
struct LossScalerState {
  float scale = 1.0f;
  int64_t clean_steps = 0;   // since the last overflow or growth
  int hysteresis_left = 0;   // the counter: 1..hysteresis (1 once hysteresis is used up)
  int64_t skipped_steps = 0;  // over the run
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions opts);
  // The factor this step's loss is multiplied by (1 when loss scaling is off).
  float scale() const { return state_.scale; }
  // After a step: found_inf (agreed across ranks) means the step was skipped. Returns true when
  // the step's update is to be applied.
  bool Update(bool found_inf);
  int64_t skipped_steps() const { return state_.skipped_steps; }
  const LossScalerOptions& options() const { return opts_; }

  const LossScalerState& state() const { return state_; }
  // Refuses a state this scaler could never reach (a scale below the floor, negative counts, a
  // counter outside 1..hysteresis).
  absl::Status SetState(const LossScalerState& s);
  std::string ToString() const;  // "scale 32768, 2 skipped"

  // The state as a checkpoint's metadata strings ("loss_scale", ...), and back: an fp16 resume
  // must continue the scale, hysteresis and window count, or it skips other steps than the
  // uninterrupted run. RestoreFrom leaves the scaler as it is when the metadata has none (a
  // checkpoint written without fp16), and refuses malformed or unreachable values.
  void SaveTo(std::map<std::string, std::string>* metadata) const;
  absl::Status RestoreFrom(const std::map<std::string, std::string>& metadata);

 private:
  LossScalerOptions opts_;
  LossScalerState state_;
};

}  // namespace braid

#endif  // BRAID_LAUNCHER_MIXED_PRECISION_LOSS_SCALER_H_
