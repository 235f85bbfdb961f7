// The plugin's building blocks, linked directly: the gloo::rendezvous::Store adapter and the
// reduction kernels.
#include <gloo/common/error.h>

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "backends/gloo/reduce_kernels.h"
#include "backends/gloo/store_adapter.h"
#include "core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::gloo_backend {
namespace {

using ::testing::HasSubstr;

TEST(GlooStoreAdapterTest, SetGetWaitUnderAPrefixWithBinaryValues) {
  InMemoryStore base;
  GlooStoreAdapter adapter(&base, "job/mesh", absl::Seconds(5));
  const std::vector<char> value = {'a', '\0', '\xff', 'b', '\0'};
  adapter.set("0", value);
  EXPECT_EQ(adapter.get("0"), value);
  // The key lives under the prefix in the braid store.
  absl::StatusOr<std::string> raw = base.Get("job/mesh/0", absl::ZeroDuration());
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*raw, std::string(value.begin(), value.end()));
  // wait returns once a key set by another thread appears.
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    adapter.set("1", {'x'});
  });
  adapter.wait({"0", "1"}, std::chrono::milliseconds(5000));
  setter.join();
  EXPECT_EQ(adapter.get("1"), std::vector<char>{'x'});
}

TEST(GlooStoreAdapterTest, TimeoutsThrowGlooIoExceptionsNamingTheKey) {
  InMemoryStore base;
  GlooStoreAdapter adapter(&base, "p", absl::Milliseconds(50));
  try {
    adapter.get("missing");
    FAIL() << "get of a missing key returned";
  } catch (const ::gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("p/missing"));
  }
  try {
    adapter.wait({"absent"}, std::chrono::milliseconds(20));
    FAIL() << "wait for a missing key returned";
  } catch (const ::gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("p/absent"));
  }
}

TEST(WaitInSlicesTest, SeesAKeyThatAppearsLaterAndNamesTheWholeWait) {
  InMemoryStore base;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(250));
    base.Set("late", "1").IgnoreError();
  });
  EXPECT_TRUE(WaitInSlices(&base, {"late"}, absl::Seconds(5)).ok());
  setter.join();
  absl::Time t0 = absl::Now();
  absl::Status s = WaitInSlices(&base, {"never"}, absl::Milliseconds(350));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(340));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("waited 350ms in all"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("never"));
}

template <typename T>
std::vector<T> Apply(DType t, ReduceOp op, const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> out(a.size());
  NativeReduceFn(t, op)(out.data(), a.data(), b.data(), a.size());
  return out;
}

TEST(ReduceKernelsTest, NativeReductionsMatchScalarLoops) {
  // Long enough for the vectorised body and a scalar tail.
  std::vector<float> a(37), b(37);
  std::vector<int64_t> ia(37), ib(37);
  for (int i = 0; i < 37; ++i) {
    a[i] = float((i * 7) % 11) - 5.5f;
    b[i] = float((i * 5) % 13) - 6.0f;
    ia[i] = (int64_t(1) << 50) + i * 3 - 40;
    ib[i] = (int64_t(1) << 52) - i * 5;
  }
  std::vector<float> sum = Apply(DType::kF32, ReduceOp::kSum, a, b);
  std::vector<float> mx = Apply(DType::kF32, ReduceOp::kMax, a, b);
  std::vector<float> mn = Apply(DType::kF32, ReduceOp::kMin, a, b);
  std::vector<int64_t> isum = Apply(DType::kI64, ReduceOp::kSum, ia, ib);
  for (int i = 0; i < 37; ++i) {
    EXPECT_EQ(sum[i], a[i] + b[i]);
    EXPECT_EQ(mx[i], std::max(a[i], b[i]));
    EXPECT_EQ(mn[i], std::min(a[i], b[i]));
    EXPECT_EQ(isum[i], ia[i] + ib[i]);
  }
  // Avg reduces with sum (the communicator divides afterwards).
  EXPECT_EQ(Apply(DType::kF32, ReduceOp::kAvg, a, b), sum);
  // u8 sums wrap.
  std::vector<uint8_t> u =
      Apply(DType::kU8, ReduceOp::kSum, std::vector<uint8_t>{200, 3}, std::vector<uint8_t>{100, 4});
  EXPECT_EQ(u, (std::vector<uint8_t>{44, 7}));
  std::vector<int8_t> i8 =
      Apply(DType::kI8, ReduceOp::kMin, std::vector<int8_t>{-3, 100}, std::vector<int8_t>{5, -128});
  EXPECT_EQ(i8, (std::vector<int8_t>{-3, -128}));
  EXPECT_EQ(NativeReduceFn(DType::kBF16, ReduceOp::kSum), nullptr);
  EXPECT_EQ(NativeReduceFn(DType::kF16, ReduceOp::kMax), nullptr);
}

TEST(ReduceKernelsTest, MaxAndMinPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> mx = Apply(DType::kF32, ReduceOp::kMax, std::vector<float>{nan, 1.0f},
                                std::vector<float>{2.0f, nan});
  std::vector<float> mn = Apply(DType::kF32, ReduceOp::kMin, std::vector<float>{nan, 1.0f},
                                std::vector<float>{2.0f, nan});
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]));
  EXPECT_TRUE(std::isnan(mn[0]) && std::isnan(mn[1]));
}

TEST(ReduceKernelsTest, ConversionsRoundTripAndMatchCoresScalarOnes) {
  // Every bf16 and f16 bit pattern.
  std::vector<uint16_t> all(65536), back(65536);
  for (int i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  std::vector<float> f(65536);
  for (DType t : {DType::kBF16, DType::kF16}) {
    UpcastToF32(t, all.data(), f.data(), all.size());
    DowncastFromF32(t, f.data(), back.data(), f.size());
    for (int i = 0; i < 65536; ++i) {
      float want = t == DType::kBF16 ? BF16ToFloat(all[i]) : F16ToFloat(all[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(f[i]));
        continue;
      }
      ASSERT_EQ(f[i], want) << DTypeName(t) << " pattern " << i;
      ASSERT_EQ(back[i], all[i]) << DTypeName(t) << " pattern " << i;
    }
  }
  // Rounding of values between representable ones agrees with core's conversions.
  std::vector<float> odd;
  for (int i = 0; i < 10000; ++i) odd.push_back(float(i) * 1.37e-3f - 6.5f + float(i % 7) * 1e-7f);
  std::vector<uint16_t> h(odd.size());
  DowncastFromF32(DType::kBF16, odd.data(), h.data(), odd.size());
  for (size_t i = 0; i < odd.size(); ++i) ASSERT_EQ(h[i], FloatToBF16(odd[i])) << odd[i];
  DowncastFromF32(DType::kF16, odd.data(), h.data(), odd.size());
  for (size_t i = 0; i < odd.size(); ++i) ASSERT_EQ(h[i], FloatToF16(odd[i])) << odd[i];
}

TEST(ReduceKernelsTest, DivideIsADivision) {
  std::vector<float> x = {1.0f, 2.0f, 10.0f};
  DivideInPlace(x.data(), x.size(), 3.0f);
  EXPECT_EQ(x, (std::vector<float>{1.0f / 3.0f, 2.0f / 3.0f, 10.0f / 3.0f}));
}

}  // namespace
}  // namespace braid::gloo_backend
