#include "models/data/mnist.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "models/data/find_data.h"
#include "models/data/random.h"

namespace braid::data {
namespace {

// A scanner for the one shape these files have. A general JSON parser would build a DOM of
// ~800k nodes per file; this reads numbers straight into the output vector.
class DigitScanner {
 public:
  DigitScanner(const std::string& text, const std::string& name) : s_(text), name_(name) {}

  absl::StatusOr<std::vector<float>> Run() {
    std::vector<float> out;
    // Pixel files average ~4 bytes per value; reserving avoids most regrowth.
    out.reserve(s_.size() / 4);
    SkipSpace();
    BRAID_RETURN_IF_ERROR(Expect('{', "'{' opening the file's object"));
    SkipSpace();
    static constexpr char kKey[] = "\"data\"";
    if (s_.compare(pos_, sizeof(kKey) - 1, kKey) != 0) return Error("the key \"data\"");
    pos_ += sizeof(kKey) - 1;
    SkipSpace();
    BRAID_RETURN_IF_ERROR(Expect(':', "':' after \"data\""));
    SkipSpace();
    BRAID_RETURN_IF_ERROR(Expect('[', "'[' opening the data array"));
    SkipSpace();
    if (Peek() == ']') {
      ++pos_;
    } else {
      while (true) {
        float v;
        BRAID_RETURN_IF_ERROR(Number(&v));
        out.push_back(v);
        SkipSpace();
        char c = Peek();
        ++pos_;
        if (c == ',') {
          SkipSpace();
          continue;
        }
        if (c == ']') break;
        --pos_;
        return Error("',' or ']' after a number");
      }
    }
    SkipSpace();
    BRAID_RETURN_IF_ERROR(Expect('}', "'}' closing the file's object (only \"data\" is expected)"));
    SkipSpace();
    if (pos_ != s_.size()) return Error("the end of the file");
    return out;
  }

 private:
  char Peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool AtEnd() const { return pos_ >= s_.size(); }

  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) {
      ++pos_;
    }
  }

  absl::Status Error(const char* expected) const {
    std::string found = AtEnd() ? "end of file" : absl::StrCat("'", s_.substr(pos_, 1), "'");
    if (!AtEnd() && (s_[pos_] < 0x20 || s_[pos_] > 0x7e)) {
      found = absl::StrCat("byte 0x", absl::Hex(uint8_t(s_[pos_])));
    }
    return absl::InvalidArgumentError(absl::StrCat("MNIST file '", name_, "': at byte offset ",
                                                   pos_, ": expected ", expected, ", found ",
                                                   found));
  }

  absl::Status Expect(char c, const char* what) {
    if (Peek() != c || AtEnd()) return Error(what);
    ++pos_;
    return absl::OkStatus();
  }

  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }

  // JSON number grammar, strictly: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  absl::Status Number(float* v) {
    const size_t start = pos_;
    bool negative = false;
    if (Peek() == '-') {
      negative = true;
      ++pos_;
    }
    if (!IsDigit(Peek())) return Error("a number");
    uint64_t mant = 0;
    int sig = 0;        // significant digits in mant (leading zeros excluded)
    int exp10 = 0;      // value = mant * 10^exp10
    bool exact = true;  // whether the fast path below is exact
    auto digit = [&](char c, bool fraction) {
      if (mant == 0 && c == '0') {
        if (fraction) --exp10;
        return;
      }
      if (sig < 18) {
        mant = mant * 10 + uint64_t(c - '0');
        ++sig;
        if (fraction) --exp10;
      } else {
        exact = false;  // more digits than the fast path carries; strtod decides
        if (!fraction) ++exp10;
      }
    };
    if (Peek() == '0') {
      ++pos_;
      if (IsDigit(Peek())) return Error("no leading zeros in a number");
    } else {
      while (IsDigit(Peek())) digit(s_[pos_++], false);
    }
    if (Peek() == '.') {
      ++pos_;
      if (!IsDigit(Peek())) return Error("a digit after '.'");
      while (IsDigit(Peek())) digit(s_[pos_++], true);
    }
    if (Peek() == 'e' || Peek() == 'E') {
      ++pos_;
      int sign = 1;
      if (Peek() == '+' || Peek() == '-') sign = s_[pos_++] == '-' ? -1 : 1;
      if (!IsDigit(Peek())) return Error("a digit in the exponent");
      int e = 0;
      while (IsDigit(Peek())) {
        if (e < 100000) e = e * 10 + (s_[pos_] - '0');
        ++pos_;
      }
      exp10 += sign * e;
    }
    // mant < 2^53 and |exp10| <= 22 make both operands exact doubles, so one multiply or divide
    // is correctly rounded; anything else goes through strtod.
    double d;
    static constexpr double kPow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                        1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                        1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    if (exact && mant < (uint64_t(1) << 53) && exp10 >= -22 && exp10 <= 22) {
      d = exp10 >= 0 ? double(mant) * kPow10[exp10] : double(mant) / kPow10[-exp10];
      if (negative) d = -d;
    } else {
      std::string token = s_.substr(start, pos_ - start);
      d = std::strtod(token.c_str(), nullptr);
    }
    // Rounding twice (decimal to double to float) can differ from a direct decimal-to-float
    // conversion by one unit in rare halfway cases; pixel values with three decimals never are.
    *v = float(d);
    if (!std::isfinite(*v)) {
      pos_ = start;
      return Error("a number within float range");
    }
    return absl::OkStatus();
  }

  const std::string& s_;
  const std::string& name_;
  size_t pos_ = 0;
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open MNIST file '", path,
                                            "'; run tools/setup.sh to install the data sets"));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading MNIST file '", path, "'"));
  return ss.str();
}

MnistData Gather(const MnistData& all, const std::vector<int64_t>& rows) {
  const int64_t n = int64_t(rows.size());
  MnistData out{Tensor::Empty({n, kMnistPixels}, DType::kF32), Tensor::Empty({n}, DType::kI32)};
  const float* src = all.images.data<float>();
  const int32_t* src_labels = all.labels.data<int32_t>();
  float* dst = out.images.data<float>();
  int32_t* dst_labels = out.labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * kMnistPixels, src + rows[i] * kMnistPixels, kMnistPixels * sizeof(float));
    dst_labels[i] = src_labels[rows[i]];
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<float>> ParseMnistDigitJson(const std::string& text,
                                                       const std::string& name) {
  return DigitScanner(text, name).Run();
}

absl::StatusOr<MnistData> LoadMnistDigits(const std::string& digits_dir) {
  std::vector<std::vector<float>> pixels(10);
  int64_t total = 0;
  for (int d = 0; d < 10; ++d) {
    const std::string path = absl::StrCat(digits_dir, "/", d, ".json");
    BRAID_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    BRAID_ASSIGN_OR_RETURN(pixels[d], ParseMnistDigitJson(text, path));
    if (pixels[d].empty() || pixels[d].size() % kMnistPixels != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MNIST file '", path, "' has ", pixels[d].size(), " values; expected a positive ",
          "multiple of ", kMnistPixels, " (28x28 pixels per image)"));
    }
    total += int64_t(pixels[d].size()) / kMnistPixels;
  }
  MnistData out{Tensor::Empty({total, kMnistPixels}, DType::kF32),
                Tensor::Empty({total}, DType::kI32)};
  float* img = out.images.data<float>();
  int32_t* lab = out.labels.data<int32_t>();
  for (int d = 0; d < 10; ++d) {
    std::memcpy(img, pixels[d].data(), pixels[d].size() * sizeof(float));
    img += pixels[d].size();
    const int64_t n = int64_t(pixels[d].size()) / kMnistPixels;
    for (int64_t i = 0; i < n; ++i) *lab++ = d;
  }
  return out;
}

absl::StatusOr<MnistSplit> SplitMnist(const MnistData& all, int64_t test_size, uint64_t seed) {
  const int64_t n = all.size();
  if (test_size < 0 || test_size > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SplitMnist: test size ", test_size, " is not within the data set's ", n, " samples"));
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  SplitMix64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[i], order[UniformBelow(rng, uint64_t(i) + 1)]);
  const int64_t n_train = n - test_size;
  MnistSplit split;
  split.train = Gather(all, std::vector<int64_t>(order.begin(), order.begin() + n_train));
  split.test = Gather(all, std::vector<int64_t>(order.begin() + n_train, order.end()));
  return split;
}

absl::StatusOr<MnistSplit> LoadMnist() {
  BRAID_ASSIGN_OR_RETURN(std::string dir, FindDataFile(kMnistDigitsDir));
  BRAID_ASSIGN_OR_RETURN(MnistData all, LoadMnistDigits(dir));
  return SplitMnist(all);
}

}  // namespace braid::data
