#include "plugins/checkpoint/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

std::string TempPath(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  return std::string(t != nullptr ? t : "/tmp") + "/" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string RawBytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

std::string U64LE(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(v >> (8 * i));
  return s;
}

// A file as the spec lays it out: length, header, data.
std::string File(const std::string& header, const std::string& data) {
  return U64LE(header.size()) + header + data;
}

TEST(Safetensors, RoundTripsEveryDTypeScalarsAndEmptyTensors) {
  std::map<std::string, Tensor> in;
  in["f32"] = Tensor::FromVector<float>({1.5f, -2.25f, 3e-8f, 1e30f, -0.0f, 7.0f}, {2, 3});
  in["bf16"] = Tensor::FromVector<float>({1.0f, -3.5f, 0.15625f, 65504.0f}, {4}).To(DType::kBF16);
  in["f16"] = Tensor::FromVector<float>({0.5f, -1.0f, 2048.0f}, {3, 1}).To(DType::kF16);
  in["i32"] = Tensor::FromVector<int32_t>({-2147483647 - 1, -1, 0, 1, 2147483647}, {5});
  in["i64"] = Tensor::FromVector<int64_t>({int64_t(1) << 62, -5, 0, 123456789012345}, {2, 2});
  in["u8"] = Tensor::FromVector<uint8_t>({0, 1, 127, 128, 255}, {5});
  in["i8"] = Tensor::FromVector<int8_t>({-128, -1, 0, 127}, {1, 4});
  in["scalar"] = Tensor::Scalar(42.5f);
  in["scalar_i64"] = Tensor::FromVector<int64_t>({-9}, {});
  in["empty"] = Tensor::Empty({0}, DType::kF32);
  in["empty_2d_i64"] = Tensor::Empty({3, 0}, DType::kI64);
  in["empty_u8"] = Tensor::Empty({0, 2}, DType::kU8);
  // Names and metadata that need escaping or are not ASCII.
  in["quote\"back\\slash\ttab\x01"] = Tensor::FromVector<int32_t>({5}, {1});
  in["h.0.attn.c_attn.wéight名"] = Tensor::FromVector<uint8_t>({9}, {1, 1});
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"step", "42"}, {"odd", "a\"b\\c\nd\x1f"}, {"ünï", "cödé"}};

  const std::string path = TempPath("round_trip.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, in, meta).ok());
  auto read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->metadata, meta);
  ASSERT_EQ(read->tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    auto it = read->tensors.find(name);
    ASSERT_NE(it, read->tensors.end()) << name;
    const Tensor& u = it->second;
    EXPECT_EQ(u.dtype(), t.dtype()) << name;
    EXPECT_EQ(u.shape(), t.shape()) << name;
    EXPECT_EQ(RawBytes(u), RawBytes(t)) << name;
    EXPECT_EQ(u.name(), name);
  }
  EXPECT_EQ(read->tensors["scalar"].ndim(), 0);
  EXPECT_EQ(read->tensors["scalar"].item(), 42.5f);

  auto plain = LoadSafetensors(path);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->size(), in.size());
}

TEST(Safetensors, WritesTheSpecLayout) {
  std::map<std::string, Tensor> in;
  in["c_u8"] = Tensor::FromVector<uint8_t>({1, 2, 3}, {3});
  in["b_f32"] = Tensor::FromVector<float>({1, 2}, {2});
  in["a_bf16"] = Tensor::FromVector<float>({1}, {1}).To(DType::kBF16);
  in["d_i64"] = Tensor::FromVector<int64_t>({7}, {1});
  const std::string path = TempPath("layout.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, in, {{"k", "v"}}).ok());
  const std::string bytes = ReadAll(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 3 + 8 + 2 + 8);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"k\":\"v\"},", 0), 0u) << header;
  const size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "pad is spaces";
  EXPECT_LT(n - (close + 1), 8u);
  // Keys in name order; every tensor's data aligned to its element size.
  std::regex entry(
      R"re("(\w+)":\{"dtype":"(\w+)","shape":\[[0-9,]*\],"data_offsets":\[(\d+),(\d+)\]\})re");
  std::vector<std::string> names;
  const std::map<std::string, int> width = {{"U8", 1}, {"F32", 4}, {"BF16", 2}, {"I64", 8}};
  for (auto it = std::sregex_iterator(header.begin(), header.end(), entry);
       it != std::sregex_iterator(); ++it) {
    names.push_back((*it)[1]);
    EXPECT_EQ(std::stoull((*it)[3]) % width.at((*it)[2]), 0u) << (*it)[0];
  }
  EXPECT_EQ(names, (std::vector<std::string>{"a_bf16", "b_f32", "c_u8", "d_i64"}));
  // The i64 comes first in the data: 7 as 8 little-endian bytes right after the header.
  EXPECT_EQ(bytes.substr(8 + n, 8), U64LE(7));
}

TEST(Safetensors, LoadsAFileBuiltByHand) {
  // Key order, field order, spacing, escapes and trailing whitespace as another writer might
  // produce them; data bytes written out per the spec (little-endian).
  const std::string header =
      "{\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[4,12]}, "
      "\"__metadata__\" : {\"format\":\"pt\"},\n"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
      "\"l\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[12,20]},"
      "\"h\":{\"shape\":[1],\"dtype\":\"F16\",\"data_offsets\":[20,22]},"
      "\"w\\u00e9ight\\ud83d\\ude00\":{\"data_offsets\":[22,24],\"shape\":[1,2],\"dtype\":\"U8\"},"
      "\"s\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[24,25]},"
      "\"g\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[25,27]},"
      "\"z\":{\"dtype\":\"BF16\",\"shape\":[0,5],\"data_offsets\":[27,27]}}   ";
  const std::string data = std::string("\x00\x00\xc0\x3f", 4) +                  // a = 1.5f
                           std::string("\xfe\xff\xff\xff\x07\x00\x00\x00", 8) +  // b = -2, 7
                           std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8) +  // l
                           std::string("\x00\x3c", 2) +                          // h = 1.0
                           std::string("\x09\xfa", 2) +                          // w = 9, 250
                           std::string("\x80", 1) +                              // s = -128
                           std::string("\x20\xc0", 2);                           // g = -2.5
  const std::string path = TempPath("by_hand.safetensors");
  WriteAll(path, File(header, data));
  auto read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  auto& t = read->tensors;
  ASSERT_EQ(t.size(), 8u);
  EXPECT_EQ(read->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(t["a"].shape(), Shape{});
  EXPECT_EQ(t["a"].item(), 1.5f);
  EXPECT_EQ(t["b"].ToVector<int32_t>(), (std::vector<int32_t>{-2, 7}));
  EXPECT_EQ(t["l"].ToVector<int64_t>(), (std::vector<int64_t>{0x0102030405060708}));
  EXPECT_EQ(t["h"].dtype(), DType::kF16);
  EXPECT_EQ(t["h"].ToFloatVector(), (std::vector<float>{1.0f}));
  const std::string w = "w\xc3\xa9ight\xf0\x9f\x98\x80";  // the escapes decoded to UTF-8
  ASSERT_EQ(t.count(w), 1u);
  EXPECT_EQ(t[w].shape(), (Shape{1, 2}));
  EXPECT_EQ(t[w].ToVector<uint8_t>(), (std::vector<uint8_t>{9, 250}));
  EXPECT_EQ(t["s"].ToVector<int8_t>(), (std::vector<int8_t>{-128}));
  EXPECT_EQ(t["g"].ToFloatVector(), (std::vector<float>{-2.5f}));
  EXPECT_EQ(t["z"].shape(), (Shape{0, 5}));
  EXPECT_EQ(t["z"].dtype(), DType::kBF16);

  // The smallest valid file: no tensors.
  WriteAll(path, File("{}", ""));
  auto empty = ReadSafetensors(path);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->tensors.empty());
}

// Expects loading `bytes` to fail with a message holding the file name and every `parts`.
void ExpectError(const std::string& bytes, std::initializer_list<const char*> parts) {
  const std::string path = TempPath("corrupt.safetensors");
  WriteAll(path, bytes);
  auto r = LoadSafetensors(path);
  ASSERT_FALSE(r.ok()) << "accepted a corrupt file; expected an error with " << *parts.begin();
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("corrupt.safetensors"), std::string::npos) << msg;
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "want '" << p << "' in: " << msg;
}

std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  int begin, int end) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape,
                      ",\"data_offsets\":[", begin, ",", end, "]}");
}

TEST(Safetensors, RejectsCorruptFiles) {
  const std::string good_header = "{" + Entry("w", "F32", "[2]", 0, 8) + "}";
  const std::string good = File(good_header, std::string(8, '\x01'));

  // Truncation: in the length, in the header, in the data.
  ExpectError(good.substr(0, 5), {"8-byte header length"});
  ExpectError(good.substr(0, 20), {"truncated"});
  ExpectError(good.substr(0, good.size() - 1), {"tensor 'w'", "truncated"});
  // Bad header lengths.
  ExpectError(U64LE(uint64_t(1) << 60) + good_header, {"header length", "truncated"});
  ExpectError(U64LE(1) + "{", {"too small"});
  ExpectError(U64LE(0), {"too small"});
  // Offsets: overlapping, with a hole, leaving bytes over, reversed, not integers.
  ExpectError(
      File("{" + Entry("x", "F32", "[2]", 0, 8) + "," + Entry("y", "F32", "[1]", 4, 8) + "}",
           std::string(8, '\0')),
      {"'x'", "'y'", "overlap"});
  ExpectError(
      File("{" + Entry("x", "F32", "[1]", 0, 4) + "," + Entry("y", "F32", "[1]", 8, 12) + "}",
           std::string(12, '\0')),
      {"[4, 8)", "no tensor", "'y'"});
  ExpectError(File(good_header, std::string(12, '\0')), {"last 4", "no tensor"});
  ExpectError(File("{" + Entry("x", "U8", "[0]", 4, 0) + "}", std::string(4, '\0')),
              {"'x'", "end before they begin"});
  ExpectError(File("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}",
                   std::string(4, '\0')),
              {"'x'", "data_offsets"});
  // dtype and shape.
  ExpectError(File("{" + Entry("x", "F99", "[1]", 0, 4) + "}", std::string(4, '\0')),
              {"tensor 'x'", "unknown dtype \"F99\""});
  ExpectError(File("{" + Entry("x", "F64", "[1]", 0, 8) + "}", std::string(8, '\0')),
              {"tensor 'x'", "F64", "no such tensor type"});
  ExpectError(File("{" + Entry("x", "F32", "[3]", 0, 8) + "}", std::string(8, '\0')),
              {"tensor 'x'", "needs 3 x 4 bytes", "hold 8"});
  ExpectError(File("{" + Entry("x", "F32", "[-1]", 0, 0) + "}", ""),
              {"tensor 'x'", "-1", "non-negative integer"});
  ExpectError(File("{" + Entry("x", "U8", "[4294967296,4294967296]", 0, 0) + "}", ""),
              {"tensor 'x'", "overflows"});
  ExpectError(File("{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", ""),
              {"tensor 'x'", "missing field \"data_offsets\""});
  ExpectError(
      File("{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0],\"extra\":1}}", ""),
      {"tensor 'x'", "unknown field \"extra\""});
  // Header JSON.
  ExpectError(File("{\"x\":{\"dtype\":\"F32\",}}", ""),
              {"invalid JSON", "at byte 20", "object key"});
  ExpectError(File(" {}", ""), {"does not start with '{'"});
  ExpectError(File("{} x", ""), {"invalid JSON", "end of the header"});
  ExpectError(
      File("{" + Entry("x", "U8", "[0]", 0, 0) + "," + Entry("x", "U8", "[0]", 0, 0) + "}", ""),
      {"\"x\"", "appears twice"});
  ExpectError(File("{\"__metadata__\":{\"step\":3}}", ""), {"'step'", "must be strings"});
  // The writer refuses an empty name, so the reader does (found by safetensors_fuzzer).
  ExpectError(File("{" + Entry("", "U8", "[0]", 0, 0) + "}", ""), {"empty name", "damaged"});
  ExpectError(File("{\"x\xff\":1}", ""), {"not valid UTF-8", "byte 3"});
  ExpectError(File("{\"x\":\"\\ud800\"}", ""), {"invalid JSON", "low surrogate"});
  ExpectError(
      File("{\"__metadata__\":" + std::string(1000, '[') + std::string(1000, ']') + "}", ""),
      {"nested"});
  std::string deep_objects = "{";
  for (int i = 0; i < 100; ++i) deep_objects += "\"k\":{";
  ExpectError(File(deep_objects + std::string(101, '}'), ""), {"nested"});
  ExpectError(File("{\"a\":{\"b\":1,\"b\":2}}", ""), {"\"b\"", "appears twice"});
  ExpectError(File("{\"x\":1", ""), {"invalid JSON", "end of the header"});
  ExpectError(File("{\"x\":\"\\udc00\"}", ""), {"invalid JSON", "low surrogate"});
  ExpectError(File("{\"a\":NaN}", ""), {"invalid JSON", "at byte 5"});
  ExpectError(File("{\"a\":1e999}", ""), {"invalid JSON", "1e999"});
  ExpectError(File("{\"x\":{\"dtype\":\"U8\",\"shape\":[1e0],\"data_offsets\":[0,1]}}", "a"),
              {"tensor 'x'", "shape entry", "non-negative integer"});
  ExpectError(File("{" + Entry("x", "U8", "[9223372036854775808]", 0, 0) + "}", ""),
              {"tensor 'x'", "9223372036854775808", "non-negative integer"});
}

TEST(Safetensors, JsonErrorsQuoteLongTokensShortened) {
  // A syntax error at the end of a 1 MB string: the message quotes the string's end only.
  const std::string path = TempPath("corrupt.safetensors");
  WriteAll(path, File("{\"x\":\"" + std::string(1 << 20, 'a') + "\\q\"}", ""));
  auto r = LoadSafetensors(path);
  ASSERT_FALSE(r.ok());
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find(absl::StrCat("at byte ", 6 + (1 << 20) + 1)), std::string::npos) << msg;
  EXPECT_NE(msg.find("backslash"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 400u) << msg;
}

TEST(Safetensors, RejectsAnOversizedHeaderWithoutReadingIt) {
  // A sparse file, so the 200 MB it claims take no disk space.
  const std::string path = TempPath("corrupt.safetensors");
  WriteAll(path, U64LE(uint64_t(200) << 20) + "{");
  ASSERT_EQ(truncate(path.c_str(), off_t(300) << 20), 0);
  auto r = LoadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("exceeds the limit"), absl::string_view::npos) << r.status();
}

TEST(Safetensors, MissingFileIsNotFound) {
  auto r = LoadSafetensors(TempPath("no_such.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("no_such.safetensors"), absl::string_view::npos);
}

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  }
  closedir(d);
  return out;
}

TEST(Safetensors, SaveReplacesAtomicallyAndLeavesNoTemporaryFile) {
  const std::string dir = TempPath("atomic");
  ASSERT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  const std::string path = dir + "/ckpt.safetensors";
  ASSERT_TRUE(SaveSafetensors(path, {{"w", Tensor::Full({4}, 1.0f)}}).ok());
  // A leftover temporary file from a crashed save of this process id is overwritten.
  WriteAll(absl::StrCat(path, ".tmp.", getpid()), "garbage from a crash");
  ASSERT_TRUE(SaveSafetensors(path, {{"w", Tensor::Full({4}, 2.0f)}}).ok());
  EXPECT_EQ(FilesIn(dir), std::vector<std::string>{"ckpt.safetensors"});
  auto r = LoadSafetensors(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->at("w").ToFloatVector(), (std::vector<float>{2, 2, 2, 2}));

  // A save that fails leaves the previous file as it was.
  auto bad = SaveSafetensors(path, {{"w", Tensor()}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("'w'"), absl::string_view::npos) << bad;
  EXPECT_NE(bad.message().find("ckpt.safetensors"), absl::string_view::npos) << bad;
  EXPECT_EQ(LoadSafetensors(path)->at("w").ToFloatVector(), (std::vector<float>{2, 2, 2, 2}));
  EXPECT_EQ(FilesIn(dir), std::vector<std::string>{"ckpt.safetensors"});

  auto no_dir = SaveSafetensors(dir + "/missing/x.safetensors", {});
  ASSERT_FALSE(no_dir.ok());
  EXPECT_EQ(no_dir.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(no_dir.message().find("missing/x.safetensors"), absl::string_view::npos) << no_dir;
}

TEST(Safetensors, SaveRejectsReservedAndEmptyNames) {
  const std::string path = TempPath("names.safetensors");
  EXPECT_FALSE(SaveSafetensors(path, {{"__metadata__", Tensor::Scalar(1)}}).ok());
  EXPECT_FALSE(SaveSafetensors(path, {{"", Tensor::Scalar(1)}}).ok());
  EXPECT_FALSE(SaveSafetensors(path, {{"bad\xff", Tensor::Scalar(1)}}).ok());
  // With no tensors at all the file is still valid.
  ASSERT_TRUE(SaveSafetensors(path, {}).ok());
  auto r = ReadSafetensors(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tensors.empty());
  EXPECT_EQ(ReadAll(path), U64LE(8) + "{}      ");
}

}  // namespace
}  // namespace braid
