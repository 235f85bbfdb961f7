// Where a checkpointed segment keeps its input from its forward to its recompute: DeepSpeed's
// activation_checkpointing.partition_activations and cpu_checkpointing.
//
// The input of a checkpointed segment is all a checkpoint holds between the forward and the
// backward (activation_checkpointing.h), so it is what these two options shrink:
//   - partition (partition_activations under tensor parallelism): the block inputs of a
//     tensor-parallel model are replicated, the same on every rank of the tensor group, so each
//     rank keeps only its 1/t of the elements (the flat tensor cut in t blocks, the first
//     numel % t one element longer, so any shape splits) and the group all-gathers them back
//     before the recompute. Only for inputs that are the same on every rank of the group: under
//     sequence parallelism they are split along the sequence already, and are not partitioned.
//   - to_host (cpu_checkpointing): the kept part is copied to host memory (page-locked where the
//     device's backend offers it, core/pinned_host.h) and back to the device before the
//     recompute, both asynchronously on the device's copy stream (core/async_copy.h): the copy
//     out waits on the device for the forward that made the input, the compute stream waits for
//     it before the device memory is given back, and the recompute's stream waits for the copy
//     back; the host never waits. The host buffers are the store's and are reused (a buffer goes
//     back to the store when its Kept is destroyed): allocating and freeing page-locked memory
//     per input would synchronise the device each time (cudaFreeHost). Reuse is safe without
//     asking the device because every copy of a buffer is ordered before the compute stream, and
//     the next copy into it waits for the compute stream's position. On a CPU device the input
//     is in host memory already: nothing is moved.
// Both together: the slice goes to the host, comes back, and is gathered.
//
// Every kept input is counted while a checkpoint holds it (held_bytes, peak_held_bytes): the
// memory these options save is measured on the store's own books, per rank.
#ifndef BRAID_LAUNCHER_ACTIVATION_CHECKPOINTING_KEPT_INPUTS_H_
#define BRAID_LAUNCHER_ACTIVATION_CHECKPOINTING_KEPT_INPUTS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/async_copy.h"
#include "core/communicator.h"
#include "core/tensor.h"

namespace braid {

class KeptInputs {
 public:
  struct Options {
    // partition_activations: the tensor-parallel group whose ranks all hold the same inputs;
    // null, or a group of one: each input is kept whole.
    Communicator* partition_group = nullptr;
    // cpu_checkpointing: keep the inputs of a non-CPU device in host memory.
    bool to_host = false;
  };

  // What a checkpoint holds of one input; the store's count drops when it is destroyed.
  class Kept {
   public:
    ~Kept();
    Kept(const Kept&) = delete;
    Kept& operator=(const Kept&) = delete;
    const Tensor& part() const { return part_; }  // this rank's block (or all), where kept

   private:
    friend class KeptInputs;
    Kept() = default;
    KeptInputs* store_ = nullptr;  // the store outlives every Kept: it is the policy's
    Tensor part_;
    Tensor host_buffer_;  // cpu_checkpointing: the store's flat buffer part_ views
    Shape shape_;
    Device device_;
    std::vector<int64_t> counts_;  // per rank, when partitioned
    int64_t bytes_ = 0;            // counted in the store
  };

  explicit KeptInputs(Options options);
  KeptInputs() : KeptInputs(Options{}) {}

  // Keeps `input` (detached; contiguous). Partitioned, every rank of the group must keep the
  // same tensor, each with its own Keep.
  std::shared_ptr<Kept> Keep(const Tensor& input);
  // The input again, on its device, with its values bit for bit. Partitioned, a collective of
  // the group (every rank restores the same input at the same point of its backward, as the
  // recomputes run in backward's order); a failure is fatal, naming the op.
  Tensor Restore(const Kept& kept);

  int64_t held_bytes() const { return held_.load(); }
  int64_t peak_held_bytes() const { return peak_.load(); }
  int64_t kept() const { return kept_.load(); }          // Keep calls so far
  int64_t gathered() const { return gathered_.load(); }  // all-gathers Restore ran
  // For the training program's line: "each rank keeps 1/2 of each (partition_activations over
  // the tensor group), in pinned host memory (cpu_checkpointing)"; "" when neither applies.
  std::string ToString(Device device) const;

 private:
  bool partitioned() const { return options_.partition_group != nullptr &&
                                    options_.partition_group->size() > 1; }
  void Count(int64_t bytes);
  // cpu_checkpointing's host buffers: a spare one of `numel` elements of `dtype`, or a new one.
  Tensor TakeHostBuffer(int64_t numel, DType dtype, Device device);
  void GiveHostBuffer(Tensor buffer);

  Options options_;
  std::mutex spares_mu_;
  std::vector<Tensor> spares_;  // flat host buffers no Kept holds
  std::atomic<int64_t> held_{0}, peak_{0}, kept_{0}, gathered_{0};
};

}  // namespace braid

#endif  // BRAID_LAUNCHER_ACTIVATION_CHECKPOINTING_KEPT_INPUTS_H_
