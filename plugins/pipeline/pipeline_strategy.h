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
#include "plugins/pipeline/partition.h"
#include "plugins/pipeline/schedule.h"
#include "plugins/pipeline/stage_optimizer.h"
#include "core/config/train_config.pb.h"

namespace braid::pipeline {

inline constexpr char kName[] = "pipeline";

inline absl::Status Error(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat("strategy 'pipeline': ", msg));
}
inline absl::Status Invalid(const std::string& msg) { return Error(absl::StatusCode::kInvalidArgument, msg); }
inline double NowS() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

class PipelineStrategy final : public Strategy {
 public:
  std::string name() const override { return kName; }
  bool wants_deferred_init(const StrategyContext&) const override { return true; }
  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override;
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override;
  Optimizer* optimizer() override { return stage_opt_ ? stage_opt_->optimizer() : nullptr; }
  std::vector<std::pair<std::string, int64_t>> ModelStatePeaks() const override {
    return stage_opt_ ? stage_opt_->Peaks() : std::vector<std::pair<std::string, int64_t>>{};
  }
  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override;
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override;
  int data_parallel_rank() const override { return dp_; }
  int data_parallel_size() const override { return dp_size_; }
  // Every stage of a replica borrows the whole model for the evaluation (the other stages'
  // parameters broadcast from the stage that owns each), runs it, then gives back what is not
  // its own: simple, and the evaluation runs as one process would, at the price of holding the
  // whole model for its duration.
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "Evaluate before Setup");
    std::set<std::string> mine;
    for (auto& [n, p] : own_) mine.insert(n);
    std::vector<Tensor> borrowed;
    for (auto& [n, p] : model_->NamedParameters()) {  // the same order on every stage
      if (!mine.count(n) && !p.has_data()) {
        p.storage()->Reallocate();
        borrowed.push_back(p);
      }
      auto it = owner_.find(n);
      if (stages_ > 1 && it != owner_.end()) {
        Tensor t = p;
        BRAID_RETURN_IF_ERROR(pipe_->Broadcast(t, it->second)->Wait());
      }
    }
    {
      autograd::NoGradGuard no_grad;
      eval(*model_);
    }
    for (Tensor& p : borrowed) p.storage()->Release();
    return absl::OkStatus();
  }
  std::vector<std::string> SummaryLines() const override;
  // Each stage's own parameters, written by the stage that counts them (a tied weight once) on
  // replica 0; the optimizer's state likewise (with ZeRO-1, by every replica: its shard).
  absl::StatusOr<std::vector<StateChunk>> StateChunks(bool create) override {
    if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "StateChunks before Setup");
    auto writes = [this](const std::string& n) { return dp_ == 0 && counted_.count(n) > 0; };
    return stage_opt_->Chunks(create, writes, world_->rank() == 0);
  }
  absl::Status AfterStateLoaded(const std::vector<StateChunk>& chunks) override {
    RestoreOptimizerStep(*stage_opt_->optimizer(), chunks);
    return absl::OkStatus();
  }

 private:
  struct Chunk {
    int virtual_stage;
    std::vector<PipelineLayer> layers;
  };
  struct InFlight {  // one micro-batch in one chunk
    Tensor input, output, loss;
    Tensor recv_act, recv_grad, input_grad;
    std::shared_ptr<Work> act_work, grad_work;
    std::unique_ptr<autograd::WeightGradQueue> weight_grads;  // put off by a split backward
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
  absl::StatusOr<std::vector<int64_t>> TimeLayers(Module& model, const std::vector<PipelineLayer>& layers,
                                                  const Batch& sample, const CriterionFn& criterion);

  Options opts_;
  Module* model_ = nullptr;
  Communicator* world_ = nullptr;
  Device device_;
  int stage_ = 0, stages_ = 1, dp_ = 0, dp_size_ = 1;
  float max_grad_norm_ = 0;
  std::function<double(double)> model_parallel_sum_;  // tensor parallelism's, or null
  CriterionFn criterion_;
  std::vector<std::unique_ptr<Communicator>> groups_;  // the groups this strategy made
  Communicator* pipe_ = nullptr;   // this replica's stages
  Communicator* data_ = nullptr;   // this stage's replicas
  std::vector<std::pair<Communicator*, std::vector<Tensor>>> ties_;  // tied params per group
  std::vector<Chunk> chunks_;
  std::vector<std::pair<std::string, Tensor>> own_;   // this rank's parameters, model order
  std::set<std::string> counted_;  // own parameters counted in the norm (a tied one once)
  std::unique_ptr<StageOptimizer> stage_opt_;  // the data axis: all-reduce, or ZeRO-1 shards
  int zero_stage_ = 0;
  std::vector<Shape> act_shape_;  // per virtual stage boundary, agreed in the first step
  std::map<std::pair<int, int>, InFlight> flight_;
  std::vector<std::shared_ptr<Work>> sends_;
  std::vector<std::string> layer_names_;
  std::map<std::string, int> owner_;  // parameter -> the first stage that uses it
  std::vector<std::pair<int, int>> ranges_;
  double loss_sum_ = 0;
  int k_ = 1;
  // Measured from the second step on (the first also agrees shapes): this stage's forward and
  // backward time, the schedule's span (from stage 0's first forward to the end of the last
  // compute of any stage, see SpanOfStep), the sum of every stage's busy time, and the time this
  // rank spent in TrainStep; peak activations held.
  double busy_s_ = 0, span_s_ = 0, pipe_busy_s_ = 0, step_s_ = 0;
  double step_busy_ = 0, step_first_ = 0, step_last_ = 0;  // this step's, on this rank
  // This step's last gradient received (its wait ended) and last gradient sent (posted).
  double step_grad_in_ = 0, step_grad_out_ = 0;
  int measured_steps_ = 0, steps_ = 0;
  int64_t act_base_ = 0, act_peak_ = 0;
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
