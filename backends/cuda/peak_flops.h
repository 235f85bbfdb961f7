// The peak FLOP rate of a CUDA device, the denominator of the MFU the training program reports,
// from the device's properties alone (no GPU needed to compute it, so it is tested anywhere).
//
// Two sources, in this order:
//  1. NVIDIA's datasheet figures for the H100 and H200 (SXM, PCIe, NVL; matched by the name the
//     driver reports): dense tensor-core bf16/f16 and plain f32. Their clocks differ between
//     the two kinds of unit (the SXM parts' 989.4 TFLOP/s bf16 assume 1.83 GHz, their 66.9
//     TFLOP/s f32 1.98 GHz), so the product below would overstate the tensor figure by 8%.
//  2. Otherwise SMs x clock (the maximum the driver reports) x dense FLOP per clock per SM of
//     the architecture (compute capability) for the dtype: f32 on the CUDA cores (Braid's
//     cuBLASLt products compute in full f32, not TF32), bf16/f16 on the tensor cores.
// An architecture the table does not know gets 0 (the MFU is then not shown) and `basis` says
// why, rather than a figure from another generation.
#ifndef BRAID_BACKENDS_CUDA_PEAK_FLOPS_H_
#define BRAID_BACKENDS_CUDA_PEAK_FLOPS_H_

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace braid::cuda {

// The device as the driver describes it (cudaGetDeviceProperties, cudaDevAttrClockRate).
struct GpuProperties {
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;  // compute capability
  int sm_count = 0;
  int64_t clock_khz = 0;  // the SMs' maximum clock
};

// FLOP/s for products in `dtype` (kF32, kBF16 or kF16); `basis` (may be null) says where the
// figure comes from, for the training log.
double PeakFlops(const GpuProperties& gpu, DType dtype, std::string* basis);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_PEAK_FLOPS_H_
