// Asynchronous prefetch of the next batch to a CUDA device: batch k+1 is copied on the copy
// stream while step k runs on the compute stream.
//
// Each batch (host tensors from the producer) is staged into pinned buffers (pinned_pool.h) and
// copied into device tensors on the device's copy stream. The ordering, which the tests check
// against the fake device:
//   1. The device tensors are allocated on the compute stream (they are used, and freed, there),
//      and the copy stream waits for an event recorded on the compute stream right then: the
//      memory may have been freed by compute work still queued, which must finish before the
//      copy writes it. That work is step k-1's, so the copy still overlaps step k.
//   2. Next() makes the compute stream wait for the batch's "copied" event before returning
//      it: everything enqueued on the compute stream afterwards sees the batch; the host never
//      blocks.
//   3. A pinned buffer is reused only after the copy from it has completed (its pool's events).
// Next() hands out batch k, then asks the producer for batch k+1 and enqueues its copy, which
// is the step-k overlap. Use from one thread.
#ifndef BRAID_BACKENDS_CUDA_PREFETCH_H_
#define BRAID_BACKENDS_CUDA_PREFETCH_H_

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/cuda/runtime.h"
#include "core/tensor.h"

namespace braid::cuda {

// Returns the next batch's host tensors, or nullopt at the end of the data.
using BatchProducer = std::function<std::optional<std::vector<Tensor>>()>;

class BatchPrefetcher {
 public:
  static absl::StatusOr<std::unique_ptr<BatchPrefetcher>> Create(DeviceRuntime* runtime,
                                                                 BatchProducer produce);
  ~BatchPrefetcher();

  // Batch k on the device, ready for work enqueued on the compute stream from now on; nullopt
  // once the producer is done.
  absl::StatusOr<std::optional<std::vector<Tensor>>> Next();

 private:
  BatchPrefetcher(DeviceRuntime* runtime, BatchProducer produce, Event allocated, Event copied);
  absl::Status Stage(std::vector<Tensor> host);

  DeviceRuntime* const rt_;
  BatchProducer produce_;
  Event allocated_, copied_;  // reused: a wait takes the record current when it is enqueued
  bool started_ = false;
  std::optional<std::vector<Tensor>> in_flight_;  // staged, copy enqueued
};

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_PREFETCH_H_
