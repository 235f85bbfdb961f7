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

}  // namespace braid::cuda
