// A strategy plugin built outside plugins/ (libbraid_external_example.so, beside this file) is
// usable by its path alone: (a) loaded into a program through LoadPlugin and trained for a step,
// (b) loaded by the real training program from a config's `strategy { path: ... }`.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cpp/runfiles/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kStrategy[] = "external_example";

class Line : public Module {
 public:
  Line() : Module("Line") {
    w_ = RegisterParameter("weight", Tensor::FromVector(std::vector<float>{0.5f, -0.3f}, {1, 2}));
  }
  Tensor Forward(const Tensor& x) override { return ops::Linear(x, w_, Tensor()); }

 private:
  Tensor w_;
};

class ExternalPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    runfiles_.reset(Runfiles::CreateForTest(&error));
    ASSERT_NE(runfiles_, nullptr) << error;
    plugin_ = runfiles_->Rlocation("braid/tests/external_plugin/libbraid_external_example.so");
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

  std::unique_ptr<Runfiles> runfiles_;
  std::string plugin_, train_, tmp_;
};

TEST_F(ExternalPluginTest, LoadsByAbsolutePathAndTrainsAStep) {
  ASSERT_EQ(plugin_.substr(0, 1), "/") << "the plugin path should be absolute: " << plugin_;
  EXPECT_FALSE(Registry::Get().HasStrategy(kStrategy));
  absl::Status loaded = LoadPlugin(plugin_, /*search_path=*/{});
  ASSERT_TRUE(loaded.ok()) << loaded;
  ASSERT_TRUE(Registry::Get().HasStrategy(kStrategy));

  absl::StatusOr<std::unique_ptr<Strategy>> made = Registry::Get().MakeStrategy(kStrategy);
  ASSERT_TRUE(made.ok()) << made.status();
  Strategy& strategy = **made;
  EXPECT_EQ(strategy.name(), kStrategy);
  Line model;
  auto sgd = [](const Module::NamedTensors& named) {
    std::vector<Tensor> params;
    for (const auto& [n, p] : named) params.push_back(p);
    return MakeSgd({ParamGroup{params, 0.1f, 0.0f}});
  };
  ASSERT_TRUE(strategy.Setup(model, sgd, StrategyContext{}).ok());

  // One SGD step on loss = mean((x w^T - y)^2) over two rows, checked against the closed form:
  // grad = 2/N sum_i (x_i w^T - y_i) x_i.
  const std::vector<float> x = {1.0f, 2.0f, -1.0f, 0.5f}, y = {1.0f, 0.0f}, w = {0.5f, -0.3f};
  Batch batch{Tensor::FromVector(x, {2, 2}), Tensor::FromVector(y, {2, 1})};
  auto mse = [](Module& m, const Batch& b) {
    Tensor d = ops::Sub(m(b.inputs), b.targets);
    return ops::Mean(ops::Mul(d, d));
  };
  absl::StatusOr<StepStats> stats = strategy.TrainStep({batch}, mse);
  ASSERT_TRUE(stats.ok()) << stats.status();
  float grad[2] = {0, 0}, loss = 0;
  for (int i = 0; i < 2; ++i) {
    float r = x[2 * i] * w[0] + x[2 * i + 1] * w[1] - y[i];
    loss += r * r / 2;
    for (int j = 0; j < 2; ++j) grad[j] += r * x[2 * i + j];  // 2/N with N = 2
  }
  EXPECT_NEAR(stats->loss, loss, 1e-6);
  std::vector<float> after = model.StateDict().at("weight").ToFloatVector();
  EXPECT_NEAR(after[0], w[0] - 0.1f * grad[0], 1e-6);
  EXPECT_NEAR(after[1], w[1] - 0.1f * grad[1], 1e-6);
}

TEST_F(ExternalPluginTest, TheTrainingProgramLoadsItFromTheConfigsPath) {
  ASSERT_FALSE(train_.empty());
  // A small model and two steps: this is about finding and running the plugin, not training.
  const std::string model =
      "model { name: \"gpt-mini\" n_layer: 1 n_head: 2 n_embd: 32 block_size: 16 }\n"
      "train_micro_batch_size_per_gpu: 2\nsteps: 2\nlog { print_every: 1 }\n";
  struct Case {
    std::string name;
    std::string strategy_section, flags;
  };
  const std::vector<Case> cases = {
      // The name from the command line, the path from the config.
      {"flag", absl::StrCat("strategy { path: \"", plugin_, "\" }\n"),
       absl::StrCat("--strategy=", kStrategy)},
      // Both in the config.
      {"config", absl::StrCat("strategy { name: \"", kStrategy, "\" path: \"", plugin_, "\" }\n"),
       ""},
  };
  for (const Case& r : cases) {
    const std::string config = absl::StrCat(tmp_, "/external_", r.name, ".pbtxt");
    std::ofstream(config) << model << r.strategy_section;
    std::string out;
    // An empty BRAID_PLUGIN_PATH: the plugin must come from the config's path, not a search.
    const int code = Run(absl::StrCat("env BRAID_PLUGIN_PATH= '", train_, "' --config='", config,
                                      "' --log_dir='", tmp_, "/log_", r.name, "' ", r.flags),
                         &out);
    EXPECT_EQ(code, 0) << r.name << ":\n" << out;
    EXPECT_THAT(out, HasSubstr(absl::StrCat("strategy ", kStrategy, ","))) << r.name;
    EXPECT_THAT(out, HasSubstr("external_example: set up on")) << r.name;
    EXPECT_THAT(out, HasSubstr("braid: done: 2 steps")) << r.name;
    EXPECT_THAT(out, Not(HasSubstr("braid train:"))) << r.name;
  }

  // Under a pipeline layout the user's strategy (a data-axis one: it declares no axes) serves
  // each stage's data axis under the pipeline: validation accepts the stack, before any process
  // connects (--print_config stops there). It trains against one process in
  // //tests/distributed:pipeline_equivalence_test (p2_dp2_external).
  {
    const std::string piped = absl::StrCat(tmp_, "/external_piped.pbtxt");
    std::ofstream(piped) << model << "parallel { pipeline: 2 }\nstrategy { name: \"" << kStrategy
                         << "\" path: \"" << plugin_ << "\" }\n";
    std::string piped_out;
    EXPECT_EQ(Run(absl::StrCat("env WORLD_SIZE=4 RANK=0 BRAID_PLUGIN_PATH= '", train_, "' --config='",
                               piped, "' --print_config --log_dir='", tmp_, "/log_piped'"),
                  &piped_out),
              0)
        << piped_out;
    EXPECT_THAT(piped_out, HasSubstr(absl::StrCat("name: \"", kStrategy, "\"")));
    EXPECT_THAT(piped_out, Not(HasSubstr("do not stack")));
  }

  // Without a name the path alone is refused, naming the field.
  const std::string nameless = absl::StrCat(tmp_, "/external_nameless.pbtxt");
  std::ofstream(nameless) << model << "strategy { path: \"" << plugin_ << "\" }\n";
  std::string out;
  EXPECT_NE(Run(absl::StrCat("'", train_, "' --config='", nameless, "' --log_dir='", tmp_,
                             "/log_nameless'"),
                &out),
            0);
  EXPECT_THAT(out, HasSubstr("strategy.name"));
}

}  // namespace
}  // namespace braid
