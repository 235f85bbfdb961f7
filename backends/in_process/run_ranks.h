// Ranks as threads for tests: one in-process group (in_process_communicator.h), one thread per
// rank. What every strategy's equivalence test runs its ranks on (docs/WRITING_A_STRATEGY.md).
#ifndef BRAID_BACKENDS_IN_PROCESS_RUN_RANKS_H_
#define BRAID_BACKENDS_IN_PROCESS_RUN_RANKS_H_

#include <functional>

#include "core/communicator.h"

namespace braid::testing {

// Runs body(rank, comm) on n threads, one per rank of a fresh in-process group whose collectives
// time out after 60 s (a hang fails the test instead of stalling it).
void RunRanks(int n, const std::function<void(int rank, Communicator* comm)>& body);

}  // namespace braid::testing

#endif  // BRAID_BACKENDS_IN_PROCESS_RUN_RANKS_H_
