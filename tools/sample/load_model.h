// A trained model of any registered kind read back for inference by the config it was trained
// with: the config's model section (name, shape fields, options; model.path for a user's model
// plugin, else plugin <model.name> on the search path when no linked library registers it) is
// validated and built through the registry as the training program does, and the weights
// (load_weights.h) are loaded into it after the model's own adaptation (ModelSpec::adapt_weights),
// every mismatch named at once. Generation uses the model's TokenDecoder (its key/value cache)
// when its spec supplies one, else the uncached one (uncached_decoder.h).
#ifndef BRAID_TOOLS_SAMPLE_LOAD_MODEL_H_
#define BRAID_TOOLS_SAMPLE_LOAD_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/config/train_config.pb.h"
#include "core/module.h"
#include "core/token_decoder.h"

namespace braid::tools {

struct LoadedModel {
  std::unique_ptr<Module> model;
  std::unique_ptr<TokenDecoder> decoder;  // over `model`
  bool cached = false;                    // the model's own decoder, not the uncached one
  config::ModelConfig section;            // the model section as validation completed it
};

// `cfg`: a training config (its paths already resolved by the caller); only its model and data
// sections are read. `weights`: what LoadWeights takes. Errors are one line: an unknown model
// (the registered ones listed), a section validation refuses, a model that does not take
// tokens, weights that do not fit.
absl::StatusOr<LoadedModel> LoadModel(const config::TrainConfig& cfg, const std::string& weights,
                                      const std::vector<std::string>& plugin_search_path);

}  // namespace braid::tools

#endif  // BRAID_TOOLS_SAMPLE_LOAD_MODEL_H_
