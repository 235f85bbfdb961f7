// Weights read back for sampling: a save_to file (with and without its n_head note), a sharded
// checkpoint folder assembled in one process, and the errors of each bad input.
#include "tools/sample/load_gpt.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/autograd.h"
#include "gtest/gtest.h"
#include "plugins/checkpoint/checkpoint_index.h"
#include "plugins/checkpoint/safetensors.h"
#include "tools/sample/test_gpt.h"

namespace braid::tools {
namespace {

namespace fs = std::filesystem;

std::string Tmp(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::vector<float> Logits(models::Gpt& g) {
  autograd::NoGradGuard no_grad;
  return g.Forward(Tensor::FromVector(std::vector<int32_t>{1, 5, 9, 2}, {1, 4})).ToFloatVector();
}

TEST(LoadGpt, ASaveToFileWithItsHeadCount) {
  auto g = TestGpt(1);
  const std::string path = Tmp("w.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, g->StateDict(), {{"format", "pt"}, {"n_head", "4"}}).ok());
  absl::StatusOr<std::unique_ptr<models::Gpt>> back = LoadGpt(path, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->config().n_layer, 2);
  EXPECT_EQ((*back)->config().n_head, 4);
  EXPECT_EQ((*back)->config().block_size, 24);
  EXPECT_EQ(Logits(**back), Logits(*g));  // the same weights, the same computation: bitwise
}

TEST(LoadGpt, WithoutAHeadCountAWidthNoPresetHasNeedsTheFlag) {
  auto g = TestGpt(1);
  const std::string path = Tmp("nohead.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, g->StateDict()).ok());
  absl::StatusOr<std::unique_ptr<models::Gpt>> back = LoadGpt(path, 0);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("pass --n_head"), std::string::npos) << back.status();
  back = LoadGpt(path, 4);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(Logits(**back), Logits(*g));
  // gpt-mini's width gives gpt-mini's heads.
  models::Gpt mini(models::GptConfig::Mini());
  ASSERT_TRUE(SaveSafetensors(Tmp("mini.safetensors"), mini.StateDict()).ok());
  back = LoadGpt(Tmp("mini.safetensors"), 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->config().n_head, 4);
}

// A checkpoint as two ranks would write it: every tensor's flat index split at its middle,
// the first half in rank0's file, the second in rank1's, plus optimizer state.
void WriteCheckpoint(const std::string& dir, const std::map<std::string, Tensor>& state) {
  fs::create_directories(dir);
  checkpoint::CheckpointIndex index;
  index.step = 5;
  index.world_size = 2;
  std::map<std::string, Tensor> files[2];
  for (const auto& [name, t] : state) {
    checkpoint::IndexedTensor it;
    it.shape = t.shape();
    it.dtype = "f32";
    std::vector<float> v = t.ToFloatVector();
    const int64_t mid = int64_t(v.size()) / 2;
    for (int r = 0; r < 2; ++r) {
      const int64_t begin = r == 0 ? 0 : mid, end = r == 0 ? mid : int64_t(v.size());
      if (begin == end) continue;
      std::vector<float> part(v.begin() + begin, v.begin() + end);
      files[r][name] = Tensor::FromVector(part, {end - begin});
      it.chunks.push_back({"rank" + std::to_string(r) + ".safetensors", name, {{begin, end}}});
    }
    index.tensors[name] = it;
  }
  index.extra[0] = {{"n_head", "4"}, {"step", "5"}};
  files[0]["optimizer/step"] = Tensor::FromVector(std::vector<float>{5}, {1});
  index.tensors["optimizer/step"] = {{1}, "f32", {{"rank0.safetensors", "optimizer/step", {{0, 1}}}}};
  for (int r = 0; r < 2; ++r) {
    const std::string file = "rank" + std::to_string(r) + ".safetensors";
    ASSERT_TRUE(SaveSafetensors(dir + "/" + file, files[r]).ok());
    index.files[file] = {int64_t(fs::file_size(dir + "/" + file)), 0};
  }
  std::ofstream(dir + "/index.json") << checkpoint::CheckpointIndexToJson(index);
}

TEST(LoadGpt, ACheckpointFolderIsAssembledFromItsShards) {
  auto old = TestGpt(2), newest = TestGpt(3);
  const std::string dir = Tmp("ckpt");
  WriteCheckpoint(dir + "/step_2", old->StateDict());
  WriteCheckpoint(dir + "/step_5", newest->StateDict());
  fs::create_directories(dir + "/step_9.tmp");  // unfinished: no index
  fs::create_directories(dir + "/step_7");      // no index either
  absl::StatusOr<std::unique_ptr<models::Gpt>> back = LoadGpt(dir, 0);  // n_head from extra
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->config().n_head, 4);
  EXPECT_EQ(Logits(**back), Logits(*newest));
  back = LoadGpt(dir + "/step_2", 4);  // one step folder named directly
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(Logits(**back), Logits(*old));
}

TEST(LoadGpt, BadInputIsOneLineNamingThePath) {
  auto one_line = [](const absl::Status& s) {
    return !s.ok() && s.message().find('\n') == absl::string_view::npos;
  };
  absl::Status s = LoadGpt(Tmp("missing.safetensors"), 4).status();
  EXPECT_TRUE(one_line(s));
  EXPECT_NE(s.message().find("missing.safetensors: no such file"), std::string::npos) << s;
  fs::create_directories(Tmp("empty"));
  s = LoadGpt(Tmp("empty"), 4).status();
  EXPECT_TRUE(one_line(s));
  EXPECT_NE(s.message().find("no complete checkpoint"), std::string::npos) << s;
  // A tensor of the wrong shape: the model built from the others cannot take it.
  auto sd = TestGpt(1)->StateDict();
  sd["h.1.mlp.c_fc.weight"] = Tensor::Zeros({100, 32});
  ASSERT_TRUE(SaveSafetensors(Tmp("bad.safetensors"), sd).ok());
  s = LoadGpt(Tmp("bad.safetensors"), 4).status();
  EXPECT_TRUE(one_line(s)) << s;
  EXPECT_NE(s.message().find("does not fit a GPT"), std::string::npos) << s;
  EXPECT_NE(s.message().find("h.1.mlp.c_fc.weight"), std::string::npos) << s;
  // Not a GPT at all.
  ASSERT_TRUE(SaveSafetensors(Tmp("mlp.safetensors"), {{"fc1.weight", Tensor::Zeros({2, 2})}}).ok());
  s = LoadGpt(Tmp("mlp.safetensors"), 4).status();
  EXPECT_TRUE(one_line(s));
  EXPECT_NE(s.message().find("holds no GPT weights"), std::string::npos) << s;
}

}  // namespace
}  // namespace braid::tools
