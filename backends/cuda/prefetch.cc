#include "backends/cuda/prefetch.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace braid::cuda {

absl::StatusOr<std::unique_ptr<BatchPrefetcher>> BatchPrefetcher::Create(DeviceRuntime* runtime,
                                                                          BatchProducer produce) {
  BRAID_ASSIGN_OR_RETURN(Event allocated, runtime->api().CreateEvent());
  BRAID_ASSIGN_OR_RETURN(Event copied, runtime->api().CreateEvent());
  return std::unique_ptr<BatchPrefetcher>(
      new BatchPrefetcher(runtime, std::move(produce), allocated, copied));
}

BatchPrefetcher::BatchPrefetcher(DeviceRuntime* runtime, BatchProducer produce, Event allocated,
                                 Event copied)
    : rt_(runtime), produce_(std::move(produce)), allocated_(allocated), copied_(copied) {}

BatchPrefetcher::~BatchPrefetcher() {
  // A batch still being copied is freed on the compute stream, which must not hand its memory
  // out again before the copy is done: order the free after the copy.
  if (in_flight_) (void)rt_->api().StreamWaitEvent(rt_->compute_stream(), copied_);
  in_flight_.reset();
  (void)rt_->api().DestroyEvent(allocated_);
  (void)rt_->api().DestroyEvent(copied_);
}

absl::Status BatchPrefetcher::Stage(std::vector<Tensor> host) {
  DeviceApi& api = rt_->api();
  const Stream compute = rt_->compute_stream(), copy = rt_->copy_stream();
  std::vector<Tensor> dev;
  std::vector<void*> pinned;
  {
    CurrentStreamGuard on_compute(*rt_, compute);  // rule 1: the memory belongs to compute
    for (const Tensor& t : host) {
      if (t.device().type != DeviceType::kCPU) {
        return absl::InvalidArgumentError(absl::StrCat(
            "BatchPrefetcher: the producer returned ", t.DescribeForError(),
            "; it must return host (cpu) tensors"));
      }
      dev.push_back(Tensor::Empty(t.shape(), t.dtype(), rt_->device()));
    }
  }
  BRAID_RETURN_IF_ERROR(api.RecordEvent(allocated_, compute));
  BRAID_RETURN_IF_ERROR(api.StreamWaitEvent(copy, allocated_));
  for (size_t i = 0; i < host.size(); ++i) {
    const size_t n = host[i].nbytes();
    if (n == 0) continue;
    BRAID_ASSIGN_OR_RETURN(void* p, rt_->pinned().Allocate(n));
    std::memcpy(p, host[i].raw_data(), n);
    pinned.push_back(p);
    BRAID_RETURN_IF_ERROR(
        api.MemcpyAsync(dev[i].raw_data(), p, n, CopyKind::kHostToDevice, copy));
  }
  BRAID_RETURN_IF_ERROR(api.RecordEvent(copied_, copy));
  for (void* p : pinned) BRAID_RETURN_IF_ERROR(rt_->pinned().Free(p, copy));  // rule 3
  in_flight_ = std::move(dev);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::vector<Tensor>>> BatchPrefetcher::Next() {
  if (!started_) {
    started_ = true;
    std::optional<std::vector<Tensor>> first = produce_();
    if (first) BRAID_RETURN_IF_ERROR(Stage(*std::move(first)));
  }
  if (!in_flight_) return std::optional<std::vector<Tensor>>();
  // Rule 2: compute work enqueued from here on sees the batch.
  BRAID_RETURN_IF_ERROR(rt_->api().StreamWaitEvent(rt_->compute_stream(), copied_));
  std::optional<std::vector<Tensor>> ready = std::move(in_flight_);
  in_flight_.reset();
  std::optional<std::vector<Tensor>> next = produce_();
  if (next) BRAID_RETURN_IF_ERROR(Stage(*std::move(next)));
  return ready;
}

}  // namespace braid::cuda
