#include "tools/sample/load_model.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/weights_match.h"
#include "launcher/config/config.h"
#include "tools/sample/load_weights.h"
#include "tools/sample/uncached_decoder.h"

namespace braid::tools {

absl::StatusOr<LoadedModel> LoadModel(const config::TrainConfig& cfg, const std::string& weights,
                                      const std::vector<std::string>& plugin_search_path) {
  const config::ModelConfig& m = cfg.model();
  if (!m.path().empty()) {
    if (m.name().empty()) {
      return absl::InvalidArgumentError(
          "model.path is set but model.name is empty: name the model its plugin registers");
    }
    absl::Status st = LoadPlugin(m.path(), plugin_search_path);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("model.path: ", st.message()));
  }
  if (!m.name().empty()) {
    absl::Status st = EnsureModel(m.name(), plugin_search_path);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("model.name: ", st.message()));
  }
  // Only the sections that say which model this is (the data section: a model's defaults may
  // depend on its dataset's vocabulary), validated for one process.
  config::TrainConfig only;
  *only.mutable_model() = m;
  *only.mutable_data() = cfg.data();
  BRAID_RETURN_IF_ERROR(config::ValidateConfig(&only, 1, {}));
  BRAID_ASSIGN_OR_RETURN(ModelSpec spec, Registry::Get().GetModel(only.model().name()));
  if (spec.takes != "tokens" || !spec.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model \"", only.model().name(), "\" takes ", spec.takes,
        ", not token sequences: sample generates text from language models"));
  }

  LoadedModel out;
  out.section = only.model();
  BRAID_ASSIGN_OR_RETURN(out.model, spec.build(out.section, /*seed=*/0, Device::CPU()));
  BRAID_ASSIGN_OR_RETURN(LoadedWeights w, LoadWeights(weights));
  if (spec.adapt_weights) spec.adapt_weights(out.section, &w.tensors);
  std::map<std::string, Shape> shapes;
  for (auto& [name, t] : out.model->NamedParameters()) shapes[name] = t.shape();
  absl::Status fits = CheckWeightsMatch(shapes, w.tensors, w.source);
  if (!fits.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(fits.message(), " (model \"", out.section.name(), "\" of the config)"));
  }
  BRAID_RETURN_IF_ERROR(out.model->LoadStateDict(w.tensors, /*strict=*/true));
  out.model->Eval();
  out.cached = bool(spec.decoder);
  out.decoder = out.cached ? spec.decoder(*out.model, 1)
                           : UncachedDecoder(*out.model, spec.context(out.section));
  return out;
}

}  // namespace braid::tools
