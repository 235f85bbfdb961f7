// The answer the training program gets for a CUDA device, in whichever build this is.
#include "backends/cuda/device_check.h"

#include <gtest/gtest.h>

namespace braid::cuda {
namespace {

TEST(PrepareCudaDevice, SaysWhyTheDeviceCannotBeUsed) {
  absl::Status st = PrepareCudaDevice(Device::CUDA(1));
#ifdef BRAID_TEST_CUDA_BUILD
  // --config=cuda: OK on a machine with two GPUs; otherwise CUDA's reason, naming the device.
  if (st.ok()) GTEST_SKIP() << "cuda:1 is usable here; the refusal path is not taken";
  EXPECT_EQ(std::string(st.message()).rfind("device \"cuda:1\": ", 0), 0u) << st;
#else
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "device \"cuda:1\": this build has no CUDA backend: build with --config=cuda (needs "
            "the CUDA toolkit; see docs/GPU.md), or use device: \"cpu\"");
#endif
}

}  // namespace
}  // namespace braid::cuda
