#include "launcher/device_binding.h"

#include <stdlib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace braid::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Env = std::map<std::string, std::string>;

// The device index, or the error's message.
std::string Bind(int configured, const Env& env) {
  absl::StatusOr<CudaBinding> b = BindCudaDevice(configured, env);
  return b.ok() ? absl::StrCat("cuda:", b->index) : std::string(b.status().message());
}

TEST(VisibleCudaDevices, Forms) {
  EXPECT_FALSE(VisibleCudaDevices({}).has_value());
  EXPECT_THAT(*VisibleCudaDevices({{"CUDA_VISIBLE_DEVICES", "3"}}), ElementsAre("3"));
  EXPECT_THAT(*VisibleCudaDevices({{"CUDA_VISIBLE_DEVICES", "0, 1,2"}}), ElementsAre("0", "1", "2"));
  EXPECT_THAT(*VisibleCudaDevices({{"CUDA_VISIBLE_DEVICES", "GPU-8a1b,MIG-77"}}),
              ElementsAre("GPU-8a1b", "MIG-77"));
  // CUDA stops at the first entry that names no device.
  EXPECT_THAT(*VisibleCudaDevices({{"CUDA_VISIBLE_DEVICES", "0,-1,2"}}), ElementsAre("0"));
  EXPECT_TRUE(VisibleCudaDevices({{"CUDA_VISIBLE_DEVICES", ""}})->empty());
  EXPECT_TRUE(VisibleCudaDevices({{"CUDA_VISIBLE_DEVICES", "NoDevFiles"}})->empty());
}

// No CUDA_VISIBLE_DEVICES: every GPU of the node is visible, the launcher's worker r takes r.
TEST(BindCudaDevice, UnsetAddsTheLocalRank) {
  EXPECT_EQ(Bind(0, {}), "cuda:0");
  EXPECT_EQ(Bind(0, {{"LOCAL_RANK", "3"}}), "cuda:3");
  EXPECT_EQ(Bind(2, {{"LOCAL_RANK", "1"}}), "cuda:3");
  // A task started by srun without the launcher: SLURM_LOCALID is its local rank.
  EXPECT_EQ(Bind(0, {{"SLURM_LOCALID", "2"}}), "cuda:2");
  // Under the launcher LOCAL_RANK wins: a launcher per node (SLURM_LOCALID=0) fans out ranks.
  EXPECT_EQ(Bind(0, {{"LOCAL_RANK", "1"}, {"SLURM_LOCALID", "0"}}), "cuda:1");
}

// srun --gpus-per-task=1 (or a pod with nvidia.com/gpu: 1): the task's one GPU is cuda:0,
// whatever its local rank -- the bug this rule fixes.
TEST(BindCudaDevice, OneVisibleGpuIsAlwaysCudaZero) {
  EXPECT_EQ(Bind(0, {{"CUDA_VISIBLE_DEVICES", "3"}, {"LOCAL_RANK", "3"}, {"SLURM_LOCALID", "3"}}),
            "cuda:0");
  EXPECT_EQ(Bind(0, {{"CUDA_VISIBLE_DEVICES", "0"}, {"SLURM_LOCALID", "1"}}), "cuda:0");
  EXPECT_THAT(Bind(1, {{"CUDA_VISIBLE_DEVICES", "5"}}),
              HasSubstr("device cuda:1, but CUDA_VISIBLE_DEVICES='5' shows this worker one GPU"));
}

// Several visible (srun --gpus-per-node=4 and 4 tasks, or the launcher's fan-out): offset by the
// local rank, within the list.
TEST(BindCudaDevice, SeveralVisibleOffsetByLocalRank) {
  Env env = {{"CUDA_VISIBLE_DEVICES", "4,5,6,7"}, {"LOCAL_RANK", "2"}};
  EXPECT_EQ(Bind(0, env), "cuda:2");
  env["LOCAL_RANK"] = "0";
  EXPECT_EQ(Bind(0, env), "cuda:0");
  env = {{"CUDA_VISIBLE_DEVICES", "0,1"}, {"SLURM_LOCALID", "1"}};
  EXPECT_EQ(Bind(0, env), "cuda:1");
  env = {{"CUDA_VISIBLE_DEVICES", "0,1"}, {"LOCAL_RANK", "2"}};
  EXPECT_EQ(Bind(0, env),
            "cuda:0 + LOCAL_RANK=2 is cuda:2, but CUDA_VISIBLE_DEVICES='0,1' shows 2 GPUs "
            "(cuda:0..cuda:1); run at most 2 workers per node, or give each task its own GPU "
            "(srun --gpus-per-task=1)");
  EXPECT_THAT(Bind(1, {{"CUDA_VISIBLE_DEVICES", "0,1"}, {"LOCAL_RANK", "1"}}),
              HasSubstr("cuda:1 + LOCAL_RANK=1 is cuda:2"));
}

TEST(BindCudaDevice, NoVisibleGpuOrBadLocalRankIsAnError) {
  EXPECT_THAT(Bind(0, {{"CUDA_VISIBLE_DEVICES", ""}}),
              HasSubstr("CUDA_VISIBLE_DEVICES='' shows this worker no GPU"));
  EXPECT_THAT(Bind(0, {{"CUDA_VISIBLE_DEVICES", "NoDevFiles"}}), HasSubstr("no GPU"));
  EXPECT_EQ(Bind(0, {{"LOCAL_RANK", "x"}}), "LOCAL_RANK='x' is not a local rank (a number >= 0)");
}

TEST(BindCudaDevice, SaysWhy) {
  auto b = BindCudaDevice(0, {{"CUDA_VISIBLE_DEVICES", "2,3"}, {"LOCAL_RANK", "1"}});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->why, "cuda:0 + LOCAL_RANK=1 of the 2 GPUs CUDA_VISIBLE_DEVICES='2,3' shows");
}

// The trainer's entry point reads this process's environment.
TEST(BindCudaDevice, FromTheEnvironment) {
  ::setenv("CUDA_VISIBLE_DEVICES", "7", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  EXPECT_EQ(*CudaDeviceIndexFromEnvironment(0), 0);
  ::setenv("CUDA_VISIBLE_DEVICES", "6,7", 1);
  EXPECT_EQ(*CudaDeviceIndexFromEnvironment(0), 1);
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  ::setenv("LOCAL_RANK", "2", 1);
  EXPECT_EQ(*CudaDeviceIndexFromEnvironment(1), 3);
  ::unsetenv("LOCAL_RANK");
  ::setenv("SLURM_LOCALID", "x", 1);
  EXPECT_FALSE(CudaDeviceIndexFromEnvironment(0).ok());
  ::unsetenv("SLURM_LOCALID");
}

}  // namespace
}  // namespace braid::launcher
