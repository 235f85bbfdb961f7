// Registers the MNIST classifier as model "mlp" (core/registry.h). It has exactly one hidden
// layer: n_layer may only be 1, n_embd is the hidden width (default 128).
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/config/sections.pb.h"
#include "core/registry.h"
#include "models/mlp/mlp.h"

namespace braid::models {
namespace {

void ValidateMlp(config::ModelConfig* m, const std::string&, const DatasetSpec*,
                 ConfigProblems* problems) {
  if (m->has_n_layer() && m->n_layer() != 1) {
    problems->push_back(absl::StrCat("model.n_layer (", m->n_layer(),
                                     ") does not apply to model \"mlp\": it has exactly one "
                                     "hidden layer (leave n_layer out or set it to 1)"));
  }
  if (!m->has_n_layer()) m->set_n_layer(1);
  if (!m->has_n_embd()) m->set_n_embd(int32_t(MlpConfig{}.hidden));
}

const bool kRegistered = [] {
  ModelSpec spec;
  spec.build = [](const config::ModelConfig& m, uint64_t seed,
                  Device device) -> absl::StatusOr<std::unique_ptr<Module>> {
    MlpConfig mc;
    if (m.has_n_embd()) mc.hidden = m.n_embd();
    mc.seed = seed;
    return std::unique_ptr<Module>(std::make_unique<Mlp>(mc, device));
  };
  spec.fields = {"n_layer", "n_embd"};
  spec.takes = "labelled 28x28 images";
  spec.tensor_plan = kMlpTensorPlan;
  spec.validate = ValidateMlp;
  // Per sample: 6 FLOPs per parameter (2 forward, 4 backward), every one in a matrix product.
  spec.train_flops_per_token = [](const config::ModelConfig& m) {
    MlpConfig c;
    c.hidden = m.n_embd();
    return 6.0 * double(c.in * c.hidden + c.hidden + c.hidden * c.out + c.out);
  };
  BRAID_CHECK_OK(Registry::Get().AddModel("mlp", std::move(spec), "models/mlp"));
  return true;
}();

}  // namespace
}  // namespace braid::models
