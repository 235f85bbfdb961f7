// The Adam8bit optimizer: AdamW whose two moments are stored blockwise-quantized to 8 bits
// (blockwise.h). Internal to the plugin: the host reaches it through the registry ("Adam8bit")
// and tests through adam8bit_info.h.
#ifndef BRAID_PLUGINS_ADAM8BIT_ADAM8BIT_H_
#define BRAID_PLUGINS_ADAM8BIT_ADAM8BIT_H_

#include <memory>
#include <vector>

#include "core/optimizer.h"

namespace braid::adam8bit {

// AdamW's hyper-parameters; lr and weight_decay come per group, as for core's AdamW.
struct Adam8bitOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

std::unique_ptr<Optimizer> MakeAdam8bit(std::vector<ParamGroup> groups, Adam8bitOptions opts);

}  // namespace braid::adam8bit

#endif  // BRAID_PLUGINS_ADAM8BIT_ADAM8BIT_H_
