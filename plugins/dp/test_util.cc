// The shared helpers of the dp plugin's tests (test_util.h).
#include "plugins/dp/test_util.h"

#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/ops.h"
#include "core/plugin.h"
#include "third_party/runfiles.h"

namespace braid::dp_test {

using ::bazel::tools::cpp::runfiles::Runfiles;

models::MlpConfig SmallMlp(uint64_t seed) {
  models::MlpConfig c;
  c.in = 12;
  c.hidden = 16;
  c.out = 5;
  c.seed = seed;
  return c;
}

models::GptConfig TinyGpt(uint64_t seed) {
  models::GptConfig c;
  c.vocab_size = 256;
  c.padded_vocab_size = 256;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 64;
  c.seed = seed;
  return c;
}

std::unique_ptr<Module> MakeModel(Kind kind, Device device, uint64_t seed) {
  if (kind == Kind::kMlp) return std::make_unique<models::Mlp>(SmallMlp(seed), device);
  return std::make_unique<models::Gpt>(TinyGpt(seed), device);
}

Batch MakeBatch(Kind kind, int step, int64_t rows) {
  std::mt19937 rng(uint32_t(1000 + step));
  if (kind == Kind::kMlp) {
    models::MlpConfig c = SmallMlp(0);
    std::normal_distribution<float> x(0.0f, 1.0f);
    std::uniform_int_distribution<int32_t> y(0, int32_t(c.out - 1));
    std::vector<float> in(static_cast<size_t>(rows * c.in));
    std::vector<int32_t> target(static_cast<size_t>(rows));
    for (float& v : in) v = x(rng);
    for (int32_t& v : target) v = y(rng);
    return Batch{Tensor::FromVector(in, {rows, c.in}), Tensor::FromVector(target, {rows})};
  }
  models::GptConfig c = TinyGpt(0);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab_size - 1));
  std::vector<int32_t> ids(size_t(rows * c.block_size)), next(ids.size());
  for (int32_t& v : ids) v = tok(rng);
  for (int32_t& v : next) v = tok(rng);
  return Batch{Tensor::FromVector(ids, {rows, c.block_size}),
               Tensor::FromVector(next, {rows, c.block_size})};
}

Tensor CrossEntropyLoss(Module& model, const Batch& batch) {
  return ops::CrossEntropy(model(batch.inputs), batch.targets);
}

std::unique_ptr<Optimizer> AdamW(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Tensor> params;
  for (const auto& [n, p] : named) params.push_back(p);
  AdamWOptions options;
  options.eps = 1e-6f;
  return MakeAdamW({ParamGroup{params, 3e-3f, 0.01f}}, options);
}

void ExpectIdentical(const Module& got, const Module& want, const std::string& where) {
  std::map<std::string, Tensor> g = got.StateDict();
  std::map<std::string, Tensor> w = want.StateDict();
  ASSERT_EQ(g.size(), w.size()) << where;
  for (const auto& [name, t] : w) {
    ASSERT_TRUE(g.count(name)) << where << ": " << name;
    EXPECT_EQ(g.at(name).ToFloatVector(), t.ToFloatVector()) << where << ": " << name;
  }
}

void DpTest::SetUp() {
  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::CreateForTest(&error));
  ASSERT_NE(runfiles, nullptr) << error;
  plugin_ = runfiles->Rlocation("braid/plugins/dp/libbraid_dp.so");
  absl::Status s = LoadPlugin(plugin_, {});
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace braid::dp_test
