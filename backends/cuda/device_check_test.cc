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

}  // namespace
}  // namespace braid::cuda
