// Registers the Llama models (core/registry.h): "llama", whose shape is set by the config (or
// read from a Hugging Face config.json, option hf_config), and "llama-mini", the preset that
// trains on Moby Dick's bytes on a CPU in minutes. Both start from llama-mini's shape; their own
// hyper-parameters are model.options, the shape fields GPT shares are model's fields.
// Validation writes every value back, so the effective config shows the model's whole shape and
// the build reads plain values.
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/config/sections.pb.h"
#include "core/registry.h"
#include "models/llama/hf_checkpoint.h"
#include "models/llama/hf_config.h"
#include "models/llama/llama.h"

namespace braid::models {
namespace {

using Kind = ModelOption::Kind;

// The shape `m` describes: llama-mini's, or config.json's under hf_config, then the fields and
// options `m` sets. Values are as validation accepted them (the option kinds are checked).
absl::StatusOr<LlamaConfig> LlamaFromModelConfig(const config::ModelConfig& m) {
  LlamaConfig c = LlamaConfig::Mini();
  const auto& o = m.options();
  if (auto it = o.find("hf_config"); it != o.end() && !it->second.empty()) {
    BRAID_ASSIGN_OR_RETURN(c, ReadHfLlamaConfig(it->second));
  }
  if (m.has_n_layer()) c.n_layer = m.n_layer();
  if (m.has_n_head()) c.n_head = m.n_head();
  if (m.has_n_embd()) c.n_embd = m.n_embd();
  if (m.has_block_size()) c.block_size = m.block_size();
  if (m.has_vocab_size()) c.vocab_size = m.vocab_size();
  auto integer = [&](const char* key, int64_t* out) {
    if (auto it = o.find(key); it != o.end()) {
      BRAID_CHECK(absl::SimpleAtoi(it->second, out)) << key;
    }
  };
  auto number = [&](const char* key, float* out) {
    if (auto it = o.find(key); it != o.end()) {
      BRAID_CHECK(absl::SimpleAtof(it->second, out)) << key;
    }
  };
  integer("n_kv_head", &c.n_kv_head);
  integer("intermediate_size", &c.intermediate_size);
  number("rope_theta", &c.rope_theta);
  number("rope_scaling_factor", &c.rope_scaling_factor);
  number("rms_norm_eps", &c.rms_norm_eps);
  if (auto it = o.find("rope_scaling"); it != o.end()) {
    c.rope_scaling = it->second == "none" ? "" : it->second;
  }
  if (auto it = o.find("tie_embeddings"); it != o.end()) c.tie_embeddings = it->second == "true";
  return c;
}

// The shortest text that reads back as the same f32 (1e-05, not 9.99999975e-06).
std::string Exact(float v) {
  for (int digits = 6;; ++digits) {
    std::string s = absl::StrFormat("%.*g", digits, v);
    float back = 0;
    if (digits >= 9 || (absl::SimpleAtof(s, &back) && back == v)) return s;
  }
}

void ValidateLlama(config::ModelConfig* m, const std::string& dataset_name,
                   const DatasetSpec* dataset, ConfigProblems* problems) {
  absl::StatusOr<LlamaConfig> c = LlamaFromModelConfig(*m);
  if (!c.ok()) {
    problems->push_back(absl::StrCat("model.options \"hf_config\": ", c.status().message()));
    return;
  }
  m->set_n_layer(int32_t(c->n_layer));
  m->set_n_head(int32_t(c->n_head));
  m->set_n_embd(int32_t(c->n_embd));
  m->set_block_size(int32_t(c->block_size));
  m->set_vocab_size(int32_t(c->vocab_size));
  auto& o = *m->mutable_options();
  o["n_kv_head"] = absl::StrCat(c->n_kv_head);
  o["intermediate_size"] = absl::StrCat(c->intermediate_size);
  o["rope_theta"] = Exact(c->rope_theta);
  o["rope_scaling"] = c->rope_scaling.empty() ? "none" : c->rope_scaling;
  o["rope_scaling_factor"] = Exact(c->rope_scaling_factor);
  o["rms_norm_eps"] = Exact(c->rms_norm_eps);
  o["tie_embeddings"] = c->tie_embeddings ? "true" : "false";
  const std::string shape = c->Problems();
  if (!shape.empty()) {
    problems->push_back(absl::StrCat("model \"", m->name(), "\": ", shape));
  }
  if (dataset != nullptr && dataset->vocab_size > 0 && m->vocab_size() < dataset->vocab_size) {
    problems->push_back(absl::StrCat("model.vocab_size (", m->vocab_size(), ") < ",
                                     dataset->vocab_size, ": data.dataset \"", dataset_name,
                                     "\" has ", dataset->vocab_size, " token values"));
  }
}

// Generation with Llama's key/value cache (core/token_decoder.h).
class LlamaDecoder : public TokenDecoder {
 public:
  LlamaDecoder(Llama& llama, int64_t batch) : llama_(llama), cache_(llama.NewKvCache(batch)) {}
  Tensor Step(const Tensor& ids) override {
    autograd::NoGradGuard no_grad;
    return llama_.ForwardCached(ids, cache_);
  }
  int64_t length() const override { return cache_.length(); }
  int64_t capacity() const override { return cache_.capacity(); }
  int64_t vocab_rows() const override { return llama_.config().vocab_size; }
  void Clear() override { cache_.Clear(); }

 private:
  Llama& llama_;
  KvCache cache_;
};

absl::StatusOr<std::unique_ptr<Module>> BuildLlama(const config::ModelConfig& m, uint64_t seed,
                                                   Device device) {
  BRAID_ASSIGN_OR_RETURN(LlamaConfig c, LlamaFromModelConfig(m));
  const std::string problems = c.Problems();
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrCat("llama: ", problems));
  c.seed = seed;
  return std::unique_ptr<Module>(std::make_unique<Llama>(c, device));
}

const bool kRegistered = [] {
  for (const char* name : {"llama", "llama-mini"}) {
    ModelSpec spec;
    spec.build = BuildLlama;
    spec.fields = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"};
    spec.options = {{"n_kv_head", Kind::kInt},        {"intermediate_size", Kind::kInt},
                    {"rope_theta", Kind::kFloat},     {"rope_scaling", Kind::kString},
                    {"rope_scaling_factor", Kind::kFloat}, {"rms_norm_eps", Kind::kFloat},
                    {"tie_embeddings", Kind::kBool},  {"hf_config", Kind::kString}};
    spec.tensor_plan = kLlamaTensorPlan;
    // Hugging Face's tied checkpoints may carry lm_head.weight, a copy of the embedding.
    spec.adapt_weights = [](const config::ModelConfig& m, std::map<std::string, Tensor>* w) {
      absl::StatusOr<LlamaConfig> c = LlamaFromModelConfig(m);
      if (c.ok()) DropTiedCopies(*c, w);
    };
    spec.takes = "tokens";
    spec.context = [](const config::ModelConfig& m) { return int64_t(m.block_size()); };
    spec.train_flops_per_token = [](const config::ModelConfig& m) {
      absl::StatusOr<LlamaConfig> c = LlamaFromModelConfig(m);
      BRAID_CHECK(c.ok()) << c.status().ToString();  // validated: it read before
      return TrainFlopsPerToken(*c);
    };
    spec.validate = ValidateLlama;
    spec.decoder = [](Module& model, int64_t batch) -> std::unique_ptr<TokenDecoder> {
      auto* llama = dynamic_cast<Llama*>(&model);
      BRAID_CHECK(llama != nullptr) << "a Llama decoder asked for a " << model.type_name();
      return std::make_unique<LlamaDecoder>(*llama, batch);
    };
    BRAID_CHECK_OK(Registry::Get().AddModel(name, std::move(spec), "models/llama"));
  }
  return true;
}();

}  // namespace
}  // namespace braid::models
