// Hugging Face's sharded safetensors (an index and its shards) and the check of weights against a
// model, with every mismatch and the nearest names in one message.
#include "plugins/checkpoint/sharded_safetensors.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "core/weights_match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/checkpoint/safetensors.h"

namespace braid {
namespace {

using ::testing::HasSubstr;

std::string Folder(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(t != nullptr ? t : "/tmp") + "/" + name;
  std::filesystem::create_directories(dir);
  return dir;
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

Tensor Values(std::vector<float> v, Shape s) { return Tensor::FromVector(v, s); }

TEST(ShardedSafetensors, LoadsAnIndexAndItsShards) {
  const std::string dir = Folder("sharded");
  ASSERT_TRUE(SaveSafetensors(dir + "/model-00001-of-00002.safetensors",
                              {{"a.weight", Values({1, 2}, {2})}}).ok());
  ASSERT_TRUE(SaveSafetensors(dir + "/model-00002-of-00002.safetensors",
                              {{"b.weight", Values({3, 4, 5, 6}, {2, 2})}, {"c", Values({7}, {1})}})
                  .ok());
  Write(dir + "/model.safetensors.index.json",
        R"({"metadata": {"total_size": 28}, "weight_map": {
             "a.weight": "model-00001-of-00002.safetensors",
             "b.weight": "model-00002-of-00002.safetensors",
             "c": "model-00002-of-00002.safetensors"}})");
  for (const std::string& path : {dir, dir + "/model.safetensors.index.json"}) {
    absl::StatusOr<std::map<std::string, Tensor>> w = LoadSafetensorsWeights(path);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_EQ(w->size(), 3u);
    EXPECT_EQ(w->at("b.weight").ToFloatVector(), (std::vector<float>{3, 4, 5, 6}));
    EXPECT_EQ(w->at("b.weight").shape(), (Shape{2, 2}));
    EXPECT_EQ(w->at("c").ToFloatVector(), (std::vector<float>{7}));
  }
  // A folder with one file.
  const std::string single = Folder("single");
  ASSERT_TRUE(SaveSafetensors(single + "/model.safetensors", {{"x", Values({1}, {1})}}).ok());
  ASSERT_TRUE(LoadSafetensorsWeights(single).ok());
}

TEST(ShardedSafetensors, AnIndexThatDisagreesWithItsShardsIsRefused) {
  const std::string dir = Folder("disagree");
  ASSERT_TRUE(SaveSafetensors(dir + "/s1.safetensors",
                              {{"a", Values({1}, {1})}, {"stray", Values({1}, {1})}}).ok());
  Write(dir + "/model.safetensors.index.json",
        R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  EXPECT_THAT(LoadSafetensorsWeights(dir).status().message(),
              HasSubstr("s1.safetensors does not hold what " + dir +
                        "/model.safetensors.index.json says: missing b; not in the index: stray"));
  Write(dir + "/model.safetensors.index.json", R"({"weight_map": {"a": "../s1.safetensors"}})");
  EXPECT_THAT(LoadSafetensorsWeights(dir).status().message(),
              HasSubstr("not a file beside the index"));
  Write(dir + "/model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_THAT(LoadSafetensorsWeights(dir).status().message(), HasSubstr("no \"weight_map\""));
  EXPECT_THAT(LoadSafetensorsWeights(Folder("empty")).status().message(),
              HasSubstr("holds neither model.safetensors.index.json nor model.safetensors"));
}

TEST(WeightsMatch, EveryMismatchAtOnceWithTheNearestName) {
  const std::map<std::string, Shape> model = {{"layers.0.mlp.up_proj.weight", {4, 2}},
                                              {"layers.0.mlp.down_proj.weight", {2, 4}},
                                              {"norm.weight", {2}}};
  std::map<std::string, Tensor> file = {{"layers.0.mlp.upproj.weight", Tensor::Zeros({4, 2})},
                                        {"layers.0.mlp.down_proj.weight", Tensor::Zeros({4, 2})},
                                        {"norm.weight", Tensor::Zeros({2})}};
  EXPECT_EQ(CheckWeightsMatch(model, file, "w.safetensors").message(),
            "w.safetensors does not match the model (3 problems): missing "
            "layers.0.mlp.up_proj.weight (nearest in the file: layers.0.mlp.upproj.weight); not in "
            "the model: layers.0.mlp.upproj.weight (nearest in the model: "
            "layers.0.mlp.up_proj.weight); layers.0.mlp.down_proj.weight is [4,2], the model's "
            "[2,4]");
  file["layers.0.mlp.up_proj.weight"] = file.at("layers.0.mlp.upproj.weight");
  file.erase("layers.0.mlp.upproj.weight");
  file["layers.0.mlp.down_proj.weight"] = Tensor::Zeros({2, 4});
  EXPECT_TRUE(CheckWeightsMatch(model, file, "w.safetensors").ok());
}

}  // namespace
}  // namespace braid
