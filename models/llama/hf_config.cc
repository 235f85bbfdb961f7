#include "models/llama/hf_config.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid::models {
namespace {

using Json = nlohmann::json;

// Fields that say nothing about the weights' shapes or the forward pass (token ids, bookkeeping,
// inference settings): read past.
const std::set<std::string> kIgnored = {
    "_name_or_path", "architectures", "bos_token_id", "eos_token_id", "pad_token_id",
    "torch_dtype", "transformers_version", "use_cache", "model_type", "initializer_range",
    "auto_map", "tokenizer_class", "output_attentions", "output_hidden_states", "return_dict",
    "is_decoder", "id2label", "label2id", "torchscript", "use_return_dict", "dtype"};

}  // namespace

absl::StatusOr<LlamaConfig> ParseHfLlamaConfig(const std::string& text, const std::string& origin) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": not a JSON object (a Hugging Face config.json is one)"));
  }
  LlamaConfig c;
  c.rms_norm_eps = 1e-6f;  // Hugging Face's default (llama-mini's own is 1e-5)
  c.block_size = 2048;
  std::vector<std::string> problems;  // every unsupported or malformed field, one message
  bool kv_set = false;
  int64_t head_dim = 0;
  auto integer = [&](const std::string& key, const Json& v, int64_t* out) {
    if (v.is_number_integer() && v.get<int64_t>() >= 1) {
      *out = v.get<int64_t>();
    } else {
      problems.push_back(absl::StrCat(key, " (", v.dump(), ") must be an integer >= 1"));
    }
  };
  auto number = [&](const std::string& key, const Json& v, float* out) {
    if (v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0) {
      *out = float(v.get<double>());
    } else {
      problems.push_back(absl::StrCat(key, " (", v.dump(), ") must be a number > 0"));
    }
  };
  // A field that must hold one value (what Braid's llama computes) to be accepted.
  auto only = [&](const std::string& key, const Json& v, const Json& supported, const char* why) {
    if (v != supported && !(v.is_null() && supported.is_null())) {
      problems.push_back(absl::StrCat(key, " ", v.dump(), " is not supported (", why, ")"));
    }
  };
  for (const char* key : {"hidden_size", "intermediate_size", "num_attention_heads",
                                 "num_hidden_layers", "vocab_size"}) {
    if (!j.contains(key)) problems.push_back(absl::StrCat(key, " is missing"));
  }
  for (auto& [key, v] : j.items()) {
    if (key == "hidden_size") {
      integer(key, v, &c.n_embd);
    } else if (key == "intermediate_size") {
      integer(key, v, &c.intermediate_size);
    } else if (key == "num_attention_heads") {
      integer(key, v, &c.n_head);
    } else if (key == "num_key_value_heads") {
      if (!v.is_null()) {
        integer(key, v, &c.n_kv_head);
        kv_set = true;
      }
    } else if (key == "num_hidden_layers") {
      integer(key, v, &c.n_layer);
    } else if (key == "vocab_size") {
      integer(key, v, &c.vocab_size);
    } else if (key == "max_position_embeddings") {
      integer(key, v, &c.block_size);
    } else if (key == "rms_norm_eps") {
      number(key, v, &c.rms_norm_eps);
    } else if (key == "rope_theta") {
      number(key, v, &c.rope_theta);
    } else if (key == "tie_word_embeddings") {
      if (v.is_boolean()) {
        c.tie_embeddings = v.get<bool>();
      } else {
        problems.push_back(absl::StrCat(key, " (", v.dump(), ") must be true or false"));
      }
    } else if (key == "head_dim") {
      if (!v.is_null()) integer(key, v, &head_dim);
    } else if (key == "rope_scaling") {
      if (v.is_null()) continue;
      const Json type = v.is_object() ? v.value("rope_type", v.value("type", Json())) : Json();
      if (type == "default") continue;
      if (type != "linear") {
        problems.push_back(absl::StrCat("rope_scaling ", v.dump(),
                                        " is not supported (supported: type \"linear\", or null)"));
        continue;
      }
      c.rope_scaling = "linear";
      if (v.contains("factor")) number("rope_scaling.factor", v["factor"], &c.rope_scaling_factor);
      for (auto& [k, unused] : v.items()) {
        if (k != "type" && k != "rope_type" && k != "factor") {
          problems.push_back(absl::StrCat("rope_scaling.", k, " is not supported"));
        }
      }
    } else if (key == "hidden_act") {
      only(key, v, "silu", "the MLP is SwiGLU: silu");
    } else if (key == "attention_bias" || key == "mlp_bias") {
      only(key, v, false, "the model has no biases");
    } else if (key == "attention_dropout") {
      if (!(v.is_number() && v.get<double>() == 0)) only(key, v, 0, "no dropout in attention");
    } else if (key == "pretraining_tp") {
      only(key, v, 1, "it only changes how the original run split its matmuls: use 1");
    } else if (key == "sliding_window") {
      only(key, v, nullptr, "attention is over the whole context");
    } else if (kIgnored.count(key) == 0) {
      problems.push_back(absl::StrCat(key, " is not a field Braid's llama knows"));
    }
  }
  if (!kv_set) c.n_kv_head = c.n_head;
  if (problems.empty() && head_dim != 0 && head_dim * c.n_head != c.n_embd) {
    problems.push_back(absl::StrCat("head_dim (", head_dim, ") is not hidden_size / "
                                    "num_attention_heads (", c.n_embd, " / ", c.n_head, ")"));
  }
  if (problems.empty()) {
    const std::string shape = c.Problems();
    if (!shape.empty()) problems.push_back(shape);
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": ", problems.size() == 1 ? "" : absl::StrCat(problems.size(), " problems: "),
        absl::StrJoin(problems, "; ")));
  }
  return c;
}

absl::StatusOr<LlamaConfig> ReadHfLlamaConfig(const std::string& path) {
  std::error_code ec;
  const std::string file =
      std::filesystem::is_directory(path, ec) ? (std::filesystem::path(path) / "config.json").string()
                                              : path;
  std::ifstream in(file);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read Hugging Face config '", file,
                     "'; give config.json or the checkpoint folder that holds it"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseHfLlamaConfig(text.str(), file);
}

}  // namespace braid::models
