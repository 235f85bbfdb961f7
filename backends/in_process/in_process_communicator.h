// A Communicator whose ranks are threads of one process, for tests of strategies and of anything
// that issues collectives (the way Gloo tests its algorithms).
//
// Each rank's communicator is used by one thread at a time (normally that rank's own thread), and
// every rank issues the same collectives in the same order, as with any backend; a rank that
// issues a different collective at the same point fails that collective on every rank with both
// calls named. An operation runs when the last rank arrives, on that rank's thread; until then the
// tensors of the ranks that arrived must be left alone, and Wait blocks (with the communicator's
// timeout, which names the ranks that did not arrive and each rank's recent operations).
//
// Tensors must be on CPU devices (cpu:N included). Reductions take the (op, dtype) pairs of
// CheckReduction (core/communicator.h), as every communicator does: f32, bf16 and f16 (reduced in
// float) with every op; i32, i64, u8 and i8 (reduced in int64, narrow sums wrapping) with sum,
// max and min. Data movement (gather, broadcast, send) takes any dtype.
#ifndef BRAID_BACKENDS_IN_PROCESS_IN_PROCESS_COMMUNICATOR_H_
#define BRAID_BACKENDS_IN_PROCESS_IN_PROCESS_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "core/communicator.h"

namespace braid {

// The n members of a new group; element r is rank r. `group_name` appears in errors.
std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(
    int n, const std::string& group_name = "world");

}  // namespace braid

#endif  // BRAID_BACKENDS_IN_PROCESS_IN_PROCESS_COMMUNICATOR_H_
