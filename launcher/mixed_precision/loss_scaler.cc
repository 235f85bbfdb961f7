#include "launcher/mixed_precision/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"

namespace braid {

LossScaler::LossScaler(LossScalerOptions opts) : opts_(opts) {
  BRAID_CHECK(opts_.initial_scale > 0 && std::isfinite(opts_.initial_scale))
      << "loss scale must be positive and finite, got " << opts_.initial_scale;
  BRAID_CHECK(opts_.window >= 1 && opts_.hysteresis >= 1 && opts_.min_scale > 0)
      << "loss scaler: window and hysteresis must be >= 1 and min_scale > 0";
  state_.scale = opts_.dynamic ? std::max(opts_.initial_scale, opts_.min_scale) : opts_.initial_scale;
  state_.hysteresis_left = opts_.hysteresis;
}

bool LossScaler::Update(bool found_inf) {
  if (found_inf) {
    ++state_.skipped_steps;
    state_.clean_steps = 0;
    if (!opts_.dynamic) return false;
    // DeepSpeed's test, `delayed_shift == 1 or cur_hysteresis == 1`: the counter stays at 1
    // after a halving, so the next overflow halves again.
    if (opts_.hysteresis == 1 || state_.hysteresis_left <= 1) {
      state_.scale = std::max(state_.scale * opts_.backoff_factor, opts_.min_scale);
    } else {
      --state_.hysteresis_left;
    }
    return false;
  }
  if (!opts_.dynamic) return true;
  if (opts_.consecutive_hysteresis) state_.hysteresis_left = opts_.hysteresis;
  // clean_steps counts modulo the window: DeepSpeed grows when the clean steps since the last
  // overflow reach a multiple of it.
  if (++state_.clean_steps >= opts_.window) {
    // Doubling is exact in binary floating point; capped so that it never reaches inf.
    const float grown = state_.scale * opts_.growth_factor;
    if (std::isfinite(grown)) state_.scale = grown;
    state_.clean_steps = 0;
    state_.hysteresis_left = opts_.hysteresis;
  }
  return true;
}

absl::Status LossScaler::SetState(const LossScalerState& s) {
  if (!(s.scale > 0) || !std::isfinite(s.scale) || (opts_.dynamic && s.scale < opts_.min_scale) ||
      s.clean_steps < 0 || s.skipped_steps < 0 || s.hysteresis_left < 1 ||
      s.hysteresis_left > opts_.hysteresis) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler state (scale ", s.scale, ", clean steps ", s.clean_steps, ", hysteresis left ",
        s.hysteresis_left, ", skipped ", s.skipped_steps,
        ") does not fit this run's fp16 section (min_loss_scale ", opts_.min_scale, ", hysteresis ",
        opts_.hysteresis, "): resume with the config the checkpoint was written with"));
  }
  state_ = s;
  return absl::OkStatus();
}

void LossScaler::SaveTo(std::map<std::string, std::string>* metadata) const {
  (*metadata)["loss_scale"] = absl::StrFormat("%.9g", state_.scale);
  (*metadata)["loss_scale_clean_steps"] = absl::StrCat(state_.clean_steps);
  (*metadata)["loss_scale_hysteresis_left"] = absl::StrCat(state_.hysteresis_left);
  (*metadata)["skipped_steps"] = absl::StrCat(state_.skipped_steps);
}

absl::Status LossScaler::RestoreFrom(const std::map<std::string, std::string>& metadata) {
  auto it = metadata.find("loss_scale");
  if (it == metadata.end()) return absl::OkStatus();
  LossScalerState s;
  bool ok = absl::SimpleAtof(it->second, &s.scale);
  auto get = [&](const char* key, auto* out) {
    auto f = metadata.find(key);
    ok = ok && f != metadata.end() && absl::SimpleAtoi(f->second, out);
  };
  get("loss_scale_clean_steps", &s.clean_steps);
  get("loss_scale_hysteresis_left", &s.hysteresis_left);
  get("skipped_steps", &s.skipped_steps);
  if (!ok) return absl::DataLossError("the loss scaler's state in the checkpoint's metadata is malformed");
  return SetState(s);
}

std::string LossScaler::ToString() const {
  return absl::StrFormat("scale %g, %d skipped step%s", state_.scale, state_.skipped_steps,
                         state_.skipped_steps == 1 ? "" : "s");
}

}  // namespace braid
