// index.json (checkpoint_index.h): indexes the previous writer wrote read and write back byte for
// byte; every kind of damage is a kDataLoss error naming the file and the field, never an
// exception; the old format keeps its own message; rank 0's merge of the ranks' parts.
#include "plugins/checkpoint/checkpoint_index.h"

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace braid::checkpoint {
namespace {

using json = nlohmann::json;
constexpr char kWhere[] = "ckpt/step_2/index.json";

// Written by the checkpointer before the index had a unit of its own (mlp, SGD with momentum,
// 2 steps: one process, DDP, ZeRO-3 and tensor parallel on 2; gpt-mini in 2 pipeline stages).
// They are the fuzzer's seeds as well.
const char* const kRealIndexes[] = {"real_single_mlp.json", "real_ddp2_mlp.json", "real_zero3_mlp.json",
                                    "real_tp2_mlp.json", "real_pipe2_gpt_mini.json"};

std::string ReadCorpusFile(const std::string& name) {
  // Tests run in the workspace's runfiles folder.
  std::ifstream in("plugins/checkpoint/fuzz_corpus/checkpoint_index_fuzzer/" + name, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Two ranks: "w" split between their files, "b" and "optimizer/step" in rank 0's.
CheckpointIndex Example() {
  CheckpointIndex index;
  index.step = 2;
  index.world_size = 2;
  index.files["rank0.safetensors"] = {1000, 123456789u};
  index.files["rank1.safetensors"] = {600, 4294967295u};
  index.tensors["w"] = {{3, 4}, "f32", {{"rank0.safetensors", "w#0", {{0, 2}, {4, 6}, {8, 10}}},
                                        {"rank1.safetensors", "w#0", {{2, 4}, {6, 8}, {10, 12}}}}};
  index.tensors["b"] = {{4}, "bf16", {{"rank0.safetensors", "b#1", {{0, 4}}}}};
  index.tensors["optimizer/step"] = {{1}, "f32", {{"rank0.safetensors", "optimizer/step#2", {{0, 1}}}}};
  index.extra[0] = {{"batches_drawn", "2"}, {"step", "2"}};
  index.extra[1] = {{"batches_drawn", "2"}, {"step", "2"}};
  return index;
}

TEST(CheckpointIndex, IndexesThePreviousWriterWroteReadAndWriteBackByteForByte) {
  for (const char* name : kRealIndexes) {
    SCOPED_TRACE(name);
    const std::string text = ReadCorpusFile(name);
    ASSERT_FALSE(text.empty());
    absl::StatusOr<CheckpointIndex> index = ParseCheckpointIndex(text, kWhere);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_GE(index->tensors.size(), 5u);
    EXPECT_EQ(int64_t(index->files.size()), index->world_size);
    EXPECT_EQ(CheckpointIndexToJson(*index), text);
  }
}

TEST(CheckpointIndex, RoundTrip) {
  const CheckpointIndex index = Example();
  const std::string text = CheckpointIndexToJson(index);
  absl::StatusOr<CheckpointIndex> back = ParseCheckpointIndex(text, kWhere);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == index);
  EXPECT_EQ(back->tensors.at("w").chunks[1].runs[2], std::make_pair(int64_t(10), int64_t(12)));
  EXPECT_EQ(back->files.at("rank1.safetensors").crc32, 4294967295u);
  EXPECT_EQ(back->extra.at(1).at("batches_drawn"), "2");
  // The keys and format as every reader since braid-checkpoint-2 expects them.
  EXPECT_EQ(text.rfind(R"({"extra":{"0":{"batches_drawn":"2","step":"2"},"1":{)", 0), 0u) << text;
  EXPECT_NE(text.find(R"("format":"braid-checkpoint-2","step":2,"tensors":{"b":{"chunks":[{"file":)"
                      R"("rank0.safetensors","key":"b#1","runs":[[0,4]]}],"dtype":"bf16","shape":[4]})"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.substr(text.size() - 16), R"(,"world_size":2})");
}

// Edits the example's JSON with `damage` and parses it: the error, or OK where none was found.
absl::Status Damaged(const std::function<void(json&)>& damage) {
  json doc = json::parse(CheckpointIndexToJson(Example()));
  damage(doc);
  return ParseCheckpointIndex(doc.dump(), kWhere).status();
}

struct Damage {
  const char* what;
  std::function<void(json&)> edit;
  const char* message;  // expected after "<where> is damaged: " (a prefix of the rest)
};

TEST(CheckpointIndex, EveryKindOfDamageIsDataLossNamingTheField) {
  const std::string w0 = "/tensors/w/chunks/0";
  const std::vector<Damage> cases = {
      {"step missing", [](json& j) { j.erase("step"); }, "step is missing"},
      {"step negative", [](json& j) { j["step"] = -3; }, "step is -3, not an integer of at least 0"},
      {"step a string", [](json& j) { j["step"] = "2"; }, "step is \"2\", not an integer"},
      {"step a fraction", [](json& j) { j["step"] = 2.5; }, "step is 2.5, not an integer"},
      {"step beyond int64", [](json& j) { j["step"] = uint64_t(1) << 63; }, "step is 9223372036854775808"},
      {"world_size zero", [](json& j) { j["world_size"] = 0; }, "world_size is 0, not an integer of at least 1"},
      {"world_size wrong", [](json& j) { j["world_size"] = 3; },
       "files lists 2 file(s), but world_size is 3 (one file per rank)"},
      {"files missing", [](json& j) { j.erase("files"); }, "files is missing"},
      {"files a list", [](json& j) { j["files"] = json::array(); }, "files is not an object of file names"},
      {"file outside the folder",
       [](json& j) {
         j["files"]["../rank1.safetensors"] = j["files"]["rank1.safetensors"];
         j["files"].erase("rank1.safetensors");
       },
       "files has '../rank1.safetensors', which is not the name of a file in the checkpoint's folder"},
      {"file not an object", [](json& j) { j["files"]["rank0.safetensors"] = 5; },
       "files.rank0.safetensors is not an object with bytes and crc32"},
      {"bytes negative", [](json& j) { j["files"]["rank0.safetensors"]["bytes"] = -1; },
       "files.rank0.safetensors.bytes is -1, not an integer of at least 0"},
      {"bytes missing", [](json& j) { j["files"]["rank1.safetensors"].erase("bytes"); },
       "files.rank1.safetensors.bytes is missing"},
      {"crc32 of 33 bits", [](json& j) { j["files"]["rank0.safetensors"]["crc32"] = uint64_t(1) << 32; },
       "files.rank0.safetensors.crc32 is not a 32-bit checksum"},
      {"crc32 negative", [](json& j) { j["files"]["rank0.safetensors"]["crc32"] = -5; },
       "files.rank0.safetensors.crc32 is not a 32-bit checksum"},
      {"tensors missing", [](json& j) { j.erase("tensors"); }, "tensors is missing"},
      {"tensors a string", [](json& j) { j["tensors"] = "w"; }, "tensors is not an object of tensor names"},
      {"tensor null", [](json& j) { j["tensors"]["b"] = nullptr; }, "tensors.b is not an object"},
      {"shape missing", [](json& j) { j["tensors"]["w"].erase("shape"); }, "tensors.w.shape is missing"},
      {"shape a number", [](json& j) { j["tensors"]["w"]["shape"] = 12; }, "tensors.w.shape is not a list of sizes"},
      {"size negative", [](json& j) { j["tensors"]["w"]["shape"][1] = -4; },
       "tensors.w.shape[1] is not a size (an integer >= 0)"},
      {"elements overflow", [](json& j) { j["tensors"]["w"]["shape"] = {int64_t(1) << 62, 4}; },
       "tensors.w.shape has more elements than a 64-bit count holds"},
      {"dtype missing", [](json& j) { j["tensors"]["b"].erase("dtype"); }, "tensors.b.dtype is missing"},
      {"dtype a number", [](json& j) { j["tensors"]["b"]["dtype"] = 7; }, "tensors.b.dtype is not a dtype name"},
      {"chunks an object", [](json& j) { j["tensors"]["b"]["chunks"] = json::object(); },
       "tensors.b.chunks is not a list"},
      {"chunk a list", [](json& j) { j["tensors"]["b"]["chunks"][0] = json::array(); },
       "tensors.b.chunks[0] is not an object with file, key and runs"},
      {"chunk's file unlisted", [&](json& j) { j[json::json_pointer(w0 + "/file")] = "rank7.safetensors"; },
       "tensors.w.chunks[0].file names 'rank7.safetensors', which files does not list"},
      {"chunk's file a number", [&](json& j) { j[json::json_pointer(w0 + "/file")] = 0; },
       "tensors.w.chunks[0].file is not a file name"},
      {"key missing", [&](json& j) { j[json::json_pointer(w0)].erase("key"); }, "tensors.w.chunks[0].key is missing"},
      {"key empty", [&](json& j) { j[json::json_pointer(w0 + "/key")] = ""; },
       "tensors.w.chunks[0].key is not a tensor name"},
      {"key named twice", [](json& j) { j["tensors"]["optimizer/step"]["chunks"][0]["key"] = "b#1"; },
       "tensors.optimizer/step.chunks[0] names the same tensor of the same file as tensors.b.chunks[0]"},
      {"runs missing", [&](json& j) { j[json::json_pointer(w0)].erase("runs"); },
       "tensors.w.chunks[0].runs is missing"},
      {"runs a pair", [&](json& j) { j[json::json_pointer(w0 + "/runs")] = 3; },
       "tensors.w.chunks[0].runs is not a list of [begin, end) pairs"},
      {"run of one", [](json& j) { j["tensors"]["w"]["chunks"][1]["runs"][2] = {10}; },
       "tensors.w.chunks[1].runs[2] is not a pair of integers"},
      {"run of three", [](json& j) { j["tensors"]["w"]["chunks"][1]["runs"][2] = {10, 11, 12}; },
       "tensors.w.chunks[1].runs[2] is not a pair of integers"},
      {"run with a string", [](json& j) { j["tensors"]["w"]["chunks"][1]["runs"][0][1] = "4"; },
       "tensors.w.chunks[1].runs[0] is not a pair of integers"},
      {"run with a fraction", [](json& j) { j["tensors"]["w"]["chunks"][1]["runs"][0][0] = 2.0; },
       "tensors.w.chunks[1].runs[0] is not a pair of integers"},
      {"run past the end", [](json& j) { j["tensors"]["w"]["chunks"][1]["runs"][2] = {10, 13}; },
       "tensors.w.chunks[1].runs[2] is [10, 13), not a range within the tensor's 12 element(s)"},
      {"run backwards", [](json& j) { j["tensors"]["w"]["chunks"][1]["runs"][2] = {12, 10}; },
       "tensors.w.chunks[1].runs[2] is [12, 10), not a range"},
      {"run before the start", [](json& j) { j["tensors"]["w"]["chunks"][1]["runs"][0] = {-2, 4}; },
       "tensors.w.chunks[1].runs[0] is [-2, 4), not a range"},
      {"runs overlap", [](json& j) { j["tensors"]["w"]["chunks"][1]["runs"][1] = {5, 8}; },
       "tensors.w.chunks[1].runs[1] overlaps tensors.w.chunks[0].runs[1]: element 5 is saved twice"},
      {"extra missing", [](json& j) { j.erase("extra"); }, "extra is missing"},
      {"extra a list", [](json& j) { j["extra"] = json::array(); }, "extra is not an object of ranks"},
      {"extra of a rank too many", [](json& j) { j["extra"]["2"] = json::object(); },
       "extra.2 is not a rank (0 to 1)"},
      {"extra of rank 01", [](json& j) { j["extra"]["01"] = json::object(); }, "extra.01 is not a rank"},
      {"extra of rank -1", [](json& j) { j["extra"]["-1"] = json::object(); }, "extra.-1 is not a rank"},
      {"extra of a huge rank", [](json& j) { j["extra"]["99999999999999999999999"] = json::object(); },
       "extra.99999999999999999999999 is not a rank"},
      {"extra's strings a list", [](json& j) { j["extra"]["1"] = json::array(); },
       "extra.1 is not an object of strings"},
      {"extra a number", [](json& j) { j["extra"]["0"]["step"] = 2; }, "extra.0.step is not a string"},
  };
  for (const Damage& d : cases) {
    SCOPED_TRACE(d.what);
    absl::Status st = Damaged(d.edit);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    const std::string prefix = std::string(kWhere) + " is damaged: " + d.message;
    EXPECT_EQ(std::string(st.message()).substr(0, prefix.size()), prefix) << st;
    // And what to do about it.
    EXPECT_NE(st.message().find("delete the checkpoint's folder to resume from an older checkpoint"),
              std::string::npos)
        << st;
  }
}

TEST(CheckpointIndex, WhatIsNotAnIndexAtAllIsSaidSo) {
  auto message = [](const std::string& text) {
    absl::Status st = ParseCheckpointIndex(text, kWhere).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    return std::string(st.message());
  };
  const std::string cut = CheckpointIndexToJson(Example()).substr(0, 100);
  EXPECT_EQ(message(cut).rfind(std::string(kWhere) + " is not JSON (parse error at line 1, column 101: ", 0), 0u)
      << message(cut);
  EXPECT_NE(message(cut).find("it is damaged or cut short"), std::string::npos);
  EXPECT_EQ(message("").rfind(std::string(kWhere) + " is not JSON (", 0), 0u) << message("");
  EXPECT_EQ(message("{\"step\": 1e999}").rfind(std::string(kWhere) + " is not JSON (", 0), 0u);
  EXPECT_EQ(message("[1, 2]"), std::string(kWhere) + " is not a Braid checkpoint index (not a JSON object)");
  EXPECT_EQ(message("{}"), std::string(kWhere) + " is not a Braid checkpoint index (it has no format)");
  EXPECT_EQ(message(R"({"format": "braid-checkpoint-3"})"),
            std::string(kWhere) + " is not a Braid checkpoint index (its format is 'braid-checkpoint-3'; this "
                                  "Braid reads braid-checkpoint-2)");
}

TEST(CheckpointIndex, TheOldFormatKeepsItsMessage) {
  json doc = json::parse(CheckpointIndexToJson(Example()));
  doc["format"] = "braid-checkpoint-1";
  absl::Status st = ParseCheckpointIndex(doc.dump(), kWhere).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), std::string(kWhere) +
                              " was written by an older Braid (format braid-checkpoint-1, whose checksums "
                              "cannot be checked in one pass); delete its folder or resume with the Braid "
                              "that wrote it");
}

// What the writer may write that is unusual but sound: empty runs, a tensor of no elements, a
// scalar, a rank whose file holds no chunk and which has no extra strings, unknown fields (a
// later Braid's additions of the same format).
TEST(CheckpointIndex, SoundEdgeCasesRead) {
  CheckpointIndex index = Example();
  index.tensors["empty"] = {{0, 5}, "f32", {{"rank1.safetensors", "empty#3", {{0, 0}}}}};
  index.tensors["scalar"] = {{}, "i64", {{"rank1.safetensors", "scalar#4", {{0, 1}}}}};
  index.tensors["w"].chunks[0].runs.push_back({12, 12});
  index.extra.erase(1);
  json doc = json::parse(CheckpointIndexToJson(index));
  doc["written_by"] = "a later Braid";
  absl::StatusOr<CheckpointIndex> back = ParseCheckpointIndex(doc.dump(), kWhere);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == index);
}

// Rank 0 assembles the index from each rank's part (its one file alone, as if it were rank 0 of
// one): the example, split into its ranks' parts and merged, is the example.
TEST(CheckpointIndex, RanksPartsMergeIntoTheIndex) {
  const CheckpointIndex whole = Example();
  std::vector<CheckpointIndex> parts(2);
  for (int r = 0; r < 2; ++r) {
    const std::string file = "rank" + std::to_string(r) + ".safetensors";
    parts[r].step = 2;
    parts[r].world_size = 1;
    parts[r].files[file] = whole.files.at(file);
    parts[r].extra[0] = whole.extra.at(r);
    for (const auto& [name, t] : whole.tensors) {
      for (const IndexedChunk& c : t.chunks) {
        if (c.file != file) continue;
        parts[r].tensors[name].shape = t.shape;
        parts[r].tensors[name].dtype = t.dtype;
        parts[r].tensors[name].chunks.push_back(c);
      }
    }
    // Each part is an index of its own, and travels as one.
    ASSERT_TRUE(ParseCheckpointIndex(CheckpointIndexToJson(parts[r]), "part").ok());
  }
  CheckpointIndex merged;
  merged.step = 2;
  merged.world_size = 2;
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(MergeCheckpointIndex(parts[r], r, &merged).ok());
  EXPECT_TRUE(merged == whole);

  // A strategy's bug, said as such: the same file twice, or one tensor of two shapes.
  CheckpointIndex again = merged;
  absl::Status st = MergeCheckpointIndex(parts[1], 1, &again);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(st.message(), "rank 1's part of the checkpoint index names file rank1.safetensors, as an earlier "
                          "part does");
  CheckpointIndex other = parts[1];
  other.files = {{"rank2.safetensors", {1, 2}}};
  other.tensors.at("w").shape = {4, 3};
  st = MergeCheckpointIndex(other, 2, &merged);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("gives w shape [4, 3] and dtype f32, but an earlier part [3, 4] and f32"),
            std::string::npos)
      << st;
}

}  // namespace
}  // namespace braid::checkpoint
