// The "pipeline" strategy's training step: runs this rank's list of actions (schedule.h),
// moving activations and gradients between stages with the communicator's send/recv, then
// reduces the gradients and steps the optimizer; measures the bubble and writes the trace.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/allocator.h"
#include "core/check.h"
#include "plugins/pipeline/pipeline_strategy.h"

namespace braid::pipeline {
namespace {

// "3", or "3.1" for chunk 1 when the stage holds several: how the trace names a micro-batch.
std::string MicroBatchName(const Action& a, int chunks) {
  return chunks > 1 ? absl::StrCat(a.micro_batch, ".", a.chunk) : absl::StrCat(a.micro_batch);
}

}  // namespace

void PipelineStrategy::Computed(double start_s, double end_s, const std::string& name,
                                std::string args) {
  if (step_busy_ == 0) step_first_ = start_s;
  step_last_ = end_s;
  step_busy_ += end_s - start_s;
  events_.push_back({name, start_s, end_s, std::move(args)});
}

absl::StatusOr<bool> PipelineStrategy::PostReceive(const Action& a, bool may_block) {
  const int vs = chunks_[size_t(a.chunk)].virtual_stage;
  InFlight& f = flight_[{a.micro_batch, a.chunk}];
  if (a.op == Op::kRecvActivation) {
    if (f.act_work) return true;
    Shape& shape = act_shape_[size_t(vs)];
    if (shape.empty()) {  // the first time: the sender says the shape
      if (!may_block) return false;
      Tensor header = Tensor::Empty({8}, DType::kI64, Device::CPU());
      BRAID_RETURN_IF_ERROR(pipe_->Recv(header, RankOfVirtualStage(vs - 1), Tag(2, vs, a.micro_batch))->Wait());
      std::vector<int64_t> h = header.ToVector<int64_t>();
      shape.assign(h.begin() + 1, h.begin() + 1 + h[0]);
    }
    f.recv_act = Tensor::Empty(shape, DType::kF32, device_);
    f.act_work = pipe_->Recv(f.recv_act, RankOfVirtualStage(vs - 1), Tag(0, vs, a.micro_batch));
    return true;
  }
  BRAID_CHECK(a.op == Op::kRecvGrad);
  if (f.grad_work) return true;
  // The gradient of this chunk's output has the output's shape: the one this rank sent on.
  Shape shape = act_shape_[size_t(vs) + 1];
  if (shape.empty()) {
    if (!f.output.defined()) return false;  // before the first forward: only posted in order
    shape = f.output.shape();
  }
  f.recv_grad = Tensor::Empty(shape, DType::kF32, device_);
  f.grad_work = pipe_->Recv(f.recv_grad, RankOfVirtualStage(vs + 1), Tag(1, vs, a.micro_batch));
  return true;
}

// Gloo (and NCCL) match a send with its receive before moving the data: a message whose receive
// is posted late waits for a notification round trip through both ranks' transport threads, and
// on a busy machine those threads wait for a core. Measured on gpt-mini at m = 8 before this
// (issue 11), a stage sat 3-4 ms after its input had been sent. So on reaching an action the
// executor posts the receives of the next P forwards and backwards: the message then moves while
// this stage still computes. schedule_test checks, in a simulation, that P steps ahead put every
// receive before its message's send for GPipe, 1F1B and interleaved (which needs up to P - 1;
// 1F1B needs 1). The buffers held ahead are at most P + 1 boundary tensors, far fewer bytes
// than the activations 1F1B keeps anyway.
void PipelineStrategy::PostReceivesAhead(const Schedule& schedule, size_t from) {
  const int ahead = opts_.receives_ahead >= 0 ? opts_.receives_ahead : stages_;
  for (size_t j : ReceivesPostedAt(schedule, from, ahead)) {
    // Never blocks: a receive whose shape is not known yet is posted when the schedule gets
    // there; an error comes back the same way then.
    if (!PostReceive(schedule[j], /*may_block=*/false).ok()) return;
  }
}

absl::Status PipelineStrategy::Run(const Action& a, const std::vector<Batch>& mbs, StepStats* stats) {
  const Chunk& chunk = chunks_[size_t(a.chunk)];
  const int vs = chunk.virtual_stage, last = stages_ * opts_.chunks - 1;
  InFlight& f = flight_[{a.micro_batch, a.chunk}];
  const Batch& batch = mbs[size_t(a.micro_batch)];
  switch (a.op) {
    case Op::kRecvActivation:
    case Op::kRecvGrad:
      return PostReceive(a, /*may_block=*/true).status();
    case Op::kForward: {
      double start = NowS();
      if (vs == 0) {
        f.input = batch.inputs;
      } else {
        BRAID_RETURN_IF_ERROR(f.act_work->Wait());
        events_.push_back({absl::StrCat("wait activation ", MicroBatchName(a, opts_.chunks)), start, NowS()});
        start = NowS();
        f.input = f.recv_act.Detach();
        f.input.set_requires_grad(true);
        f.recv_act = Tensor();
      }
      f.output = ForwardChunk(chunk, f.input);
      if (vs == last) {
        Tensor loss = criterion_(f.output, batch);
        BRAID_RETURN_IF_ERROR(CheckLoss(kName, a.micro_batch, loss));
        loss_sum_ += loss.item();
        f.loss = k_ > 1 ? ops::Scale(loss, 1.0f / float(k_)) : loss;
      }
      const double end = NowS();
      stats->forward_s += end - start;
      Computed(start, end, absl::StrCat("F", MicroBatchName(a, opts_.chunks)));
      return absl::OkStatus();
    }
    case Op::kSendActivation: {
      Tensor out = f.output.Detach();
      Shape& shape = act_shape_[size_t(vs) + 1];
      if (shape.empty()) {
        shape = out.shape();
        std::vector<int64_t> h(8, 0);
        h[0] = int64_t(shape.size());
        for (size_t i = 0; i < shape.size() && i < 7; ++i) h[i + 1] = shape[i];
        Tensor header = Tensor::FromVector(h, {8});
        sends_.push_back(pipe_->Send(header, RankOfVirtualStage(vs + 1), Tag(2, vs + 1, a.micro_batch)));
      } else if (shape != out.shape()) {
        return Invalid(absl::StrCat("micro-batch ", a.micro_batch, "'s activation at virtual stage ", vs,
                                    " is ", ShapeToString(out.shape()), ", the first was ", ShapeToString(shape),
                                    "; every micro-batch must have the same shape"));
      }
      sends_.push_back(pipe_->Send(out, RankOfVirtualStage(vs + 1), Tag(0, vs + 1, a.micro_batch)));
      return absl::OkStatus();
    }
    case Op::kBackward: {
      double start = NowS();
      if (vs != last) {
        BRAID_RETURN_IF_ERROR(f.grad_work->Wait());
        step_grad_in_ = NowS();
        events_.push_back({absl::StrCat("wait gradient ", MicroBatchName(a, opts_.chunks)), start, step_grad_in_});
        start = NowS();
      }
      {
        std::optional<autograd::WeightGradQueue::ActiveScope> put_off;
        if (opts_.split_backward) {
          f.weight_grads = std::make_unique<autograd::WeightGradQueue>();
          put_off.emplace(f.weight_grads.get());
        }
        if (vs == last) {
          f.loss.Backward();
        } else {
          f.output.Backward(f.recv_grad);
        }
      }
      // How many weight gradients the backward put off (WeightGradQueue): the trace says, so a
      // test can tell a split backward that split nothing.
      const size_t put_off = f.weight_grads != nullptr ? f.weight_grads->size() : 0;
      if (vs > 0) f.input_grad = f.input.grad();
      f.output = Tensor();
      f.loss = Tensor();
      f.recv_grad = Tensor();
      const double end = NowS();
      stats->backward_s += end - start;
      Computed(start, end, absl::StrCat("B", MicroBatchName(a, opts_.chunks)),
               absl::StrCat("\"weight_gradients_put_off\":", put_off));
      // ZeRO-2: this micro-batch's gradients are complete on this rank after its lowest chunk's
      // backward (and weight gradients); they go into the shard now (asynchronously), not at the
      // step's end.
      if (a.chunk == 0 && !opts_.split_backward) BRAID_RETURN_IF_ERROR(stage_opt_->ReduceMicroBatch());
      return absl::OkStatus();
    }
    case Op::kWeightGrad: {
      if (f.weight_grads == nullptr) {
        return Error(absl::StatusCode::kInternal,
                     absl::StrCat("weight gradients of micro-batch ", a.micro_batch,
                                  " before its split backward"));
      }
      const size_t computed = f.weight_grads->size();
      const double start = NowS();
      f.weight_grads->Run();
      f.weight_grads.reset();
      const double end = NowS();
      stats->backward_s += end - start;
      Computed(start, end, absl::StrCat("W", MicroBatchName(a, opts_.chunks)),
               absl::StrCat("\"weight_gradients\":", computed));
      if (a.chunk == 0) BRAID_RETURN_IF_ERROR(stage_opt_->ReduceMicroBatch());
      return absl::OkStatus();
    }
    case Op::kSendGrad:
      if (!f.input_grad.defined()) {
        return Error(absl::StatusCode::kInternal, absl::StrCat("no gradient reached the input of virtual stage ", vs));
      }
      sends_.push_back(pipe_->Send(f.input_grad, RankOfVirtualStage(vs - 1), Tag(1, vs - 1, a.micro_batch)));
      step_grad_out_ = NowS();
      return absl::OkStatus();
  }
  return absl::OkStatus();
}


absl::StatusOr<StepStats> PipelineStrategy::TrainStep(const std::vector<Batch>& micro_batches,
                                                      const LossFn&) {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "TrainStep before Setup");
  k_ = int(micro_batches.size());
  BRAID_ASSIGN_OR_RETURN(Schedule schedule,
                         MakeSchedule(opts_.schedule, {stages_, k_, opts_.chunks}, stage_));
  if (opts_.split_backward) schedule = SplitBackward(schedule);
  const double step_start = NowS();
  StepStats stats;
  stage_opt_->ZeroGrad();
  loss_sum_ = 0;
  flight_.clear();
  events_.clear();
  step_busy_ = step_first_ = step_last_ = step_grad_in_ = step_grad_out_ = 0;
  act_base_ = GetMemoryStats(device_).current_bytes;
  for (size_t i = 0; i < schedule.size(); ++i) {
    const Action& a = schedule[i];
    const double posted = NowS();
    PostReceivesAhead(schedule, i);
    absl::Status st = Run(a, micro_batches, &stats);
    if (a.op != Op::kForward && a.op != Op::kBackward && a.op != Op::kWeightGrad) {  // posting
      events_.push_back({absl::StrCat(OpName(a.op), " ", MicroBatchName(a, opts_.chunks)), posted, NowS()});
    }
    // What the step holds above its start: activations and the graph's saved tensors, in flight.
    act_peak_ = std::max(act_peak_, GetMemoryStats(device_).current_bytes - act_base_);
    if (!st.ok()) {
      for (auto& w : sends_) (void)w->Wait();
      sends_.clear();
      return st;
    }
  }
  double comm_start = NowS();
  for (auto& w : sends_) BRAID_RETURN_IF_ERROR(w->Wait());
  sends_.clear();
  flight_.clear();
  // A weight two stages share gets the sum of their gradients, on both.
  for (auto& [group, tensors] : ties_) {
    for (Tensor& t : tensors) {
      Tensor g = t.grad();
      if (!g.defined()) {
        g = Tensor::Zeros(t.shape(), DType::kF32, device_);
        t.set_grad(g);
      }
      BRAID_RETURN_IF_ERROR(group->AllReduce(g, ReduceOp::kSum)->Wait());
    }
  }
  // Each stage's replicas average their gradients (one flat buffer: one collective), or with
  // ZeRO-1 reduce-scatter them into each replica's shard.
  const int64_t comm_before = stage_opt_->comm_bytes();
  BRAID_RETURN_IF_ERROR(stage_opt_->Reduce());
  stats.comm_exposed_s += NowS() - comm_start;
  double opt_start = NowS();
  // The global norm over every stage (a tied weight counted once), and every shard, then the
  // same scale for all.
  double squared = stage_opt_->LocalSquaredNorm();
  auto sum_over = [&](Communicator* g) -> absl::Status {
    if (g == nullptr || g->size() == 1) return absl::OkStatus();
    Tensor t = Tensor::Full({1}, float(squared));
    BRAID_RETURN_IF_ERROR(g->AllReduce(t, ReduceOp::kSum)->Wait());
    squared = double(t.item());
    return absl::OkStatus();
  };
  if (stage_opt_->sharded()) BRAID_RETURN_IF_ERROR(sum_over(data_));
  BRAID_RETURN_IF_ERROR(sum_over(pipe_));
  if (model_parallel_sum_) squared = model_parallel_sum_(squared);
  stats.grad_norm = float(std::sqrt(squared));
  if (max_grad_norm_ > 0 && stats.grad_norm > max_grad_norm_) {
    stage_opt_->ScaleGradients(float(max_grad_norm_ / (double(stats.grad_norm) + 1e-6)));
  }
  BRAID_RETURN_IF_ERROR(stage_opt_->Step());
  stats.comm_bytes = stage_opt_->comm_bytes() - comm_before;
  stats.comm_what = zero_stage_ >= 1 ? "gradients reduce-scattered over each stage's replicas"
                                     : "gradients all-reduced over each stage's replicas";
  stats.optimizer_s = NowS() - opt_start;
  // One all-reduce over the pipeline carries what one stage alone knows, added to the others'
  // zeros: the loss (only the last stage saw it), every stage's busy time (summed), and each
  // stage's own timings for the span (SpanOfStep). Durations from each rank's own first compute,
  // not clock readings, so ranks need no common clock.
  const bool last = stage_ == stages_ - 1;
  const size_t p = size_t(stages_);
  std::vector<float> shared(2 + 3 * p, 0.0f);
  shared[0] = last ? float(loss_sum_ / k_) : 0.0f;
  shared[1] = float(step_busy_);
  const size_t mine = 2 + 3 * size_t(stage_);
  shared[mine] = float(step_last_ - step_first_);
  shared[mine + 1] = float(step_grad_in_ - step_first_);
  shared[mine + 2] = float(step_grad_out_ - step_first_);
  Tensor t = Tensor::FromVector(shared, {int64_t(shared.size())});
  if (stages_ > 1) BRAID_RETURN_IF_ERROR(pipe_->AllReduce(t, ReduceOp::kSum)->Wait());
  shared = t.ToVector<float>();
  stats.loss = shared[0];
  std::vector<float> e(p), r(p), s(p);
  for (size_t k = 0; k < p; ++k) {
    e[k] = shared[2 + 3 * k];
    r[k] = shared[2 + 3 * k + 1];
    s[k] = shared[2 + 3 * k + 2];
  }
  if (steps_ > 0) {
    busy_s_ += step_busy_;
    span_s_ += SpanOfStep(e, r, s);
    pipe_busy_s_ += shared[1];
    step_s_ += NowS() - step_start;
    ++measured_steps_;
  }
  ++steps_;
  events_.push_back({"optimizer", opt_start, opt_start + stats.optimizer_s});
  if (!opts_.trace_file.empty()) WriteTrace();
  return stats;
}

void PipelineStrategy::WriteTrace() const {
  std::string path = opts_.trace_file;
  const std::string key = "{rank}";
  if (auto at = path.find(key); at != std::string::npos) {
    path.replace(at, key.size(), std::to_string(world_->rank()));
  }
  std::vector<std::string> items;
  items.push_back(absl::StrFormat(
      R"({"name":"thread_name","ph":"M","pid":%d,"tid":%d,"args":{"name":"stage %d"}})", dp_, stage_,
      stage_));
  for (const Event& e : events_) {
    items.push_back(absl::StrFormat(R"({"name":"%s","ph":"X","pid":%d,"tid":%d,"ts":%.1f,"dur":%.1f%s})",
                                    e.name, dp_, stage_, e.start_s * 1e6,
                                    std::max(0.0, e.end_s - e.start_s) * 1e6,
                                    e.args.empty() ? "" : absl::StrCat(R"(,"args":{)", e.args, "}")));
  }
  // Written whole under a temporary name, then renamed: a reader never sees half a trace.
  std::string tmp = path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "{\"traceEvents\":[\n%s\n]}\n", absl::StrJoin(items, ",\n").c_str());
    bool ok = std::fclose(f) == 0;
    if (ok) std::rename(tmp.c_str(), path.c_str());
  }
}

// The bubble as the formula means it: the share of the schedule's span the stages spend not
// computing, over all stages (1 - the stages' summed forward, backward and weight-gradient time /
// (P x span)), the span running from stage 0's first forward to the end of the last compute of
// any stage (SpanOfStep). Waiting for a message,
// posting one, and stages of unequal speed all count as bubble; the per-step work outside the
// span (zeroing gradients, the tied-weight and data-parallel reductions, the optimizer step)
// does not, and is reported beside it as its share of this rank's step.
std::vector<std::string> PipelineStrategy::SummaryLines() const {
  if (measured_steps_ == 0 || span_s_ <= 0) return {};
  const double bubble = 1 - pipe_busy_s_ / (stages_ * span_s_);
  const double idle = 1 - busy_s_ / span_s_;
  const double outside = step_s_ > 0 ? 1 - span_s_ / step_s_ : 0;
  return {absl::StrFormat(
      "pipeline (stage %d of %d, %d micro-batch(es), %s%s%s): bubble %.1f%% measured, bubble "
      "formula %.1f%% (idle share of %d stages x the schedule's span, stage 0's first forward to "
      "the last compute of any stage, steps 2..%d); this stage idle %.1f%%; outside the span (gradient zeroing, "
      "reductions, optimizer) %.1f%% of the step; peak activations held %.2f MiB",
      stage_, stages_, k_, opts_.schedule, opts_.chunks > 1 ? absl::StrCat(" x", opts_.chunks).c_str() : "",
      opts_.split_backward ? ", split backward" : "",
      100 * bubble, 100 * BubbleFormula(opts_.schedule, {stages_, k_, opts_.chunks}), stages_, steps_,
      100 * idle, 100 * outside, double(act_peak_) / (1 << 20))};
}

}  // namespace braid::pipeline
