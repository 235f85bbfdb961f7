// A model built outside models/ as a plugin (libbraid_tiny_lm.so, external_model.cc beside this
// file) is usable by its path or its name alone: (a) loaded into a program through LoadPlugin and
// built from the registry, (b) trained by the real training program from a config's
// `model { name: "tiny_lm" path: ... }`, and found by name on the plugin search path; (c) an
// unknown model name is refused listing the known models and where the plugin was looked for.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config/sections.pb.h"
#include "core/deferred_init.h"
#include "core/module.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cpp/runfiles/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kModel[] = "tiny_lm";

class ExternalModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    runfiles_.reset(Runfiles::CreateForTest(&error));
    ASSERT_NE(runfiles_, nullptr) << error;
    plugin_ = runfiles_->Rlocation("braid/tests/external_plugin/libbraid_tiny_lm.so");
    train_ = runfiles_->Rlocation("braid/launcher/train");
    const char* tmp = std::getenv("TEST_TMPDIR");
    tmp_ = tmp != nullptr ? tmp : "/tmp";
  }

  // Runs `command` through the shell; returns its exit code and combined output.
  static int Run(const std::string& command, std::string* output) {
    FILE* pipe = popen((command + " 2>&1").c_str(), "r");
    if (pipe == nullptr) return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output->append(buf, n);
    int status = pclose(pipe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // Trains `config_text` with the training program; returns its output.
  std::string Train(const std::string& name, const std::string& config_text,
                    const std::string& env, int* code) {
    const std::string config = absl::StrCat(tmp_, "/", name, ".pbtxt");
    std::ofstream(config) << config_text;
    std::string out;
    *code = Run(absl::StrCat("env ", env, " '", train_, "' --config='", config, "' --log_dir='",
                             tmp_, "/log_", name, "'"),
                &out);
    return out;
  }

  std::unique_ptr<Runfiles> runfiles_;
  std::string plugin_, train_, tmp_;
};

config::ModelConfig Shape() {
  config::ModelConfig m;
  m.set_name(kModel);
  m.set_n_layer(2);
  m.set_n_head(2);
  m.set_n_embd(16);
  m.set_block_size(8);
  m.set_vocab_size(256);
  (*m.mutable_options())["mlp_ratio"] = "2";
  return m;
}

TEST_F(ExternalModelTest, LoadsByPathAndBuildsAModelWhoseLayersComposeToItsForward) {
  ASSERT_EQ(plugin_.substr(0, 1), "/") << plugin_;
  EXPECT_FALSE(Registry::Get().GetModel(kModel).ok());
  absl::Status loaded = LoadPlugin(plugin_, /*search_path=*/{});
  ASSERT_TRUE(loaded.ok()) << loaded;
  absl::StatusOr<ModelSpec> spec = Registry::Get().GetModel(kModel);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->takes, "tokens");

  absl::StatusOr<std::unique_ptr<Module>> built =
      Registry::Get().MakeModel(kModel, Shape(), /*seed=*/7, Device::CPU());
  ASSERT_TRUE(built.ok()) << built.status();
  Module& model = **built;
  std::vector<std::string> names;
  for (const auto& [n, p] : model.NamedParameters()) names.push_back(n);
  EXPECT_THAT(names, ::testing::ElementsAre(
                         "embed.weight", "blocks.0.attn_norm.weight", "blocks.0.qkv.weight",
                         "blocks.0.attn_out.weight", "blocks.0.mlp_norm.weight",
                         "blocks.0.mlp_in.weight", "blocks.0.mlp_out.weight",
                         "blocks.1.attn_norm.weight", "blocks.1.qkv.weight",
                         "blocks.1.attn_out.weight", "blocks.1.mlp_norm.weight",
                         "blocks.1.mlp_in.weight", "blocks.1.mlp_out.weight", "norm.weight",
                         "head.weight"));
  // 256x16 embedding and head, per block 2x16 norms + 48x16 + 16x16 + 32x16 + 16x32.
  EXPECT_EQ(model.NumParameters(), 2 * 256 * 16 + 2 * (2 * 16 + 48 * 16 + 16 * 16 + 2 * 32 * 16) + 16);
  EXPECT_EQ(model.NamedBlocks().size(), 2u);

  // Every parameter belongs to a pipeline layer, and the layers compose to Forward bit for bit.
  std::vector<PipelineLayer> layers = model.PipelineLayers();
  ASSERT_EQ(layers.size(), 4u);
  std::vector<std::string> in_layers;
  for (const PipelineLayer& l : layers) in_layers.insert(in_layers.end(), l.parameters.begin(), l.parameters.end());
  EXPECT_EQ(in_layers, names);
  std::vector<int32_t> ids = {104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 0, 255, 1};
  Tensor x = Tensor::FromVector(ids, {2, 8});
  std::vector<float> whole = model(x).ToFloatVector();
  Tensor h = x;
  for (const PipelineLayer& l : layers) h = l.forward(h);
  std::vector<float> piped = h.ToFloatVector();
  ASSERT_EQ(whole.size(), size_t(2 * 8 * 256));
  EXPECT_EQ(piped, whole);
  float spread = 0;
  for (float v : whole) spread = std::max(spread, std::abs(v));
  EXPECT_GT(spread, 0.0f);  // not all zero (nor NaN: NaN fails every comparison)

  // Deferred initialisation (ZeRO-3 builds the model so) gives every range the values a whole
  // build gives.
  absl::StatusOr<std::unique_ptr<Module>> deferred;
  {
    DeferredInitScope scope;
    deferred = Registry::Get().MakeModel(kModel, Shape(), /*seed=*/7, Device::CPU());
  }
  ASSERT_TRUE(deferred.ok()) << deferred.status();
  auto whole_params = model.NamedParameters();
  auto lazy = (*deferred)->NamedParameters();
  ASSERT_EQ(lazy.size(), whole_params.size());
  for (size_t i = 0; i < lazy.size(); ++i) {
    ASSERT_TRUE(IsDeferred(lazy[i].second)) << lazy[i].first;
    const int64_t n = lazy[i].second.numel(), begin = n / 3;
    std::vector<float> part(size_t(n - begin));
    InitialValues(lazy[i].second, begin, n, part.data());
    std::vector<float> want = whole_params[i].second.ToFloatVector();
    EXPECT_EQ(part, std::vector<float>(want.begin() + begin, want.end())) << lazy[i].first;
  }
}

// Two losses from the summary line "braid: done: N steps ..., loss A -> B, ...".
std::pair<double, double> Losses(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(braid: done: \d+ steps.*loss ([0-9.]+) -> ([0-9.]+))"))) {
    return {-1, -1};
  }
  return {std::stod(m[1]), std::stod(m[2])};
}

TEST_F(ExternalModelTest, TheTrainingProgramTrainsItFromTheConfigsPathAndFromTheSearchPath) {
  ASSERT_FALSE(train_.empty());
  const std::string shape =
      "n_layer: 1 n_head: 2 n_embd: 32 block_size: 16 options { key: \"mlp_ratio\" value: \"2\" }";
  const std::string rest =
      "train_micro_batch_size_per_gpu: 4\nsteps: 30\nlog { print_every: 10 }\n"
      "optimizer { params { lr: 0.003 } }\n";
  // An empty BRAID_PLUGIN_PATH: the model must come from the config's path, not a search.
  int code = 0;
  std::string out = Train("by_path",
                          absl::StrCat("model { name: \"tiny_lm\" path: \"", plugin_, "\" ", shape,
                                       " }\n", rest),
                          "BRAID_PLUGIN_PATH=", &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("braid: training tiny_lm ("));
  EXPECT_THAT(out, HasSubstr("braid: done: 30 steps"));
  // It learns: Moby Dick's bytes from the uniform 5.5 nats down.
  const auto [first, last] = Losses(out);
  EXPECT_GT(first, 5.0) << out;
  EXPECT_LT(last, first - 1.0) << out;

  // By its name alone, from the folder on $BRAID_PLUGIN_PATH.
  const std::string folder = plugin_.substr(0, plugin_.rfind('/'));
  std::string by_name = Train("by_name", absl::StrCat("model { name: \"tiny_lm\" ", shape, " }\n", rest),
                              absl::StrCat("BRAID_PLUGIN_PATH='", folder, "'"), &code);
  ASSERT_EQ(code, 0) << by_name;
  // The same run: same seeds, same model, same data.
  EXPECT_EQ(Losses(by_name), Losses(out)) << by_name;

  // Its own option is validated like a linked-in model's.
  std::string bad_option =
      Train("bad_option",
            absl::StrCat("model { name: \"tiny_lm\" path: \"", plugin_,
                         "\" options { key: \"mlp_ratio\" value: \"wide\" } }\n", rest),
            "BRAID_PLUGIN_PATH=", &code);
  EXPECT_NE(code, 0);
  EXPECT_THAT(bad_option, HasSubstr("model.options \"mlp_ratio\" (\"wide\") must be an integer"));
}

TEST_F(ExternalModelTest, AnUnknownModelListsTheKnownOnesAndTheSearchPath) {
  int code = 0;
  const std::string folder = tmp_ + "/no_plugins_here";
  std::string out = Train("unknown", "model { name: \"no_such_model\" }\nsteps: 1\n",
                          absl::StrCat("BRAID_PLUGIN_PATH='", folder, "'"), &code);
  EXPECT_NE(code, 0);
  EXPECT_THAT(out, AllOf(HasSubstr("unknown model 'no_such_model'"), HasSubstr("gpt-mini"),
                         HasSubstr("llama-mini"), HasSubstr("model.path"),
                         HasSubstr(folder + "/libbraid_no_such_model.so"),
                         HasSubstr("BRAID_PLUGIN_PATH")));
  EXPECT_THAT(out, Not(HasSubstr("braid: training")));

  // A path that is not there names the file.
  std::string missing = Train("missing", "model { name: \"tiny_lm\" path: \"nowhere/libbraid_tiny_lm.so\" }\n",
                              "", &code);
  EXPECT_NE(code, 0);
  EXPECT_THAT(missing, AllOf(HasSubstr("model.path"), HasSubstr("nowhere/libbraid_tiny_lm.so")));
}

}  // namespace
}  // namespace braid
