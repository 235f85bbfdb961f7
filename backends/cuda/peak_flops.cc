#include "backends/cuda/peak_flops.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace braid::cuda {
namespace {

// NVIDIA's datasheets, dense (no structured sparsity), per GPU.
struct Sku {
  const char* family;  // in the device's name
  const char* variant;  // also in the name ("" = the SXM part, tried last)
  double half, f32;     // FLOP/s: bf16/f16 tensor core, f32 CUDA cores
};
constexpr Sku kSkus[] = {
    {"H100", "PCIe", 756.5e12, 51.2e12},
    {"H100", "NVL", 835.5e12, 60.0e12},
    {"H100", "", 989.4e12, 66.9e12},  // SXM5 (the driver's name: "NVIDIA H100 80GB HBM3")
    {"H200", "NVL", 835.5e12, 60.0e12},
    {"H200", "", 989.4e12, 66.9e12},  // SXM5; GH200's GPU is the same die and clocks
};

// Dense FLOP per clock per SM, by compute capability: f32 FMA units x 2, tensor-core bf16/f16
// with f32 accumulation. From NVIDIA's architecture whitepapers (A100: 64 f32 units and 1024
// dense f16 FMA per SM per clock; GA10x/AD10x: 128 f32 units, 512 FMA; H100: 128, 2048).
struct Arch {
  int major, minor;
  double f32, half;
};
constexpr Arch kArchs[] = {
    {8, 0, 128, 2048},  // A100, A30
    {8, 6, 256, 1024},  // A10, A40, RTX 30xx (the data-centre parts' f32-accumulate rate)
    {8, 7, 128, 1024},  // Jetson Orin
    {8, 9, 256, 1024},  // L4, L40(S), RTX 40xx
    {9, 0, 256, 4096},  // H100, H200
};

}  // namespace

double PeakFlops(const GpuProperties& gpu, DType dtype, std::string* basis) {
  const bool half = dtype == DType::kBF16 || dtype == DType::kF16;
  const char* unit = half ? "dense bf16/f16 tensor-core" : "f32 CUDA-core";
  for (const Sku& s : kSkus) {
    if (absl::StrContains(gpu.name, s.family) && absl::StrContains(gpu.name, s.variant)) {
      if (basis != nullptr) {
        *basis = absl::StrCat(unit, " peak of the ", s.family, s.variant[0] ? " " : " SXM",
                              s.variant, " (NVIDIA's datasheet)");
      }
      return half ? s.half : s.f32;
    }
  }
  for (const Arch& a : kArchs) {
    if (a.major != gpu.major || a.minor != gpu.minor) continue;
    const double per_clock = half ? a.half : a.f32;
    if (basis != nullptr) {
      *basis = absl::StrFormat("%s peak: %d SMs x %.0f MHz x %.0f FLOP/clock/SM (sm_%d%d)", unit,
                               gpu.sm_count, gpu.clock_khz / 1e3, per_clock, a.major, a.minor);
    }
    return double(gpu.sm_count) * double(gpu.clock_khz) * 1e3 * per_clock;
  }
  if (basis != nullptr) {
    *basis = absl::StrCat("no FLOP rate known for ", gpu.name, " (sm_", gpu.major, gpu.minor,
                          "): MFU not shown; backends/cuda/peak_flops.cc lists the known ones");
  }
  return 0;
}

}  // namespace braid::cuda
