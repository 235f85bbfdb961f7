// The device's peak FLOP rate, the denominator of the MFU the training program reports.
// Internal to //launcher:trainer.
#ifndef BRAID_LAUNCHER_PEAK_FLOPS_H_
#define BRAID_LAUNCHER_PEAK_FLOPS_H_

#include "core/device.h"

namespace braid::launcher {

// On the CPU: the f32 matrix-product ceiling, measured now on the threads this process computes
// with: the fastest of 5 timed 1024 x 1024 x 1024 products (after one untimed) through Braid's
// CPU matmul, i.e. OpenBLAS's sgemm. About 0.1-0.2 s at 60-140 GFLOP/s. A machine busy with
// other work measures a lower ceiling (and so a higher MFU). 0 (unknown) elsewhere: no
// CUDA peak is measured yet.
double MeasurePeakFlops(Device device);

}  // namespace braid::launcher

#endif  // BRAID_LAUNCHER_PEAK_FLOPS_H_
