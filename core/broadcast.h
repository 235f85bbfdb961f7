// Broadcasting a model's state from one rank: what every strategy that keeps replicas does at
// Setup (so ranks started from different seeds, or a run resumed on one rank, agree), written
// once. Tensors are coalesced into flat buffers per dtype and device, so a model's hundreds of
// small tensors take a few collectives, not hundreds.
#ifndef BRAID_CORE_BROADCAST_H_
#define BRAID_CORE_BROADCAST_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/communicator.h"
#include "core/module.h"
#include "core/tensor.h"

namespace braid {

// Overwrites every rank's `tensors` with rank `root`'s values. Every rank passes its own tensors
// in the same order, with the same shapes, dtypes and devices (a collective: call it on every
// rank of `comm`). At most about `cap_bytes` move per collective (a tensor larger than that
// moves alone). Errors name what failed and that it was this broadcast.
absl::Status BroadcastTensors(const std::vector<Tensor>& tensors, Communicator& comm, int root,
                              int64_t cap_bytes = int64_t(25) << 20);

// The model's parameters (frozen ones too) and buffers, in NamedParameters/NamedBuffers order,
// from rank `root`.
absl::Status BroadcastModuleState(const Module& model, Communicator& comm, int root,
                                  int64_t cap_bytes = int64_t(25) << 20);

}  // namespace braid

#endif  // BRAID_CORE_BROADCAST_H_
