#include "backends/cuda/device_api.h"

namespace braid::cuda {

const char* CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice: return "H2D";
    case CopyKind::kDeviceToHost: return "D2H";
    case CopyKind::kDeviceToDevice: return "D2D";
  }
  return "?";
}

const char* FloatFormatName(FloatFormat f) {
  switch (f) {
    case FloatFormat::kF32: return "f32";
    case FloatFormat::kBF16: return "bf16";
    case FloatFormat::kF16: return "f16";
  }
  return "?";
}

}  // namespace braid::cuda
