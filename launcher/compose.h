// The composer: from the mesh (`parallel { tensor pipeline data }`) and the strategy a config
// names, the stack of strategy layers that trains the run, one per axis, chosen by the axes each
// strategy declares (StrategyTraits::axes) — never by name. From the outside in:
//   tensor   a layer that splits layers over the tensor group and wraps the one below;
//   pipeline a layer that cuts the model into stages and hands each stage to the layer below;
//   data     the strategy the config names (ddp, zero, paramserver, dp, a user's plugin), or the
//            default: the registered strategy that claims it for this many data-parallel ranks
//            (StrategyTraits::default_for: "single" for one, "ddp" for more, as shipped), or the
//            strategy that provides what the config's sections request when that one does not
//            (zero for ZeRO).
// A layout no stack serves is refused in one line naming the two layers and why, before any
// training: a run never silently ignores an axis. (`context` and `expert` axes would stack the
// same way, between tensor and data; there is none yet.)
#ifndef BRAID_LAUNCHER_COMPOSE_H_
#define BRAID_LAUNCHER_COMPOSE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/registry.h"
#include "core/strategy.h"

namespace braid::launcher {

struct Layer {
  std::string strategy;           // its registered name
  std::vector<std::string> axes;  // the mesh axes it serves here
};

struct Stack {
  std::vector<Layer> layers;  // outermost first; each wraps the next
  // The layer that holds the training state (optimizer, gradients): the innermost.
  const std::string& state_holder() const { return layers.back().strategy; }
  // "tensor_parallel [tensor] > ddp [data]", for the start-up line.
  std::string Describe() const;
};

// What the composer asks about strategies.
struct LayerCatalog {
  // A strategy's traits by name (may load its plugin); an error names what is missing.
  std::function<absl::StatusOr<StrategyTraits>(const std::string& name)> traits_of;
  // The strategies that serve `axis`, as (name, origin), by name (may load every plugin).
  std::function<std::vector<std::pair<std::string, std::string>>(const std::string& axis)> serving;
};

// The catalog of the registry, loading plugins from `search_path` when asked (and first
// `strategy_path`, a plugin file the config names, when not empty).
LayerCatalog PluginLayerCatalog(const std::vector<std::string>& search_path,
                                const std::string& strategy_path);

// The stack for a tensor x pipeline x data layout (sizes >= 1) and the config's strategy
// (`named`, empty when it names none); InvalidArgument, one line, when no stack serves it.
// `features`: what the config's sections request (fp16, zero2, ...). A config that names no
// strategy gets the default data layer when it provides them, else the first data-axis-only
// strategy (by name) that does: a DeepSpeed config's zero_optimization section alone picks
// ZeRO, as it does in DeepSpeed.
absl::StatusOr<Stack> ComposeStack(int tensor, int pipeline, int data, const std::string& named,
                                   const LayerCatalog& catalog,
                                   const std::vector<std::string>& features = {});

// Makes the stack's strategies (registered already) and wraps each in the one above it;
// returns the outermost. InvalidArgument, one line naming the two layers, when a layer does not
// take the one below (its Wrap refuses: it is no WrappingStrategy).
absl::StatusOr<std::unique_ptr<Strategy>> BuildStack(const Stack& stack);

// Hands each layer of `stack` the group of the mesh axes it serves (DeviceMesh::GroupOf):
// the outermost's in ctx->comm, the others' in ctx->groups_below (WrappingStrategy::ContextBelow
// passes them down), so a layer works over what it is handed and looks no group up. Without a
// mesh (no parallel section: one data layer) the one layer gets `world`.
absl::Status HandGroups(const Stack& stack, const DeviceMesh* mesh, Communicator& world,
                        StrategyContext* ctx);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_COMPOSE_H_
