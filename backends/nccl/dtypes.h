// Braid's dtypes and reductions as NCCL's enums: the one place that decides which tensors the
// NCCL communicator can move, kept apart so that adding a type touches nothing else.
#ifndef BRAID_BACKENDS_NCCL_DTYPES_H_
#define BRAID_BACKENDS_NCCL_DTYPES_H_

#include <nccl.h>

#include "core/communicator.h"
#include "core/dtype.h"

namespace braid::nccl::internal {

// False when NCCL has no type for `t`.
bool ToNcclType(DType t, ncclDataType_t* out);

ncclRedOp_t ToNcclOp(ReduceOp op);

}  // namespace braid::nccl::internal

#endif  // BRAID_BACKENDS_NCCL_DTYPES_H_
