// bazel run //tools:sample -- --from=<weights.safetensors | checkpoint folder> --prompt="..."
//     [--config=<the run's config>] [--max_new_tokens=N] [--temperature=T] [--top_k=K]
//     [--seed=S] [--tokenizer=byte|gpt2|...]
//
// Prints the prompt and the model's continuation. With --config, the model is the config's
// model section, any registered model or model plugin (load_model.h); without it, a GPT whose
// shape comes from the weights (load_gpt.h). Generation uses the model's key/value cache when it
// has one (generate.h). Every error is one line on stderr and exit status 1.
#include <cstdlib>
#include <memory>
#include <utility>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "launcher/config/config.h"
#include "tools/cli/user_path.h"
#include "tools/sample/generate.h"
#include "tools/sample/load_gpt.h"
#include "tools/sample/load_model.h"
#include "tools/tokenize/make_tokenizer.h"

ABSL_FLAG(std::string, from, "",
          "the weights: a .safetensors file (a run's save_to) or a checkpoint folder "
          "(checkpoint.dir, or one step_<N> in it); required");
ABSL_FLAG(std::string, config, "",
          "the training config (text or JSON) whose model section the weights are for: any "
          "registered model, or a model plugin (model.path, or BRAID_PLUGIN_PATH); empty: a GPT "
          "shaped by the weights");
ABSL_FLAG(std::string, prompt, "\n", "the text to continue");
ABSL_FLAG(int64_t, max_new_tokens, 200, "tokens to generate");
ABSL_FLAG(double, temperature, 0.8, "softmax temperature; 0 picks the most likely token (greedy)");
ABSL_FLAG(int64_t, top_k, 0, "draw only among the K most likely tokens (0: all)");
ABSL_FLAG(uint64_t, seed, 1, "the same seed gives the same text");
ABSL_FLAG(std::string, tokenizer, "byte",
          "the model's vocabulary: byte, gpt2, gpt2:<dir> or sentencepiece:<file.model>");
ABSL_FLAG(int32_t, n_head, 0,
          "without --config: GPT attention heads, when the weights do not say and their width is "
          "no preset's");

namespace {

using braid::tools::UserPath;

[[noreturn]] void Fail(const std::string& message) {
  std::cerr << "sample: " << message << "\n";
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sample --from=<weights.safetensors|checkpoint dir> --prompt=TEXT [--config=FILE] "
      "[--max_new_tokens=N] "
      "[--temperature=T] [--top_k=K] [--seed=S] [--tokenizer=byte|gpt2|...]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) Fail(absl::StrCat("unexpected argument '", rest[1], "' (flags only)"));
  if (absl::GetFlag(FLAGS_from).empty()) Fail("--from is required: a .safetensors file or a checkpoint folder");
  absl::StatusOr<std::unique_ptr<braid::text::Tokenizer>> tok =
      braid::tools::MakeTokenizer(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) Fail(std::string(tok.status().message()));
  const std::string from = UserPath(absl::GetFlag(FLAGS_from));
  std::unique_ptr<braid::Module> model;
  std::unique_ptr<braid::TokenDecoder> decoder;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::StatusOr<braid::config::TrainConfig> cfg =
        braid::config::LoadConfigFile(UserPath(absl::GetFlag(FLAGS_config)));
    if (!cfg.ok()) Fail(std::string(cfg.status().message()));
    if (!cfg->model().path().empty()) {
      cfg->mutable_model()->set_path(UserPath(cfg->model().path()));
    }
    absl::StatusOr<braid::tools::LoadedModel> loaded =
        braid::tools::LoadModel(*cfg, from, braid::PluginSearchPath());
    if (!loaded.ok()) Fail(std::string(loaded.status().message()));
    model = std::move(loaded->model);
    decoder = std::move(loaded->decoder);
  } else {
    absl::StatusOr<std::unique_ptr<braid::models::Gpt>> gpt =
        braid::tools::LoadGpt(from, absl::GetFlag(FLAGS_n_head));
    if (!gpt.ok()) Fail(std::string(gpt.status().message()));
    // GPT's key/value cache, as its registration supplies it.
    absl::StatusOr<braid::ModelSpec> spec = braid::Registry::Get().GetModel("gpt-mini");
    BRAID_CHECK(spec.ok() && spec->decoder) << "models/gpt registers gpt-mini with a decoder";
    model = std::move(*gpt);
    decoder = spec->decoder(*model, 1);
  }

  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  std::vector<int64_t> ids;
  for (uint32_t id : (*tok)->Encode(prompt)) ids.push_back(id);
  braid::tools::SampleOptions o;
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.temperature = float(absl::GetFlag(FLAGS_temperature));
  o.top_k = absl::GetFlag(FLAGS_top_k);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.vocab_size = int64_t((*tok)->vocab_size());
  absl::StatusOr<std::vector<int64_t>> out = braid::tools::Generate(*decoder, ids, o);
  if (!out.ok()) {
    Fail(absl::StrCat(out.status().message(), " (tokenizer ", (*tok)->name(), ")"));
  }
  std::vector<uint32_t> new_ids(out->begin(), out->end());
  absl::StatusOr<std::string> text = (*tok)->Decode(new_ids);
  if (!text.ok()) Fail(std::string(text.status().message()));
  std::cout << prompt << *text << std::endl;
  return 0;
}
