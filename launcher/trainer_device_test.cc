// What the training program answers for `device: "cuda"`, before it does anything else.
#include <gtest/gtest.h>

#include <string>

#include "launcher/trainer.h"

namespace braid::launcher {
namespace {

// cuda:4096 exists on no machine: the refusal, before anything else, is checked on every
// machine, with a GPU or without.
TEST(TrainerDevice, CudaSaysWhyItCannotTrainHere) {
  config::TrainConfig cfg;
  cfg.set_device("cuda:4096");
  absl::StatusOr<TrainResult> r = Train(cfg, TrainerEnv{});
  ASSERT_FALSE(r.ok());
#ifdef BRAID_TEST_CUDA_BUILD
  // --config=cuda: CUDA's reason without a usable GPU (Unavailable), or the devices there are
  // (InvalidArgument), after the device's name.
  EXPECT_TRUE(r.status().code() == absl::StatusCode::kUnavailable ||
              r.status().code() == absl::StatusCode::kInvalidArgument)
      << r.status();
  EXPECT_EQ(std::string(r.status().message()).rfind("device \"cuda:4096\": ", 0), 0u)
      << r.status();
#else
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "device \"cuda:4096\": this build has no CUDA backend: build with --config=cuda "
            "(needs the CUDA toolkit; see docs/GPU.md), or use device: \"cpu\"");
#endif
}

}  // namespace
}  // namespace braid::launcher
