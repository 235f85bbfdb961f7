// How one pipeline stage's data-parallel replicas turn their accumulated gradients into the
// update, ZeRO-style on the data axis (the ZeRO paper's stage 1 inside each stage; the zero
// plugin does the same for a whole model):
//   stage 0: the replicas all-reduce (average) the gradients; each steps every parameter.
//   stage 1: a reduce-scatter leaves each replica the average of its shard of the stage's flat
//            gradient; it steps only that shard (optimizer state 1/D of the stage's), then an
//            all-gather gives every replica the updated parameters. Same bytes on the wire as
//            the all-reduce.
//   stage 2: as stage 1, but each micro-batch's gradients are reduce-scattered into the shard as
//            soon as its backward is done on this stage (asynchronously, while the schedule goes
//            on) and the full gradients freed: they live only through one backward, not across
//            the forwards of the micro-batches in between. m reduce-scatters a step instead of 1.
//            A weight tied to another stage keeps its full gradient until the step's end, when
//            the stages sum it, then goes through one last reduce-scatter.
// Shards are ranges of one padded flat buffer holding the stage's parameters in model order.
#ifndef BRAID_PLUGINS_PIPELINE_STAGE_OPTIMIZER_H_
#define BRAID_PLUGINS_PIPELINE_STAGE_OPTIMIZER_H_

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/communicator.h"
#include "core/optimizer.h"
#include "core/state_chunks.h"
#include "core/strategy.h"
#include "core/tensor.h"

namespace braid::pipeline {

class StageOptimizer {
 public:
  // `own`: the stage's trainable parameters (model order); `counted`: the names counted in the
  // gradient norm (a weight two stages share counts on one of them). `data` is the stage's
  // data-parallel group (size 1: no replicas).
  static absl::StatusOr<std::unique_ptr<StageOptimizer>> Create(
      const std::vector<std::pair<std::string, Tensor>>& own, const std::set<std::string>& counted,
      Communicator& data, int zero_stage, const OptimizerFactory& make_optimizer, Device device,
      const std::set<std::string>& tied = {});

  Optimizer* optimizer() const { return optimizer_.get(); }
  void ZeroGrad();
  // Averages the accumulated gradients over the replicas (stage 0) or reduce-scatters them into
  // this replica's shard (stage 1).
  absl::Status Reduce();
  // Stage 2: after a micro-batch's backward on this stage, reduce-scatters what its gradients
  // hold (but the tied ones) into the shard and frees them. A no-op at stages 0 and 1.
  absl::Status ReduceMicroBatch();
  // This replica's share of the squared gradient norm, each parameter (or piece) weighted by its
  // grad_norm_share (a weight another stage also counts: 0). Sum it over the data group when
  // `sharded()`, then over the stages.
  double LocalSquaredNorm() const;
  bool sharded() const { return zero_stage_ >= 1 && data_->size() > 1; }
  // Scales the gradients the step will use.
  void ScaleGradients(float scale);
  // The optimizer step, then (stage 1) the all-gather of the updated parameters.
  absl::Status Step();
  // The stage's parameters (whole) and the optimizer's state as checkpoint chunks
  // (core/state_chunks.h): a parameter is written where `writes(name)` says (one replica of the
  // stage that owns it); with stage 1 each replica writes its shard's optimizer state.
  std::vector<StateChunk> Chunks(bool create, const std::function<bool(const std::string&)>& writes,
                                 bool write_step);

  // Bytes held, for the summary: parameters, gradients, optimizer state (after the first step).
  std::vector<std::pair<std::string, int64_t>> Peaks() const;
  int64_t comm_bytes() const { return comm_bytes_; }

 private:
  StageOptimizer() = default;
  int zero_stage_ = 0;
  Communicator* data_ = nullptr;
  Device device_;
  std::vector<std::pair<std::string, Tensor>> own_;
  std::set<std::string> counted_;
  std::unique_ptr<Optimizer> optimizer_;
  // Stage 1: the flat parameters every own parameter is a view of, this replica's range and
  // the optimizer's pieces (views of the range, their gradients views of grad_shard_).
  Tensor flat_;
  int64_t numel_ = 0, padded_ = 0, shard_ = 0;
  Tensor grad_shard_;
  std::set<std::string> tied_;
  // Stage 2: the reduce-scatter in flight, its input and output (added into grad_shard_ once
  // done).
  std::shared_ptr<Work> pending_;
  Tensor pending_in_, pending_out_;
  absl::Status FinishPending();
  std::vector<Tensor> pieces_;
  int64_t optimizer_state_bytes_ = 0, comm_bytes_ = 0;
};

}  // namespace braid::pipeline

#endif  // BRAID_PLUGINS_PIPELINE_STAGE_OPTIMIZER_H_
