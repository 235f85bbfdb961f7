// What every strategy's equivalence test needs (docs/WRITING_A_STRATEGY.md, "The equivalence
// test every strategy must have"): an optimizer factory that groups by the
// parameters' weight-decay attribute as the training program does, and the distance between
// two state dicts. Ranks as threads: backends/in_process/run_ranks.h.
#ifndef BRAID_CORE_TESTING_EQUIVALENCE_H_
#define BRAID_CORE_TESTING_EQUIVALENCE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/communicator.h"
#include "core/optimizer.h"
#include "core/strategy.h"
#include "core/tensor.h"

namespace braid::testing {

// AdamW (adamw) or plain SGD, with weight decay on the parameters whose attribute asks for it.
OptimizerFactory GroupedByWeightDecay(bool adamw, float lr, float weight_decay);

// max |got - want| / max(1, max |want|) over every tensor of `want` (compare.h's MaxRelDiff),
// naming the worst tensor; a name missing from `got` or a size that differs is a test failure,
// and a NaN or inf in either makes the result +infinity.
double MaxRelativeDifference(const std::map<std::string, Tensor>& got,
                             const std::map<std::string, Tensor>& want, std::string* worst);

}  // namespace braid::testing

#endif  // BRAID_CORE_TESTING_EQUIVALENCE_H_
