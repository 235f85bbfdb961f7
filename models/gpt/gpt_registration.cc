// Registers the GPT presets as models (core/registry.h): "gpt-mini" (the default: the reference
// run's) and "gpt2-124m". Validation fills every shape field from the preset, so the effective
// config shows the model's shape and BuildGpt reads plain values.
#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/config/sections.pb.h"
#include "core/registry.h"
#include "models/gpt/gpt.h"

namespace braid::models {
namespace {

void ValidateGpt(const std::string& name, config::ModelConfig* m, const std::string& dataset_name,
                 const DatasetSpec* dataset, ConfigProblems* problems) {
  absl::StatusOr<GptConfig> preset = GptConfig::ByName(name);
  BRAID_CHECK(preset.ok()) << preset.status().ToString();
  if (!m->has_n_layer()) m->set_n_layer(int32_t(preset->n_layer));
  if (!m->has_n_head()) m->set_n_head(int32_t(preset->n_head));
  if (!m->has_n_embd()) m->set_n_embd(int32_t(preset->n_embd));
  if (!m->has_block_size()) m->set_block_size(int32_t(preset->block_size));
  if (!m->has_vocab_size()) m->set_vocab_size(int32_t(preset->vocab_size));
  if (m->n_embd() % m->n_head() != 0) {
    problems->push_back(absl::StrCat("model.n_embd (", m->n_embd(),
                                     ") is not a multiple of model.n_head (", m->n_head(),
                                     ") for model \"", m->name(), "\""));
  }
  if (dataset != nullptr && dataset->vocab_size > 0 && m->vocab_size() < dataset->vocab_size) {
    problems->push_back(absl::StrCat("model.vocab_size (", m->vocab_size(), ") < ",
                                     dataset->vocab_size, ": data.dataset \"", dataset_name,
                                     "\" has ", dataset->vocab_size, " token values"));
  }
}

// The shape a model section gives (its preset, then the fields it sets).
absl::StatusOr<GptConfig> GptConfigOf(const config::ModelConfig& m) {
  BRAID_ASSIGN_OR_RETURN(GptConfig gc, GptConfig::ByName(m.name()));
  if (m.has_n_layer()) gc.n_layer = m.n_layer();
  if (m.has_n_head()) gc.n_head = m.n_head();
  if (m.has_n_embd()) gc.n_embd = m.n_embd();
  if (m.has_block_size()) gc.block_size = m.block_size();
  if (m.has_vocab_size() && m.vocab_size() != gc.vocab_size) {
    // Rows of the embedding rounded up to a multiple of 64, as the presets do (256 stays 256).
    gc.vocab_size = m.vocab_size();
    gc.padded_vocab_size = std::max<int64_t>(gc.vocab_size, (gc.vocab_size + 63) / 64 * 64);
  }
  gc.stable_embedding = m.stable_embedding();
  return gc;
}

// Generation with GPT's key/value cache (core/token_decoder.h).
class GptDecoder : public TokenDecoder {
 public:
  GptDecoder(Gpt& gpt, int64_t batch) : gpt_(gpt), cache_(gpt.NewKvCache(batch)) {}
  Tensor Step(const Tensor& ids) override {
    autograd::NoGradGuard no_grad;
    return gpt_.ForwardCached(ids, cache_);
  }
  int64_t length() const override { return cache_.length(); }
  int64_t capacity() const override { return cache_.capacity(); }
  int64_t vocab_rows() const override { return gpt_.config().padded_vocab_size; }
  void Clear() override { cache_.Clear(); }

 private:
  Gpt& gpt_;
  KvCache cache_;
};

absl::StatusOr<std::unique_ptr<Module>> BuildGpt(const config::ModelConfig& m, uint64_t seed,
                                                 Device device) {
  BRAID_ASSIGN_OR_RETURN(GptConfig gc, GptConfigOf(m));
  gc.seed = seed;
  return std::unique_ptr<Module>(std::make_unique<Gpt>(gc, device));
}

const bool kRegistered = [] {
  for (const char* name : {"gpt-mini", "gpt2-124m"}) {
    ModelSpec spec;
    spec.build = BuildGpt;
    spec.fields = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size", "stable_embedding"};
    spec.takes = "tokens";
    spec.tensor_plan = kGptTensorPlan;
    spec.context = [](const config::ModelConfig& m) { return int64_t(m.block_size()); };
    // PyTorch's nanoGPT state dict also carries the tied head under its own name.
    spec.adapt_weights = [](const config::ModelConfig&, std::map<std::string, Tensor>* w) {
      if (w->count("wte.weight")) w->erase("lm_head.weight");
    };
    spec.validate = [preset = std::string(name)](config::ModelConfig* m,
                                                 const std::string& dataset_name,
                                                 const DatasetSpec* dataset,
                                                 ConfigProblems* problems) {
      ValidateGpt(preset, m, dataset_name, dataset, problems);
    };
    spec.is_default = std::string(name) == "gpt-mini";  // the reference run (docs/REFERENCE_RUN.md)
    spec.train_flops_per_token = [](const config::ModelConfig& m) {
      absl::StatusOr<GptConfig> gc = GptConfigOf(m);
      BRAID_CHECK(gc.ok()) << gc.status().ToString();  // validated: the preset exists
      return TrainFlopsPerToken(*gc);
    };
    spec.decoder = [](Module& model, int64_t batch) -> std::unique_ptr<TokenDecoder> {
      auto* gpt = dynamic_cast<Gpt*>(&model);
      BRAID_CHECK(gpt != nullptr) << "a GPT decoder asked for a " << model.type_name();
      return std::make_unique<GptDecoder>(*gpt, batch);
    };
    BRAID_CHECK_OK(Registry::Get().AddModel(name, std::move(spec), "models/gpt"));
  }
  return true;
}();

}  // namespace
}  // namespace braid::models
