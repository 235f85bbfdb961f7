// The answer the training program gets for a CUDA device, in whichever build this is.
#include "backends/cuda/device_check.h"

#include <gtest/gtest.h>

namespace braid::cuda {
namespace {

// cuda:4096 exists on no machine, so the refusal is what every machine checks: a GPU or none.
TEST(PrepareCudaDevice, SaysWhyTheDeviceCannotBeUsed) {
  absl::Status st = PrepareCudaDevice(Device::CUDA(4096));
#ifdef BRAID_TEST_CUDA_BUILD
  // --config=cuda: CUDA's reason without a usable GPU (Unavailable), or the devices there are
  // (InvalidArgument), after the device's name.
  EXPECT_TRUE(st.code() == absl::StatusCode::kUnavailable ||
              st.code() == absl::StatusCode::kInvalidArgument)
      << st;
  EXPECT_EQ(std::string(st.message()).rfind("device \"cuda:4096\": ", 0), 0u) << st;
#else
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "device \"cuda:4096\": this build has no CUDA backend: build with --config=cuda "
            "(needs the CUDA toolkit; see docs/GPU.md), or use device: \"cpu\"");
#endif
}

// "auto" fp16/bf16 follows the capability: bf16 from Ampere (8.0), f16 on every GPU CUDA 13 runs.
TEST(HalfSupport, FollowsTheComputeCapability) {
  const struct {
    int major, minor;
    bool bf16, f16;
  } cases[] = {{7, 5, false, true}, {8, 0, true, true}, {8, 6, true, true}, {9, 0, true, true},
               {5, 2, false, false}, {5, 3, false, true}};
  for (const auto& c : cases) {
    const HalfSupport s = HalfSupportOfCapability(c.major, c.minor);
    EXPECT_EQ(s.bf16, c.bf16) << c.major << "." << c.minor;
    EXPECT_EQ(s.f16, c.f16) << c.major << "." << c.minor;
  }
  // A device that cannot be used has no answer, only PrepareCudaDevice's reason.
  std::string basis;
  absl::StatusOr<HalfSupport> none = DeviceHalfSupport(Device::CUDA(4096), &basis);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status(), PrepareCudaDevice(Device::CUDA(4096)));
}

}  // namespace
}  // namespace braid::cuda
