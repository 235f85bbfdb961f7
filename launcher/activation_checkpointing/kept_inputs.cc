#include "launcher/activation_checkpointing/kept_inputs.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/pinned_host.h"

namespace braid {

KeptInputs::Kept::~Kept() {
  if (store_ == nullptr) return;
  store_->held_ -= bytes_;
  if (host_buffer_.defined()) store_->GiveHostBuffer(std::move(host_buffer_));
}

Tensor KeptInputs::TakeHostBuffer(int64_t numel, DType dtype, Device device) {
  {
    std::lock_guard<std::mutex> lock(spares_mu_);
    for (size_t i = 0; i < spares_.size(); ++i) {
      if (spares_[i].numel() != numel || spares_[i].dtype() != dtype) continue;
      Tensor t = std::move(spares_[i]);
      spares_.erase(spares_.begin() + long(i));
      return t;
    }
  }
  // Page-locked where the backend has it, so the copies are the device's DMA.
  return Tensor::Empty({numel}, dtype, OffloadHost(device, /*pin=*/true));
}

void KeptInputs::GiveHostBuffer(Tensor buffer) {
  std::lock_guard<std::mutex> lock(spares_mu_);
  spares_.push_back(std::move(buffer));
}

KeptInputs::KeptInputs(Options options) : options_(options) {}

void KeptInputs::Count(int64_t bytes) {
  const int64_t now = held_ += bytes;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

std::shared_ptr<KeptInputs::Kept> KeptInputs::Keep(const Tensor& input) {
  std::shared_ptr<Kept> kept(new Kept());
  kept->store_ = this;
  kept->shape_ = input.shape();
  kept->device_ = input.device();
  Tensor part = input;
  const int64_t n = input.numel();
  if (partitioned() && n > 0) {
    // Block r of the flat tensor: n / t elements, one more for the first n % t ranks.
    Communicator& group = *options_.partition_group;
    const int t = group.size();
    int64_t offset = 0;
    for (int r = 0; r < t; ++r) {
      const int64_t count = n / t + (r < n % t ? 1 : 0);
      if (r < group.rank()) offset += count;
      kept->counts_.push_back(count);
    }
    // A copy: the view would keep the whole input's memory alive.
    part = input.FlatRange(offset, kept->counts_[size_t(group.rank())]).Clone();
  }
  if (options_.to_host && input.device().type != DeviceType::kCPU) {
    kept->host_buffer_ = TakeHostBuffer(part.numel(), part.dtype(), input.device());
    Tensor host = kept->host_buffer_.Reshape(part.shape());
    // The copy stream waits for the forward that made `part`; the compute stream waits for the
    // copy before anything it enqueues from now on (the allocator's reuse of part's memory once
    // dropped included). No host wait.
    CopyAsync(part.Detach(), host, CopyQueue::kCopy)->OrderBeforeCurrentStream();
    part = host;
  }
  kept->part_ = std::move(part);
  kept->bytes_ = int64_t(kept->part_.nbytes());
  Count(kept->bytes_);
  ++kept_;
  return kept;
}

Tensor KeptInputs::Restore(const Kept& kept) {
  Tensor part = kept.part_;
  if (part.device() != kept.device_) {
    Tensor back = Tensor::Empty(part.shape(), part.dtype(), kept.device_);
    // The recompute, enqueued after this on the compute stream, waits for the copy back; the
    // host buffer goes back to the store only when the Kept is destroyed, after the recompute.
    CopyAsync(part, back, CopyQueue::kCopy)->OrderBeforeCurrentStream();
    part = back;
  }
  if (kept.counts_.empty()) return part;
  Communicator& group = *options_.partition_group;
  Tensor full = Tensor::Empty({NumElements(kept.shape_)}, part.dtype(), kept.device_);
  absl::Status st = group.AllGather(part, full, kept.counts_)->Wait();
  BRAID_CHECK(st.ok()) << "activation checkpointing (partition_activations): all-gathering a kept "
                       << ShapeToString(kept.shape_) << " input over the tensor-parallel group "
                       << "(rank " << group.rank() << " of " << group.size()
                       << ") before its recompute: " << st.ToString();
  ++gathered_;
  return full.Reshape(kept.shape_);
}

std::string KeptInputs::ToString(Device device) const {
  std::string out;
  if (partitioned()) {
    out = absl::StrCat("each rank keeps 1/", options_.partition_group->size(),
                       " of each (partition_activations over the tensor-parallel group)");
  }
  if (options_.to_host && device.type != DeviceType::kCPU) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", "in ",
                    OffloadHost(device, /*pin=*/true) == PinnedHost() ? "pinned" : "pageable",
                    " host memory (cpu_checkpointing)");
  }
  return out;
}

}  // namespace braid
