// Runs anywhere a --config=cuda build runs. Without a usable GPU (this build machine: no driver)
// the GPU tests skip with CUDA's reason, and the error paths are what gets checked.
#include "backends/cuda/device.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "backends/cuda/axpby.h"
#include "backends/cuda/gpu_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::cuda {
namespace {

using ::testing::HasSubstr;

// cuda_runtime_api.h's cudaMalloc takes void** only (the typed overload is in cuda_runtime.h,
// which needs nvcc).
cudaError_t DeviceMalloc(float** ptr, size_t count) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), count * sizeof(float));
}

std::vector<float> RandomVector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

// Naive reference in double; `y_before` is ignored when b == 0 (BLAS semantics).
void ExpectAxpby(float a, const std::vector<float>& x, float b, const std::vector<float>& y_before,
                 const std::vector<float>& y_after, const std::string& where) {
  ASSERT_EQ(x.size(), y_after.size()) << where;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ax = double(a) * x[i];
    const double by = b == 0.f ? 0.0 : double(b) * y_before[i];
    // A few float roundings (the GPU fuses a * x + (b * y) into one FMA).
    const double tol = 4 * std::numeric_limits<float>::epsilon() * (std::fabs(ax) + std::fabs(by));
    ASSERT_NEAR(y_after[i], ax + by, tol + 1e-30) << where << " i=" << i << " of " << x.size();
  }
}

// GPU tests: they run in device_test_gpu, which Bazel skips without a GPU and where a missing
// GPU is a failure (BRAID_REQUIRE_GPU, gpu_test_env.h); the binary run by hand without one
// skips them, saying why.
class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) {
      const std::string why = "No usable CUDA device: " + count.status().ToString();
      if (gpu_test::MustFailWithGpus(1, 0)) FAIL() << why;
      GTEST_SKIP() << why;
    }
    num_devices_ = *count;
  }
  int num_devices_ = 0;
};

TEST(CudaDeviceTest, CountIsPositiveOrNamesCudasError) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) {
    EXPECT_GT(*count, 0);
  } else {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable) << count.status();
    EXPECT_THAT(std::string(count.status().message()), HasSubstr("cudaGetDeviceCount"));
    // CUDA's own error name is in the message, whatever the reason was.
    EXPECT_THAT(std::string(count.status().message()), HasSubstr("(cudaError"));
  }
}

TEST(CudaDeviceTest, BadArgumentsAreRejectedBeforeTouchingCuda) {
  EXPECT_EQ(CudaDeviceName(-1).status().code(), absl::StatusCode::kInvalidArgument);
  float x = 1.f, y = 2.f;
  absl::Status st = AxpbyOnDevice(0, 1.f, &x, 1.f, &y, -1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("n = -1"));
  EXPECT_EQ(AxpbyOnDevice(-1, 1.f, &x, 1.f, &y, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(y, 2.f);
}

// The absence of a GPU must be an error a caller can report, not a crash, for every entry point.
// Runs in device_test_no_gpu, which Bazel skips on a machine with a GPU.
TEST(CudaDeviceTest, WithoutDeviceEveryCallFailsCleanly) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) {
    const std::string why = absl::StrCat("This machine has ", *count, " CUDA device(s).");
    if (gpu_test::MustFailWithAGpu()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  absl::StatusOr<std::string> name = CudaDeviceName(0);
  EXPECT_EQ(name.status(), count.status());
  std::vector<float> x = {1.f, 2.f, 3.f}, y = {4.f, 5.f, 6.f};
  EXPECT_EQ(AxpbyOnDevice(0, 2.f, x.data(), 3.f, y.data(), 3), count.status());
  EXPECT_EQ(y, (std::vector<float>{4.f, 5.f, 6.f}));
}

TEST_F(CudaGpuTest, EveryDeviceHasANameAndIndicesAreChecked) {
  for (int i = 0; i < num_devices_; ++i) {
    absl::StatusOr<std::string> name = CudaDeviceName(i);
    ASSERT_TRUE(name.ok()) << name.status();
    EXPECT_FALSE(name->empty());
    std::cout << "cuda:" << i << " is " << *name << "\n";
  }
  absl::StatusOr<std::string> past_end = CudaDeviceName(num_devices_);
  EXPECT_EQ(past_end.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(past_end.status().message()), HasSubstr("out of range"));
}

TEST_F(CudaGpuTest, AxpbyMatchesCpuReference) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  // Sizes around the four-wide vector path and its scalar tail, and one past several grids.
  for (int64_t n : {0, 1, 3, 4, 5, 255, 256, 257, 1023, 4096 * 256 * 4 + 7}) {
    for (auto [a, b] : {std::pair{2.f, -0.5f}, {1.f, 1.f}, {-0.75f, 0.f}, {0.f, 3.f}}) {
      const std::vector<float> x = RandomVector(n, 1);
      std::vector<float> y_before = RandomVector(n, 2);
      // With b == 0, y must be ignored: NaN would show through any read of it.
      if (b == 0.f) y_before.assign(size_t(n), kNaN);
      std::vector<float> y = y_before;
      const std::string where = "n=" + std::to_string(n) + " a=" + std::to_string(a) +
                                " b=" + std::to_string(b);
      ASSERT_TRUE(AxpbyOnDevice(0, a, x.data(), b, y.data(), n).ok()) << where;
      ExpectAxpby(a, x, b, y_before, y, where);
    }
  }
}

cudaError_t Upload(float* device, const std::vector<float>& host) {
  return cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
}

cudaError_t Download(std::vector<float>& host, const float* device) {
  return cudaMemcpy(host.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost);
}

// The launcher on device pointers at every misalignment of x and y, so both the float4 path and
// the scalar path run, and nothing outside [0, n) is written.
TEST_F(CudaGpuTest, LauncherHandlesAnyAlignmentAndStaysInBounds) {
  constexpr int64_t kN = 1001;
  constexpr int64_t kPad = 4;
  constexpr float kGuard = 12345.f;
  const std::vector<float> x = RandomVector(kN, 3), y0 = RandomVector(kN, 4);
  float* dx = nullptr;
  float* dy = nullptr;
  ASSERT_EQ(DeviceMalloc(&dx, kN + 2 * kPad), cudaSuccess);
  ASSERT_EQ(DeviceMalloc(&dy, kN + 2 * kPad), cudaSuccess);
  for (int x_off = 0; x_off < 4; ++x_off) {
    for (int y_off = 0; y_off < 4; ++y_off) {
      const std::string where =
          "x_off=" + std::to_string(x_off) + " y_off=" + std::to_string(y_off);
      const int64_t y_begin = kPad + y_off;
      std::vector<float> y_full(kN + 2 * kPad, kGuard);
      std::copy(y0.begin(), y0.end(), y_full.begin() + y_begin);
      ASSERT_EQ(Upload(dx + kPad + x_off, x), cudaSuccess);
      ASSERT_EQ(Upload(dy, y_full), cudaSuccess);
      ASSERT_EQ(LaunchAxpbyF32(1.5f, dx + kPad + x_off, -2.f, dy + y_begin, kN, nullptr),
                cudaSuccess) << where;
      ASSERT_EQ(Download(y_full, dy), cudaSuccess) << where;
      const std::vector<float> y(y_full.begin() + y_begin, y_full.begin() + y_begin + kN);
      ExpectAxpby(1.5f, x, -2.f, y0, y, where);
      for (int64_t i = 0; i < int64_t(y_full.size()); ++i) {
        if (i < y_begin || i >= y_begin + kN) {
          ASSERT_EQ(y_full[i], kGuard) << where << " guard at " << i;
        }
      }
    }
  }
  cudaFree(dx);
  cudaFree(dy);
}

// x == y is allowed: y = (a + b) * y.
TEST_F(CudaGpuTest, LauncherAllowsXEqualToY) {
  const std::vector<float> y0 = RandomVector(37, 5);
  float* d = nullptr;
  ASSERT_EQ(DeviceMalloc(&d, y0.size()), cudaSuccess);
  ASSERT_EQ(Upload(d, y0), cudaSuccess);
  ASSERT_EQ(LaunchAxpbyF32(2.f, d, 0.5f, d, int64_t(y0.size()), nullptr), cudaSuccess);
  std::vector<float> y(y0.size());
  ASSERT_EQ(Download(y, d), cudaSuccess);
  cudaFree(d);
  ExpectAxpby(2.f, y0, 0.5f, y0, y, "x == y");
}

}  // namespace
}  // namespace braid::cuda
