// What the Adam8bit optimizer exposes beyond core/optimizer.h. Header-only and abstract, so that
// tests and tools reach it with dynamic_cast on the Optimizer the registry made, without linking
// the plugin (the pattern of plugins/ddp/ddp_trace.h).
#ifndef BRAID_PLUGINS_ADAM8BIT_ADAM8BIT_INFO_H_
#define BRAID_PLUGINS_ADAM8BIT_ADAM8BIT_INFO_H_

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace braid::adam8bit {

// The optimizer's persistent state, counted from what it holds (not from a formula).
struct StateBytes {
  int64_t parameters = 0;     // elements of every parameter that has state
  int64_t bytes = 0;          // codes + absmax of 8-bit states, f32 of 32-bit ones
  int64_t tensors_8bit = 0;   // parameters with 8-bit states
  int64_t tensors_32bit = 0;  // parameters with 32-bit states (small, or kept 32-bit)
  double per_parameter() const { return parameters > 0 ? double(bytes) / double(parameters) : 0; }
};

class Adam8bitInfo {
 public:
  virtual ~Adam8bitInfo() = default;
  virtual StateBytes state_bytes() const = 0;
  // Whether parameter `index` (in param_groups() order, counted over all groups) has, or will
  // have at its first step, 8-bit states.
  virtual bool is_8bit(int64_t index) const = 0;
  // The "32-bit states for embeddings" half of bitsandbytes' stable embedding: `params` (the
  // embedding weights, e.g. wte.weight and wpe.weight from the model's NamedParameters(); a
  // tensor's own name is only its last part, "weight") keep 32-bit states. Applies to parameters
  // that have no state yet: call it before the first step. The other half, a LayerNorm after the
  // embedding, is a model change; see README.md.
  virtual void KeepStates32bit(std::vector<Tensor> params) = 0;
};

}  // namespace braid::adam8bit

#endif  // BRAID_PLUGINS_ADAM8BIT_ADAM8BIT_INFO_H_
