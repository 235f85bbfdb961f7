// The registrations and helper of config_test_util.h.
#include "launcher/config/config_test_util.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "launcher/config/config.h"
#include "core/registry.h"
#include "gtest/gtest.h"

namespace braid::config {
namespace {

// Core knows no model or dataset by name (models/ registers the real ones, tested with their
// messages in //launcher/config:model_config_test). Validation is tested here on doubles
// registered the same way: a language model "toy-lm" (the default) and a classifier, a byte
// dataset "toy-bytes" (the default), an image dataset and a token-file dataset. The optimizers
// are core's own.
absl::StatusOr<std::unique_ptr<Module>> NoBuild(const ModelConfig&, uint64_t, Device) {
  return absl::UnimplementedError("a test double");
}

const bool kDoublesRegistered = [] {
  Registry& r = Registry::Get();
  ModelSpec lm;
  lm.build = NoBuild;
  lm.fields = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"};
  lm.options = {{"n_kv_head", ModelOption::Kind::kInt},
                {"rope_theta", ModelOption::Kind::kFloat},
                {"tied", ModelOption::Kind::kBool},
                {"note", ModelOption::Kind::kString}};
  lm.takes = "tokens";
  lm.is_default = true;
  lm.validate = [](ModelConfig* m, const std::string& dataset_name, const DatasetSpec* dataset,
                   ConfigProblems* problems) {
    if (!m->has_n_head()) m->set_n_head(4);
    if (!m->has_n_embd()) m->set_n_embd(256);
    if (!m->has_vocab_size()) m->set_vocab_size(256);
    if (m->n_embd() % m->n_head() != 0) {
      problems->push_back(absl::StrCat("model.n_embd (", m->n_embd(),
                                       ") is not a multiple of model.n_head (", m->n_head(), ")"));
    }
    if (dataset != nullptr && m->vocab_size() < dataset->vocab_size) {
      problems->push_back(absl::StrCat("model.vocab_size (", m->vocab_size(), ") < ",
                                       dataset->vocab_size, " of ", dataset_name));
    }
  };
  BRAID_CHECK_OK(r.AddModel("toy-lm", lm, "config_test"));
  ModelSpec classifier;
  classifier.build = NoBuild;
  classifier.fields = {"n_layer", "n_embd"};
  classifier.takes = "images";
  BRAID_CHECK_OK(r.AddModel("toy-classifier", classifier, "config_test"));

  DatasetSpec bytes;
  bytes.yields = "tokens";
  bytes.token_dtypes = {"u8"};
  bytes.default_token_dtype = "u8";
  bytes.vocab_size = 256;
  bytes.is_default = true;
  BRAID_CHECK_OK(r.AddDataset("toy-bytes", bytes, "config_test"));
  DatasetSpec images;
  images.yields = "images";
  images.eval_refused = "it has no validation split (its test accuracy is reported instead)";
  BRAID_CHECK_OK(r.AddDataset("toy-images", images, "config_test"));
  DatasetSpec tokens;
  tokens.yields = "tokens";
  tokens.token_dtypes = {"u8", "u16"};
  tokens.default_token_dtype = "u16";
  tokens.path_needed = "the token file's path";
  BRAID_CHECK_OK(r.AddDataset("toy-tokens", tokens, "config_test"));

  // A strategy that provides ZeRO stages 2 and 3, as a plugin would register it.
  BRAID_CHECK_OK(r.AddStrategy(
      "test_zero", [] { return std::unique_ptr<Strategy>(); }, "/some/dir/libbraid_test_zero.so",
      StrategyTraits{{"zero2", "zero3"}}));
  return true;
}();

}  // namespace

namespace test_util {

TrainConfig Text(const std::string& text) {
  auto cfg = ParseTextConfig(text, "test.pbtxt");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return cfg.ok() ? *cfg : TrainConfig();
}

std::string ComposeDouble(int tensor, int pipeline, int data, const std::string& named) {
  if (!named.empty() && named != "pipeline") return named;
  return data > 1 ? "ddp" : "single";
}

absl::Status Validate(TrainConfig* cfg, int dp, const std::vector<std::string>& features) {
  StrategyCatalog catalog;
  catalog.features_of = [&](const std::string&) { return features; };
  catalog.providers_of = [](const std::string& feature) {  // those registered so far
    FeatureProviders found;
    for (auto& [name, origin] : Registry::Get().StrategiesProviding(feature)) {
      found.strategies.push_back({name, origin});
    }
    return found;
  };
  catalog.compose = [](int t, int p, int d, const std::string& named, const std::vector<std::string>&) -> absl::StatusOr<std::string> {
    return ComposeDouble(t, p, d, named);
  };
  return ValidateConfigWith(cfg, dp, catalog);
}

std::string ValidationError(const std::string& text, int dp,
                            const std::vector<std::string>& features) {
  TrainConfig cfg = Text(text);
  absl::Status st = Validate(&cfg, dp, features);
  return st.ok() ? "" : std::string(st.message());
}

}  // namespace test_util
}  // namespace braid::config
