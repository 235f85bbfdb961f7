// The "pipeline" strategy's class, shared by its two halves: pipeline.cc (the cut of the model
// into stages, the groups, the full state) and executor.cc (one training step: running the
// schedule's actions, communicating between stages, measuring the bubble).
#ifndef BRAID_PLUGINS_PIPELINE_PIPELINE_STRATEGY_H_
#define BRAID_PLUGINS_PIPELINE_PIPELINE_STRATEGY_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/broadcast.h"
#include "core/check.h"
#include "core/communicator.h"
#include "core/deferred_init.h"
#include "core/kernels.h"
#include "core/micro_batches.h"
#include "core/module.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "core/wrapping_strategy.h"
#include "plugins/pipeline/partition.h"
#include "plugins/pipeline/schedule.h"
#include "plugins/pipeline/stage_view.h"
#include "core/config/sections.pb.h"

namespace braid::pipeline {

inline constexpr char kName[] = "pipeline";

inline absl::Status Error(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat("strategy 'pipeline': ", msg));
}
inline absl::Status Invalid(const std::string& msg) { return Error(absl::StatusCode::kInvalidArgument, msg); }
inline double NowS() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

// A layer over the strategy below it (WrappingStrategy): the data axis of every stage is that
// strategy's (ddp, zero 1-3, single, a user's). It reduces, shards and steps the stage's
// parameters, handed to it as a StageView, and answers what this layer does not change (the
// optimizer, the data-parallel place, the memory peaks).
class PipelineStrategy final : public WrappingStrategy {
 public:
  std::string name() const override { return NameOver(kName); }
  // Always: each stage materialises only its own layers (and ZeRO-3 below only its shards).
  bool wants_deferred_init(const StrategyContext&) const override { return true; }
  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override;
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override;
  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override;
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override;
  // Every stage of a replica borrows the whole model for the evaluation (each parameter
  // broadcast from the stage that owns it, whole: gathered by the data-axis layer first), runs
  // it, then gives back what is not its own: simple, and the evaluation runs as one process
  // would, at the price of holding the whole model for its duration.
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override;
  // The data-axis layer's lines, then the measured bubble.
  std::vector<std::string> SummaryLines() const override;
  // The data-axis layer's chunks of the stage's parameters and optimizer state (the names are
  // the model's); the step count is written by stage 0 only, and a tied weight's copy on a
  // stage that does not own it is not written (it follows the owner).
  absl::StatusOr<std::vector<StateChunk>> StateChunks(bool create) override {
    if (view_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "StateChunks before Setup");
    BRAID_ASSIGN_OR_RETURN(std::vector<StateChunk> chunks, WrappingStrategy::StateChunks(create));
    for (StateChunk& c : chunks) {
      if (c.name == "optimizer/step") c.write = c.write && stage_ == 0;
    }
    return chunks;
  }
  absl::Status AfterStateLoaded(const std::vector<StateChunk>& chunks) override {
    BRAID_RETURN_IF_ERROR(WrappingStrategy::AfterStateLoaded(chunks));
    RefreshTiesAtNextForward();  // the copies of tied weights follow their owners' loaded values
    return absl::OkStatus();
  }

 private:
  // Its options (stages, schedule, ...: partition.h); the data-axis layer gets the others.
  bool OwnsOption(const std::string& key) const override { return IsPipelineOption(key); }

  struct Chunk {
    int virtual_stage;
    std::vector<PipelineLayer> layers;
  };
  struct InFlight {  // one micro-batch in one chunk
    Tensor input, output, loss;
    Tensor recv_act, recv_grad, input_grad;
    std::shared_ptr<Work> act_work, grad_work;
    std::unique_ptr<autograd::WeightGradQueue> weight_grads;  // put off by a split backward
    bool grad_sent = false;  // the input's gradient, posted from inside the backward
    bool backward_recorded = false;  // its trace event, written when the gradient was posted
  };
  // A weight two stages use (GPT's wte: the embedding and the head). Only the first stage that
  // uses it (the owner) holds it in its view, so the data-axis layer reduces, clips and steps
  // it once; every other stage computes with a copy, sends the owner the gradient it
  // accumulated over the step, and gets the updated value back at the next step's forward.
  struct Tie {
    std::string name;
    Tensor param;          // this stage's (the owner's: in the view; others': the copy)
    bool owner = false;
    std::vector<int> others;  // owner: the stages holding copies; else the owner alone
    int per_step = 0;      // gradient accumulations expected per step on this stage
    int seen = 0;
    Tensor sent;           // a copy's summed gradient, or the owner's value, in flight
  };
  int RankOfVirtualStage(int vs) const { return vs % stages_; }  // in the pipeline group
  int Tag(int kind, int vs, int mb) const { return (kind * stages_ * opts_.chunks + vs) * 100000 + mb; }
  absl::Status Run(const Action& a, const std::vector<Batch>& mbs, StepStats* stats);
  // Posts the receive `a` names unless it is posted already. Returns false, posting nothing, when
  // the buffer's shape is not known yet and `may_block` is false (the first step learns it).
  absl::StatusOr<bool> PostReceive(const Action& a, bool may_block);
  void PostReceivesAhead(const Schedule& schedule, size_t from);
  // A forward, backward or weight-gradient step; `args`, the body of its trace event's "args".
  void Computed(double start_s, double end_s, const std::string& name, std::string args = "");
  Tensor ForwardChunk(const Chunk& c, const Tensor& x);
  // The data-axis layer's loss function: runs this rank's actions up to its next backward and
  // returns a scalar whose backward is that backward (scaled so the layer's 1/T gives it).
  Tensor NextBackward(const std::vector<Batch>& mbs, StepStats* stats);
  absl::Status RunRest(const std::vector<Batch>& mbs, StepStats* stats);
  absl::Status SetUpTies(Module& model, const std::map<std::string, std::set<int>>& used_by);
  void SendTieValues();  // owner, at its first forward of a step (the values whole then)
  absl::Status ReceiveTieValues();
  absl::StatusOr<std::vector<int64_t>> TimeLayers(Module& model, const std::vector<PipelineLayer>& layers,
                                                  const Batch& sample, const CriterionFn& criterion);

  Options opts_;
  Module* model_ = nullptr;
  int world_rank_ = 0;  // for the trace file's name
  Device device_;
  int stage_ = 0, stages_ = 1, dp_ = 0, dp_size_ = 1;
  float max_grad_norm_ = 0;
  CriterionFn criterion_;
  Communicator* pipe_ = nullptr;   // this replica's stages
  Communicator* data_ = nullptr;   // this stage's replicas
  std::vector<Communicator*> groups_;  // pipe_, data_, then the layers' above: the whole model
  std::unique_ptr<StageView> view_;   // what the data-axis layer (inner()) trains
  std::vector<Tie> ties_;
  // At the next forward, owners send their tied weights' values and copies receive them.
  bool tie_send_ = false, tie_receive_ = false;
  void RefreshTiesAtNextForward() {
    for (const Tie& t : ties_) (t.owner ? tie_send_ : tie_receive_) = true;
  }
  std::vector<std::shared_ptr<Work>> tie_works_;
  std::vector<Chunk> chunks_;
  std::set<std::string> own_;  // the parameters in this stage's view
  // The step being run through the data-axis layer: the schedule, the next action, the
  // micro-batch whose backward is open, the tokens (one per backward action).
  Schedule schedule_;
  size_t next_action_ = 0;
  int tokens_ = 1;
  std::unique_ptr<autograd::WeightGradQueue::ActiveScope> put_off_scope_;
  std::pair<int, int> open_backward_ = {-1, -1};
  double open_backward_start_ = 0;
  uint64_t end_of_backward_hook_ = 0;
  bool hook_installed_ = false;
  std::vector<Shape> act_shape_;  // per virtual stage boundary, agreed in the first step
  // The activations' dtype at each boundary (the model's: f32, or bf16/f16 under mixed
  // precision), said by the sender with the shape; a gradient has its output's dtype.
  std::vector<DType> act_dtype_;
  std::map<std::pair<int, int>, InFlight> flight_;
  std::vector<std::shared_ptr<Work>> sends_;
  std::vector<std::string> layer_names_;
  std::map<std::string, int> owner_;  // parameter -> the first stage that uses it
  std::vector<std::pair<int, int>> ranges_;
  int k_ = 1;
  // Measured from the second step on (the first also agrees shapes): this stage's forward and
  // backward time, the schedule's span (from stage 0's first forward to the end of the last
  // compute of any stage, see SpanOfStep), the sum of every stage's busy time, and the time this
  // rank spent in TrainStep; peak activations held.
  double busy_s_ = 0, step_s_ = 0;
  // Every measured step's timings of all stages, summed over the pipeline on the device (one
  // all-reduce of 1 + 3 x stages floats a step, never read by the step), and the span and busy
  // sums read from them so far: FoldTimings reads them in one read, at the summary or when
  // kTimingsKept are waiting.
  static constexpr size_t kTimingsKept = 1024;
  mutable std::vector<Tensor> timings_on_device_;
  mutable double span_s_ = 0, pipe_busy_s_ = 0;
  void FoldTimings() const;
  double step_busy_ = 0, step_first_ = 0, step_last_ = 0;  // this step's, on this rank
  // This step's last gradient received (its wait ended) and last gradient sent (posted).
  double step_grad_in_ = 0, step_grad_out_ = 0;
  int measured_steps_ = 0, steps_ = 0;
  int64_t act_base_ = 0, act_peak_ = 0;
  void CloseBackward();  // the open backward's bookkeeping, once it has run
  struct Event {
    std::string name;
    double start_s, end_s;
    std::string args = "";  // the body of the trace event's "args" object, if any
  };
  std::vector<Event> events_;  // this step's forwards, backwards and waits
  void WriteTrace() const;  // device bytes above the step's start, at most
  absl::Status status_;
};

}  // namespace braid::pipeline

#endif  // BRAID_PLUGINS_PIPELINE_PIPELINE_STRATEGY_H_
