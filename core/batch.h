// Batch: one micro-batch of training data, the unit a data source yields and a strategy's step
// consumes. Apart from strategy.h so that data code (models/data, the training program's batch
// sources) needs no strategy interface to name it.
#ifndef BRAID_CORE_BATCH_H_
#define BRAID_CORE_BATCH_H_

#include "core/tensor.h"

namespace braid {

struct Batch {
  Tensor inputs;
  Tensor targets;
};

}  // namespace braid

#endif  // BRAID_CORE_BATCH_H_
