#include "launcher/device_binding.h"

#include <cctype>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace braid::launcher {
namespace {

// An entry CUDA accepts: an index ("3") or a UUID ("GPU-...", "MIG-...").
bool NamesADevice(absl::string_view e) {
  if (e.empty()) return false;
  if (absl::StartsWith(e, "GPU-") || absl::StartsWith(e, "MIG-")) return true;
  for (char c : e) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

std::optional<std::vector<std::string>> VisibleCudaDevices(
    const std::map<std::string, std::string>& env) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it == env.end()) return std::nullopt;
  std::vector<std::string> out;
  for (absl::string_view e : absl::StrSplit(it->second, ',')) {
    e = absl::StripAsciiWhitespace(e);
    if (!NamesADevice(e)) break;
    out.emplace_back(e);
  }
  return out;
}

absl::StatusOr<CudaBinding> BindCudaDevice(int configured,
                                           const std::map<std::string, std::string>& env) {
  int local = 0;
  std::string local_name;
  for (const char* v : {"LOCAL_RANK", "SLURM_LOCALID"}) {
    auto it = env.find(v);
    if (it == env.end()) continue;
    if (!absl::SimpleAtoi(it->second, &local) || local < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(v, "='", it->second, "' is not a local rank (a number >= 0)"));
    }
    local_name = absl::StrCat(v, "=", local);
    break;
  }
  std::optional<std::vector<std::string>> visible = VisibleCudaDevices(env);
  CudaBinding b;
  if (!visible) {
    b.index = configured + local;
    b.why = local_name.empty()
                ? absl::StrCat("cuda:", configured, " as configured")
                : absl::StrCat("cuda:", configured, " + ", local_name, " (every GPU visible)");
    return b;
  }
  const std::string shown = absl::StrCat("CUDA_VISIBLE_DEVICES='", env.at("CUDA_VISIBLE_DEVICES"), "'");
  const int n = static_cast<int>(visible->size());
  if (n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        shown, " shows this worker no GPU; give the job GPUs (srun --gpus-per-task=1, "
        "nvidia.com/gpu in the pod), unset the variable, or use device: \"cpu\""));
  }
  if (n == 1) {
    // The scheduler gave this task its own GPU: whatever the local rank, it is cuda:0.
    if (configured != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device cuda:", configured, ", but ", shown, " shows this worker one GPU, cuda:0; "
          "use device: \"cuda\" (or cuda:0)"));
    }
    b.index = 0;
    b.why = absl::StrCat("the one GPU ", shown, " shows");
    return b;
  }
  b.index = configured + local;
  if (b.index >= n) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", configured, local_name.empty() ? "" : absl::StrCat(" + ", local_name), " is cuda:",
        b.index, ", but ", shown, " shows ", n, " GPUs (cuda:0..cuda:", n - 1,
        "); run at most ", n - configured, " workers per node, or give each task its own GPU "
        "(srun --gpus-per-task=1)"));
  }
  b.why = absl::StrCat("cuda:", configured, " + ", local_name.empty() ? "local rank 0" : local_name,
                       " of the ", n, " GPUs ", shown, " shows");
  return b;
}

absl::StatusOr<CudaBinding> BindCudaDeviceFromEnvironment(int configured) {
  std::map<std::string, std::string> env;
  for (const char* v : {"CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* x = std::getenv(v)) env[v] = x;
  }
  return BindCudaDevice(configured, env);
}

absl::StatusOr<int> CudaDeviceIndexFromEnvironment(int configured) {
  absl::StatusOr<CudaBinding> b = BindCudaDeviceFromEnvironment(configured);
  if (!b.ok()) return b.status();
  return b->index;
}

}  // namespace braid::launcher
