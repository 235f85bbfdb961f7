// Braid's dtypes and reductions as NCCL's (dtypes.h).
#include "backends/nccl/dtypes.h"

namespace braid::nccl::internal {

bool ToNcclType(DType t, ncclDataType_t* out) {
  switch (t) {
    case DType::kF32:
      *out = ncclFloat32;
      return true;
    case DType::kBF16:
      *out = ncclBfloat16;
      return true;
    case DType::kF16:
      *out = ncclFloat16;
      return true;
    case DType::kI32:
      *out = ncclInt32;
      return true;
    case DType::kI64:
      *out = ncclInt64;
      return true;
    case DType::kU8:
      *out = ncclUint8;
      return true;
    case DType::kI8:
      *out = ncclInt8;
      return true;
  }
  return false;
}

ncclRedOp_t ToNcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

}  // namespace braid::nccl::internal
