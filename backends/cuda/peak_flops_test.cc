// The MFU's denominator from given device properties: no GPU needed.
#include "backends/cuda/peak_flops.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::cuda {
namespace {

using ::testing::HasSubstr;

// What the driver reports for an H100 SXM: 132 SMs at 1980 MHz, sm_90.
GpuProperties H100Sxm() { return {"NVIDIA H100 80GB HBM3", 9, 0, 132, 1980000}; }

TEST(PeakFlopsTest, H100AndH200TakeTheDatasheet) {
  std::string basis;
  EXPECT_DOUBLE_EQ(PeakFlops(H100Sxm(), DType::kBF16, &basis), 989.4e12);
  EXPECT_THAT(basis, HasSubstr("dense bf16/f16 tensor-core peak of the H100 SXM"));
  EXPECT_DOUBLE_EQ(PeakFlops(H100Sxm(), DType::kF16, nullptr), 989.4e12);
  EXPECT_DOUBLE_EQ(PeakFlops(H100Sxm(), DType::kF32, &basis), 66.9e12);
  EXPECT_THAT(basis, HasSubstr("f32 CUDA-core peak of the H100 SXM"));
  EXPECT_DOUBLE_EQ(PeakFlops({"NVIDIA H100 PCIe", 9, 0, 114, 1755000}, DType::kBF16, &basis), 756.5e12);
  EXPECT_THAT(basis, HasSubstr("H100 PCIe"));
  EXPECT_DOUBLE_EQ(PeakFlops({"NVIDIA H100 NVL", 9, 0, 132, 1785000}, DType::kBF16, nullptr), 835.5e12);
  EXPECT_DOUBLE_EQ(PeakFlops({"NVIDIA H200", 9, 0, 132, 1980000}, DType::kBF16, &basis), 989.4e12);
  EXPECT_THAT(basis, HasSubstr("H200 SXM"));
  EXPECT_DOUBLE_EQ(PeakFlops({"NVIDIA H200 NVL", 9, 0, 132, 1785000}, DType::kF32, nullptr), 60.0e12);
}

// Other devices: SMs x clock x the architecture's FLOP per clock per SM. The A100's reported
// clock is the one its datasheet uses, so the product gives its datasheet figures back.
TEST(PeakFlopsTest, OtherDevicesFromSmsClockAndArchitecture) {
  const GpuProperties a100{"NVIDIA A100-SXM4-80GB", 8, 0, 108, 1410000};
  std::string basis;
  EXPECT_NEAR(PeakFlops(a100, DType::kBF16, &basis), 312e12, 0.5e12);
  EXPECT_EQ(basis, "dense bf16/f16 tensor-core peak: 108 SMs x 1410 MHz x 2048 FLOP/clock/SM (sm_80)");
  EXPECT_NEAR(PeakFlops(a100, DType::kF32, nullptr), 19.5e12, 0.05e12);
  const GpuProperties l4{"NVIDIA L4", 8, 9, 58, 2040000};
  EXPECT_NEAR(PeakFlops(l4, DType::kBF16, nullptr), 121e12, 1e12);
  // An unlisted sm_90 part is computed, not matched by name.
  EXPECT_DOUBLE_EQ(PeakFlops({"NVIDIA Hopper engineering sample", 9, 0, 100, 1000000}, DType::kBF16, nullptr),
                   100 * 1e9 * 4096);
}

TEST(PeakFlopsTest, AnUnknownArchitectureShowsNoMfu) {
  std::string basis;
  EXPECT_EQ(PeakFlops({"NVIDIA Future GPU", 12, 0, 200, 2000000}, DType::kBF16, &basis), 0.0);
  EXPECT_THAT(basis, HasSubstr("no FLOP rate known for NVIDIA Future GPU (sm_120): MFU not shown"));
}

}  // namespace
}  // namespace braid::cuda
