// Copies between host memory and a device that the host does not wait for.
//
// Why: on a GPU a copy the host waits for (Tensor::CopyFrom with the host on one side) stops the
// host from enqueueing the next kernels while the device drains, and the device then idles until
// the host catches up (docs/GPU.md, "Synchronisation points"). Offloaded state (ZeRO-Offload's
// gradients and parameters, ZeRO-Infinity's parameter shards, cpu_checkpointing's kept inputs)
// moves every step, so its copies are enqueued here and ordered on the device by events; the
// host learns they are done from a synchronisation it makes anyway (the step's one read) or by
// asking (Done), never by blocking per copy.
//
// A backend registers the implementation for its device type (CUDA: backends/cuda/async_copy.h);
// where neither side is on such a device (a CPU run) the copy is made at once and is done.
#ifndef BRAID_CORE_ASYNC_COPY_H_
#define BRAID_CORE_ASYNC_COPY_H_

#include <functional>
#include <memory>

#include "core/device.h"
#include "core/tensor.h"

namespace braid {

// Which of the device's queues runs a copy.
enum class CopyQueue {
  // The device's current stream (the compute stream): in order with the kernels around it, so
  // work enqueued after it sees its result, and a later host synchronisation of that stream (a
  // step's one read, core/scalar_reads.h) covers it.
  kCompute,
  // The device's copy stream: the copy first waits (on the device) for everything the current
  // stream has enqueued so far, then runs beside the work enqueued after it, until
  // OrderBeforeCurrentStream makes the current stream wait for it. How a copy is issued ahead of
  // its use.
  kCopy,
};

// A copy the device may not have made yet.
class InFlightCopy {
 public:
  virtual ~InFlightCopy() = default;
  // Work enqueued on the device's current stream from now on runs after the copy: the stream
  // waits for the copy's event, the host does not. A no-op where the copy is already ordered
  // so (kCompute) or done.
  virtual void OrderBeforeCurrentStream() = 0;
  // Whether the device has made the copy; asks without waiting.
  virtual bool Done() = 0;
  // Blocks the host until the device has made it: for a writer of the host side outside the
  // training step (loading a checkpoint into offloaded state), never per step.
  virtual void Wait() = 0;
};

// Enqueues dst <- src: the same numel and dtype, one side on a device, the other in host memory
// (any CPU device, pinned included). Until the copy is done (Done(), or a host synchronisation
// of a stream ordered after it) the caller keeps both tensors' memory alive, does not write the
// source and does not read the destination on the host. From page-locked memory
// (core/pinned_host.h) the device copies by DMA while the host goes on; from pageable memory
// the driver may stage it first. Fails fast on tensors that break these rules.
std::unique_ptr<InFlightCopy> CopyAsync(const Tensor& src, const Tensor& dst, CopyQueue queue);

// For backends: how copies to and from devices of `type` are enqueued.
using AsyncCopyFn =
    std::function<std::unique_ptr<InFlightCopy>(const Tensor& src, const Tensor& dst, CopyQueue queue)>;
void RegisterAsyncCopy(DeviceType type, AsyncCopyFn fn);

}  // namespace braid

#endif  // BRAID_CORE_ASYNC_COPY_H_
