// What every strategy's equivalence test needs (docs/WRITING_A_STRATEGY.md, "The equivalence
// test every strategy must have"): ranks as threads, an optimizer factory that groups by the
// parameters' weight-decay attribute as the training program does, and the distance between
// two state dicts.
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

// Runs body(rank, comm) on n threads, one per rank of a fresh in-process group whose collectives
// time out after 60 s (a hang fails the test instead of stalling it).
void RunRanks(int n, const std::function<void(int rank, Communicator* comm)>& body);

// AdamW (adamw) or plain SGD, with weight decay on the parameters whose attribute asks for it.
OptimizerFactory GroupedByWeightDecay(bool adamw, float lr, float weight_decay);

// max |got - want| / max(1, max |want|) over every tensor of `want` (compare.h's MaxRelDiff),
// naming the worst tensor; a name missing from `got` or a size that differs is a test failure,
// and a NaN or inf in either makes the result +infinity.
double MaxRelativeDifference(const std::map<std::string, Tensor>& got,
                             const std::map<std::string, Tensor>& want, std::string* worst);

}  // namespace braid::testing

#endif  // BRAID_CORE_TESTING_EQUIVALENCE_H_
