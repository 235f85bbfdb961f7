// The device's peak FLOP rate, the denominator of the MFU the training program reports.
// Internal to //launcher:trainer.
#ifndef BRAID_LAUNCHER_PEAK_FLOPS_H_
#define BRAID_LAUNCHER_PEAK_FLOPS_H_

#include <string>

#include "core/device.h"
#include "core/dtype.h"

namespace braid::launcher {

// On the CPU: the f32 matrix-product ceiling, measured now on the threads this process computes
// with: the fastest of 5 timed 1024 x 1024 x 1024 products (after one untimed) through Braid's
// CPU matmul, i.e. OpenBLAS's sgemm. About 0.1-0.2 s at 60-140 GFLOP/s. A machine busy with
// other work measures a lower ceiling (and so a higher MFU).
// On CUDA: the device's peak for products in `dtype` from its properties
// (backends/cuda/peak_flops.h: NVIDIA's datasheet for the H100/H200, SMs x clock x the
// architecture's rate otherwise); 0 (MFU not shown) for an architecture it does not know.
// `basis` (may be null) says which, for the log.
double MeasurePeakFlops(Device device, DType dtype = DType::kF32, std::string* basis = nullptr);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_PEAK_FLOPS_H_
