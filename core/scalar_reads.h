// Reading scalars a computation left on its device. On a GPU every read blocks the host until the
// device has caught up (a synchronisation), and the device then idles while the host enqueues
// the next work; a training step keeps its scalars (the loss, the gradient's squared norm,
// mixed precision's inf/NaN check) on the device and reads them together, once per step
// (docs/GPU.md, "Synchronisation points").
#ifndef BRAID_CORE_SCALAR_READS_H_
#define BRAID_CORE_SCALAR_READS_H_

#include <vector>

#include "core/tensor.h"

namespace braid {

// The values of `scalars` (each one element, floating; an undefined tensor reads as 0), as
// floats, with at most one device-to-host transfer: those in host memory (any CPU device, the
// offloaded state's included) are read in place; the others, which must all be on one device,
// are first gathered into one f32 buffer there (device-to-device copies, which do not block),
// then read at once.
std::vector<float> ReadScalars(const std::vector<Tensor>& scalars);

// Every element of each of `tensors` (floating; an undefined tensor has none), as floats,
// concatenated in order, with the same single device-to-host transfer: for values the host needs
// with the step's scalars (DDP's bucket flags), so that they cost no synchronisation of their own.
std::vector<float> ReadValues(const std::vector<Tensor>& tensors);

}  // namespace braid

#endif  // BRAID_CORE_SCALAR_READS_H_
