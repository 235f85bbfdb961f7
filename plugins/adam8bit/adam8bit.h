// The Adam8bit optimizer: AdamW whose two moments are stored blockwise-quantized to 8 bits
// (blockwise.h). Internal to the plugin: the host reaches it through the registry ("Adam8bit")
// and tests through adam8bit_info.h.
#ifndef BRAID_PLUGINS_ADAM8BIT_ADAM8BIT_H_
#define BRAID_PLUGINS_ADAM8BIT_ADAM8BIT_H_

#include <memory>
#include <string>
#include <vector>

#include "core/optimizer.h"

namespace braid::adam8bit {

// AdamW's hyper-parameters; lr and weight_decay come per group, as for core's AdamW.
struct Adam8bitOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  // Parameters whose states stay 32-bit, by their tensor's own name (Tensor::name()), matched
  // exactly. The default is the half of bitsandbytes' StableEmbedding that belongs to the
  // optimizer: models/gpt names its token embedding "wte.weight" only when the model has
  // stable_embedding (otherwise its name is "weight"), so a GPT without it is unaffected. A
  // sharding strategy's pieces ("wte.weight[0:4096]") do not match: see README.md.
  std::vector<std::string> keep_32bit_names = {"wte.weight"};
};

std::unique_ptr<Optimizer> MakeAdam8bit(std::vector<ParamGroup> groups, Adam8bitOptions opts);

}  // namespace braid::adam8bit

#endif  // BRAID_PLUGINS_ADAM8BIT_ADAM8BIT_H_
