// The optimizer and learning-rate schedule a training config asks for: the optimizer factory
// strategies call over the parameters they step, and the schedule the training loop applies.
#ifndef BRAID_LAUNCHER_OPTIMIZATION_H_
#define BRAID_LAUNCHER_OPTIMIZATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "launcher/config/train_config.pb.h"
#include "core/optimizer.h"
#include "core/strategy.h"

namespace braid::launcher {

// Builds config.optimizer over the named parameters a strategy hands it: weight decay on the
// parameters the model marked for it, none on the others (biases, norms).
OptimizerFactory MakeOptimizerFactory(const config::TrainConfig& cfg);

// config.scheduler, or the optimizer's constant rate when there is none.
std::unique_ptr<LrSchedule> MakeSchedule(const config::TrainConfig& cfg);

// The (beta1, beta2) a schedule sets at each step: OneCycle with cycle_momentum (validation
// turned it off for optimizers without betas). Null when the schedule leaves the betas alone.
using BetasSchedule = std::function<std::pair<float, float>(int64_t step)>;
BetasSchedule MakeBetasSchedule(const config::TrainConfig& cfg);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_OPTIMIZATION_H_
