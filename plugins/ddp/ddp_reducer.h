// The gradient reducer of the "ddp" strategy, in the manner of PyTorch's c10d Reducer: the
// buckets, the post-accumulate-grad hooks that mark gradients ready, launching each bucket's
// AllReduce in bucket order, and finishing the pass (waiting, unpacking, reaching one verdict on
// every rank). Kept apart from the strategy class (ddp.cc: options, Setup, the step's micro-batch
// loop and optimizer, checkpoints, the trace file), which drives it through the calls below once
// per step; which parameters share a bucket is AssignBuckets (ddp_buckets.h).
//
// The layout starts in reverse registration order (roughly the order backward produces
// gradients) and is rebuilt once, after the first clean step, in the order gradients actually
// became ready on rank 0 (broadcast on the device at the end of that step's backward and read
// with the step's other values, so that every rank uses the same layout).
//
// Each bucket carries, after its gradients, one flag per parameter (1: this rank produced a
// gradient for it this step) and one "step ok" flag. They are averaged with the gradients, so
// every rank learns, at no extra collective, which parameters some rank left without a gradient
// and whether some rank abandoned the step; all ranks therefore reach the same verdict and return
// the same error instead of one rank skipping a collective the others wait for. The flags are
// exact in f32; in 16-bit buckets they stay reliable up to a few hundred ranks. The flags reach the
// host with the step's loss and gradient norm, in its one read (ValuesToRead, then Decide): on a
// GPU a DDP step waits for the device once.
#ifndef BRAID_PLUGINS_DDP_DDP_REDUCER_H_
#define BRAID_PLUGINS_DDP_DDP_REDUCER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/communicator.h"
#include "core/module.h"
#include "core/strategy.h"
#include "core/tensor.h"
#include "plugins/ddp/ddp_trace.h"

namespace braid::ddp {

class Reducer {
 public:
  struct Options {
    double bucket_cap_mb = 25;
    double first_bucket_mb = 1;
    bool find_unused_parameters = false;
    bool gradient_as_bucket_view = true;
    // Reduce floating-point gradients in f32 whatever the parameters' dtype (mixed precision
    // with "communication_data_type": "fp32"); gradient_as_bucket_view must then be false.
    bool reduce_in_f32 = false;
  };

  // Takes the trainable ones among `params` (registration order), builds the initial layout and
  // registers a post-accumulate-grad hook on each. `record` receives the reducer's timeline
  // events ("rebuild_buckets", "allreduce").
  Reducer(const Module::NamedTensors& params, const Options& opts, Communicator* comm,
          std::function<void(TraceEvent)> record);
  ~Reducer();  // removes the hooks
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // At the start of each step: rebuilds the layout if the first clean step asked for it,
  // prepares the gradients and clears the last step's verdicts. `step` names the step in errors.
  absl::Status BeginStep(int64_t step);
  // Before each micro-batch's forward: only a `sync` pass (the last micro-batch) reduces.
  void BeginPass(bool sync);
  // With find_unused_parameters, before the last backward.
  void MarkUnreachableReady(const Tensor& loss);
  // This rank's loss was bad: it still takes part in the step's reductions, flagged as abandoned.
  void AbandonStep();
  // The end of the reducing backward pass (queued as its end-of-backward callback; called
  // directly when no gradient reached any parameter). Runs once per pass.
  void FinishSyncPass();
  bool finished() const { return finished_; }
  // A backward pass has returned: later gradients belong to no training step.
  void EndPass() { in_pass_ = false; }

  // What the step's one read must bring to the host for Decide (on the bucket's device): every
  // bucket's flags, then, in the step whose readiness order decides the rebuilt layout, rank 0's
  // order (broadcast on the device). Empty when there are no buckets.
  std::vector<Tensor> ValuesToRead() const;
  // After that read (`values`: ValuesToRead's elements, in order), before clipping and stepping:
  // reaches the verdicts below, leaves undefined the gradients no rank produced (as one process
  // would, so that the optimizer skips them), and plans the layout's rebuild.
  void Decide(const std::vector<float>& values);

  // The verdicts of the step, the same on every rank (peer_failed and unused_status after Decide).
  const absl::Status& comm_status() const { return comm_status_; }
  bool peer_failed() const { return peer_failed_; }
  const absl::Status& unused_status() const { return unused_status_; }
  // When the reducing backward pass ended, the wait for its reductions ended, and the gradients
  // were unpacked (NowUs()).
  double backward_end_us() const { return backward_end_us_; }
  double waited_us() const { return waited_us_; }
  double unpacked_us() const { return unpacked_us_; }
  // Adds the step's gradient bytes, and how much of them was reduced during backward, to `stats`.
  void AddBucketStats(StepStats* stats) const;

  // The trainable parameters, registration order.
  size_t num_params() const { return params_.size(); }
  std::vector<Tensor> Parameters() const;
  // DdpIntrospection's view of the layout.
  std::vector<BucketInfo> Buckets() const;
  bool rebuilt() const { return rebuilt_; }

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    uint64_t hook_id = 0;
    int bucket = -1;
    int64_t offset = 0;  // first element of its gradient in the bucket's flat buffer
    int slot = 0;        // its position in the bucket (and its flag's, after the gradients)
    bool ready = false;  // marked ready in this backward pass
    bool used = false;   // got a gradient on this rank in some micro-batch of this step
  };
  struct Bucket {
    std::vector<int> params;
    DType dtype = DType::kF32;
    Device device;
    int64_t numel = 0;  // gradient elements; the flags follow
    Tensor flat;        // numel + params.size() + 1 elements
    Tensor flags() const { return flat.FlatRange(numel, int64_t(params.size()) + 1); }
    int pending = 0;    // parameters not yet ready in this pass
    std::shared_ptr<Work> work;
    double ready_us = 0, launch_us = 0, done_us = 0;
  };

  // The dtype a parameter's gradient is reduced in.
  DType BucketDType(const Tensor& t) const {
    return opts_.reduce_in_f32 && IsFloating(t.dtype()) ? DType::kF32 : t.dtype();
  }

  Tensor GradSlot(const Param& p) const {
    const Bucket& b = buckets_[size_t(p.bucket)];
    return b.flat.FlatRange(p.offset, p.tensor.numel(), p.tensor.shape());
  }
  bool GradIsBucketView(const Param& p) const {
    Tensor g = p.tensor.grad();
    const Bucket& b = buckets_[size_t(p.bucket)];
    return g.defined() && g.storage() == b.flat.storage() &&
           g.storage_offset() == b.flat.storage_offset() + p.offset;
  }

  void BuildBuckets(const std::vector<int>& order);
  absl::Status RebuildBuckets();
  void PrepareGrads();
  void OnGradReady(int index);
  void MarkReady(int index);
  void LaunchReadyBuckets();
  void PollCompleted();
  void Unpack();
  void RecordEvent(TraceEvent e) { record_(std::move(e)); }

  Options opts_;
  Communicator* comm_;
  std::function<void(TraceEvent)> record_;
  std::vector<Param> params_;  // trainable parameters, registration order
  std::vector<Bucket> buckets_;
  bool rebuilt_ = false;
  bool rebuild_pending_ = false;
  std::vector<int> ready_order_;  // of the first synchronising pass, until the rebuild
  bool recording_order_ = true;
  // Rank 0's ready_order_ as f32 on the device, broadcast at the end of a recording pass (empty
  // otherwise); the layout it decided, for the next BeginStep.
  Tensor order_on_device_;
  std::vector<int> agreed_order_;

  // State of the backward pass now running (one at a time, on the step's thread).
  int64_t step_ = 0;
  bool in_pass_ = false;
  bool sync_pass_ = false;
  bool finish_queued_ = false;
  bool finished_ = false;
  float step_ok_ = 1;  // 0 once this rank abandoned the step
  size_t next_launch_ = 0, next_done_ = 0;
  double backward_end_us_ = 0, waited_us_ = 0, unpacked_us_ = 0;
  absl::Status comm_status_;
  absl::Status unused_status_;
  bool peer_failed_ = false;
};

}  // namespace braid::ddp

#endif  // BRAID_PLUGINS_DDP_DDP_REDUCER_H_
