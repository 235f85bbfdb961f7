// The transport slot prefixes of the transfers the Gloo communicator makes itself (not through
// Gloo's collectives). In one place because they must differ from each other and from Gloo's.
#ifndef BRAID_BACKENDS_GLOO_SLOTS_H_
#define BRAID_BACKENDS_GLOO_SLOTS_H_

#include <cstdint>

namespace braid::gloo_backend::internal {

// Slot prefixes of our own transfers. Gloo's collectives use 0x01..0x08 (gloo/types.h); the
// prefix keeps our reduce-scatter and point-to-point messages apart from theirs on shared pairs.
constexpr uint8_t kReduceScatterSlotPrefix = 0x21;
constexpr uint8_t kP2pSlotPrefix = 0x22;
constexpr uint8_t kDirectAllreduceSlotPrefix = 0x23;

}  // namespace braid::gloo_backend::internal

#endif  // BRAID_BACKENDS_GLOO_SLOTS_H_
