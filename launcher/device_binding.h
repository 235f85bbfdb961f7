// Which GPU a worker trains on. A worker of a node gets cuda:<N + LOCAL_RANK> when it sees every
// GPU of the node, but a scheduler that gives each task its own GPU (srun --gpus-per-task=1,
// Kubernetes' nvidia.com/gpu: 1) shows it that GPU alone, as cuda:0 — adding LOCAL_RANK there
// asks for a device that does not exist. The rule is here, apart from the trainer, so that each
// case is unit-tested without a GPU.
#ifndef BRAID_LAUNCHER_DEVICE_BINDING_H_
#define BRAID_LAUNCHER_DEVICE_BINDING_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace braid::launcher {

// The GPUs CUDA_VISIBLE_DEVICES lets this process see, in CUDA's order (they become cuda:0,
// cuda:1, ...); std::nullopt when it is unset (every GPU is visible). CUDA ignores everything
// from the first entry that names no device on, e.g. "-1" or Slurm's "NoDevFiles".
std::optional<std::vector<std::string>> VisibleCudaDevices(
    const std::map<std::string, std::string>& env);

struct CudaBinding {
  int index = 0;    // the N of cuda:N, counted among the visible GPUs
  std::string why;  // for the log: "LOCAL_RANK=1 of 4 visible GPUs", ...
};

// The device of a worker whose config asks for cuda:`configured`:
//   - CUDA_VISIBLE_DEVICES lists one GPU: that GPU, cuda:0 (`configured` must be 0);
//   - it lists several: cuda:<configured + local rank>, which must be one of them;
//   - it is unset: cuda:<configured + local rank> (the CUDA backend checks that it exists).
// The local rank is LOCAL_RANK (set by the launcher), else SLURM_LOCALID (a task started by
// srun without the launcher), else 0. An empty list, or too few GPUs, is an error that names
// the variables.
absl::StatusOr<CudaBinding> BindCudaDevice(int configured,
                                           const std::map<std::string, std::string>& env);

// The same with this process's environment.
absl::StatusOr<CudaBinding> BindCudaDeviceFromEnvironment(int configured);

// Just the index, for the trainer's one call:
//   BRAID_ASSIGN_OR_RETURN(device.index, launcher::CudaDeviceIndexFromEnvironment(device.index));
absl::StatusOr<int> CudaDeviceIndexFromEnvironment(int configured);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_DEVICE_BINDING_H_
