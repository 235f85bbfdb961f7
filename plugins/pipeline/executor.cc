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
#include "core/autograd.h"
#include "core/check.h"
#include "core/scalar_reads.h"
#include "plugins/pipeline/pipeline_strategy.h"

namespace braid::pipeline {
namespace {

// The first activation across a boundary is preceded by a header: [ndim, dtype, dims...], f32
// on the device (NCCL moves device memory only), written there by fills: a copy from host
// memory would make the sender wait for its device. The receiver reads it, once per boundary:
// the first step's one extra host synchronisation on a receiving stage (the shape is what the
// receive must allocate; nothing else could say it without running the stages before).
constexpr int64_t kHeaderLength = 9;
constexpr int64_t kHeaderMax = int64_t(1) << 24;  // every value exact in f32

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
    if (shape.empty()) {  // the first time: the sender says the shape and the dtype
      if (!may_block) return false;
      Tensor header = Tensor::Empty({kHeaderLength}, DType::kF32, device_);
      BRAID_RETURN_IF_ERROR(pipe_->Recv(header, RankOfVirtualStage(vs - 1), Tag(2, vs, a.micro_batch))->Wait());
      std::vector<int64_t> h;
      for (float v : header.ToVector<float>()) h.push_back(int64_t(v));
      act_dtype_[size_t(vs)] = DType(h[1]);
      shape.assign(h.begin() + 2, h.begin() + 2 + h[0]);
    }
    f.recv_act = Tensor::Empty(shape, act_dtype_[size_t(vs)], device_);
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
  // ... and its dtype: the one this rank's output has (bf16/f16 under mixed precision).
  const DType dtype = f.output.defined() ? f.output.dtype() : act_dtype_[size_t(vs) + 1];
  f.recv_grad = Tensor::Empty(shape, dtype, device_);
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
      if (tie_receive_) BRAID_RETURN_IF_ERROR(ReceiveTieValues());  // a copy: the owner's new value
      double start = NowS();
      if (vs == 0) {
        f.input = batch.inputs;
      } else {
        // The chunk's kernels read it: on NCCL the compute stream waits, not the host.
        BRAID_RETURN_IF_ERROR(f.act_work->WaitOnDevice());
        events_.push_back({absl::StrCat("wait activation ", MicroBatchName(a, opts_.chunks)), start, NowS()});
        start = NowS();
        f.input = f.recv_act.Detach();
        f.input.set_requires_grad(true);
        f.recv_act = Tensor();
      }
      // Through the view, so the data-axis layer's hooks run around the chunk (ZeRO-3 gathers).
      view_->set_forward([this, &chunk](const Tensor& x) { return ForwardChunk(chunk, x); });
      f.output = (*view_)(f.input);
      if (vs == last) {
        Tensor loss = criterion_(f.output, batch);
        BRAID_RETURN_IF_ERROR(CheckLoss(kName, a.micro_batch, loss));
        f.loss = loss;  // NextBackward scales it for the data-axis layer
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
        if (out.shape().size() > size_t(kHeaderLength - 2)) {
          return Invalid(absl::StrCat("virtual stage ", vs, "'s output is ", ShapeToString(out.shape()),
                                      ": at most ", kHeaderLength - 2, " dimensions cross a stage boundary"));
        }
        for (int64_t d : out.shape()) {
          if (d >= kHeaderMax) {
            return Invalid(absl::StrCat("virtual stage ", vs, "'s output is ", ShapeToString(out.shape()),
                                        ": a dimension crossing a stage boundary must be below ", kHeaderMax));
          }
        }
        shape = out.shape();
        act_dtype_[size_t(vs) + 1] = out.dtype();
        std::vector<int64_t> h(kHeaderLength, 0);  // [ndim, dtype, dims...]
        h[0] = int64_t(shape.size());
        h[1] = int64_t(out.dtype());
        for (size_t i = 0; i < shape.size(); ++i) h[i + 2] = shape[i];
        Tensor header = Tensor::Empty({kHeaderLength}, DType::kF32, device_);
        for (int64_t i = 0; i < kHeaderLength; ++i) header.FlatRange(i, 1).Fill(float(h[size_t(i)]));
        sends_.push_back(pipe_->Send(header, RankOfVirtualStage(vs + 1), Tag(2, vs + 1, a.micro_batch)));
      } else if (shape != out.shape() || act_dtype_[size_t(vs) + 1] != out.dtype()) {
        return Invalid(absl::StrCat("micro-batch ", a.micro_batch, "'s activation at virtual stage ", vs,
                                    " is ", ShapeToString(out.shape()), " ", DTypeName(out.dtype()),
                                    ", the first was ", ShapeToString(shape), " ",
                                    DTypeName(act_dtype_[size_t(vs) + 1]),
                                    "; every micro-batch must have the same shape and dtype"));
      }
      sends_.push_back(pipe_->Send(out, RankOfVirtualStage(vs + 1), Tag(0, vs + 1, a.micro_batch)));
      return absl::OkStatus();
    }
    case Op::kBackward:
      // Run by the data-axis layer: NextBackward hands it this action's backward as a loss.
      return Error(absl::StatusCode::kInternal, "a backward action outside NextBackward");
    case Op::kWeightGrad:
      // A split backward computes the weight gradients inside the same backward pass, right
      // after posting the input's gradient (CloseBackward): the data-axis layer reduces them in
      // that pass, as it would any gradient.
      return absl::OkStatus();
    case Op::kSendGrad:
      if (f.grad_sent) return absl::OkStatus();  // posted from inside the backward
      if (!f.input_grad.defined()) {
        return Error(absl::StatusCode::kInternal, absl::StrCat("no gradient reached the input of virtual stage ", vs));
      }
      sends_.push_back(pipe_->Send(f.input_grad, RankOfVirtualStage(vs - 1), Tag(1, vs - 1, a.micro_batch)));
      f.grad_sent = true;
      step_grad_out_ = NowS();
      return absl::OkStatus();
  }
  return absl::OkStatus();
}


namespace {

// A scalar worth 0 whose backward is that of `s`: a stand-in token that adds nothing to the
// data-axis layer's mean of its tokens, so on the last stage that mean is the step's mean loss
// (the layer reads it with its gradient norm in one host synchronisation; the loss is never
// read alone). Not s - s: an overflowing half stand-in (inf) would make that NaN.
Tensor WorthNothing(const Tensor& s) {
  return autograd::ApplyFunction(
      "pipeline_stand_in", {s},
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{Tensor::Zeros({}, in[0].dtype(), in[0].device())};
      },
      [](const std::vector<Tensor>& grads) { return grads; })[0];
}

}  // namespace

// The data-axis layer's loss function, called once per backward action of this rank (its T
// "tokens"): runs the actions before that backward (forwards, sends, receives), then returns a
// scalar whose backward is the stage's backward of that micro-batch. The layer differentiates
// loss / T, so the scalar is T times: the loss / m (m micro-batches) on the last virtual stage,
// sum(output * received gradient) elsewhere (the received gradient already carries the 1/m).
Tensor PipelineStrategy::NextBackward(const std::vector<Batch>& mbs, StepStats* stats) {
  CloseBackward();
  while (next_action_ < schedule_.size() && schedule_[next_action_].op != Op::kBackward) {
    const Action& a = schedule_[next_action_];
    const double posted = NowS();
    PostReceivesAhead(schedule_, next_action_);
    const bool posted_already = a.op == Op::kSendGrad && flight_[{a.micro_batch, a.chunk}].grad_sent;
    absl::Status st = Run(a, mbs, stats);
    if (a.op != Op::kForward && a.op != Op::kWeightGrad && !posted_already) {
      events_.push_back({absl::StrCat(OpName(a.op), " ", MicroBatchName(a, opts_.chunks)), posted, NowS()});
    }
    act_peak_ = std::max(act_peak_, GetMemoryStats(device_).current_bytes - act_base_);
    ++next_action_;
    if (!st.ok()) {
      if (status_.ok()) status_ = st;
      return Tensor();  // the layer's loss check fails the step; status_ says why
    }
  }
  if (next_action_ >= schedule_.size()) {
    if (status_.ok()) status_ = Error(absl::StatusCode::kInternal, "the data-axis layer asked for more backward actions than the schedule has");
    return Tensor();
  }
  const Action& a = schedule_[next_action_++];
  PostReceivesAhead(schedule_, next_action_ - 1);
  const Chunk& chunk = chunks_[size_t(a.chunk)];
  const int vs = chunk.virtual_stage, last = stages_ * opts_.chunks - 1;
  InFlight& f = flight_[{a.micro_batch, a.chunk}];
  double start = NowS();
  Tensor surrogate;
  if (vs == last) {
    surrogate = tokens_ == k_ ? f.loss : ops::Scale(f.loss, float(tokens_) / float(k_));
  } else {
    absl::Status st = f.grad_work->WaitOnDevice();  // read by the backward's kernels only
    if (!st.ok()) {
      if (status_.ok()) status_ = st;
      return Tensor();
    }
    step_grad_in_ = NowS();
    events_.push_back({absl::StrCat("wait gradient ", MicroBatchName(a, opts_.chunks)), start, step_grad_in_});
    start = NowS();
    surrogate = ops::Scale(ops::Sum(ops::Mul(f.output, f.recv_grad)), float(tokens_));
    // On the last stage (interleaved: its earlier chunks) the layer's mean over the tokens is
    // the step's mean loss only if a stand-in adds nothing to it.
    if (stage_ == stages_ - 1) surrogate = WorthNothing(surrogate);
  }
  if (vs > 0) {
    // Posts the input's gradient the moment it exists, from inside the backward: the previous
    // stage waits for nothing else, and the data-axis layer's collectives come after. A split
    // backward computes the weights' gradients only then.
    const int mb = a.micro_batch, ch = a.chunk;
    f.input.RegisterPostAccumulateGradHook([this, mb, ch](Tensor& in) {
      InFlight& g = flight_[{mb, ch}];
      if (g.grad_sent) return;
      put_off_scope_.reset();
      const Action b{Op::kBackward, mb, ch};
      const size_t n = g.weight_grads != nullptr ? g.weight_grads->size() : 0;
      Computed(open_backward_start_, NowS(), absl::StrCat("B", MicroBatchName(b, opts_.chunks)),
               absl::StrCat("\"weight_gradients_put_off\":", n));
      g.backward_recorded = true;
      g.input_grad = in.grad();
      const int v = chunks_[size_t(ch)].virtual_stage;
      const double posted = NowS();
      sends_.push_back(pipe_->Send(g.input_grad, RankOfVirtualStage(v - 1), Tag(1, v - 1, mb)));
      g.grad_sent = true;
      step_grad_out_ = NowS();
      events_.push_back({absl::StrCat("send-grad ", MicroBatchName(b, opts_.chunks)), posted, step_grad_out_});
      if (g.weight_grads != nullptr) {
        const double w0 = NowS();
        g.weight_grads->Run();
        g.weight_grads.reset();
        Computed(w0, NowS(), absl::StrCat("W", MicroBatchName(b, opts_.chunks)),
                 absl::StrCat("\"weight_gradients\":", n));
      }
    });
    if (opts_.split_backward) {
      f.weight_grads = std::make_unique<autograd::WeightGradQueue>();
      put_off_scope_ = std::make_unique<autograd::WeightGradQueue::ActiveScope>(f.weight_grads.get());
    }
  }
  open_backward_ = {a.micro_batch, a.chunk};
  open_backward_start_ = start;
  return surrogate;
}

// After the backward NextBackward returned has run (the next call, or the end of the step).
void PipelineStrategy::CloseBackward() {
  if (open_backward_.first < 0) return;
  put_off_scope_.reset();
  InFlight& f = flight_[open_backward_];
  const Action a{Op::kBackward, open_backward_.first, open_backward_.second};
  BRAID_CHECK(f.weight_grads == nullptr) << "weight gradients put off and never computed";
  if (!f.backward_recorded) {  // no input gradient to send first (the first virtual stage)
    Computed(open_backward_start_, NowS(), absl::StrCat("B", MicroBatchName(a, opts_.chunks)),
             "\"weight_gradients_put_off\":0");
  }
  f.output = Tensor();
  f.loss = Tensor();
  f.recv_grad = Tensor();
  open_backward_ = {-1, -1};
}

absl::Status PipelineStrategy::RunRest(const std::vector<Batch>& mbs, StepStats* stats) {
  for (; next_action_ < schedule_.size(); ++next_action_) {
    const Action& a = schedule_[next_action_];
    if (a.op == Op::kBackward) {
      return Error(absl::StatusCode::kInternal,
                   absl::StrCat("the data-axis strategy \"", inner()->name(), "\" ran fewer backward "
                                "passes than the schedule has (", tokens_, "); it must call the loss "
                                "function once per micro-batch it is given"));
    }
    BRAID_RETURN_IF_ERROR(Run(a, mbs, stats));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> PipelineStrategy::TrainStep(const std::vector<Batch>& micro_batches,
                                                      const LossFn&) {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "TrainStep before Setup");
  k_ = int(micro_batches.size());
  BRAID_ASSIGN_OR_RETURN(schedule_, MakeSchedule(opts_.schedule, {stages_, k_, opts_.chunks}, stage_));
  if (opts_.split_backward) schedule_ = SplitBackward(schedule_);
  tokens_ = 0;
  for (const Action& a : schedule_) tokens_ += a.op == Op::kBackward ? 1 : 0;
  next_action_ = 0;
  status_ = absl::OkStatus();
  const double step_start = NowS();
  StepStats stats;
  for (Tie& t : ties_) {
    t.seen = 0;
    if (!t.owner) t.param.ZeroGrad();  // a copy is outside the view the data-axis layer zeroes
  }
  flight_.clear();
  events_.clear();
  step_busy_ = step_first_ = step_last_ = step_grad_in_ = step_grad_out_ = 0;
  act_base_ = GetMemoryStats(device_).current_bytes;
  // One token per backward action; the layer reduces, clips (the norm summed over the stages)
  // and steps the view's parameters.
  std::vector<Batch> tokens;
  for (int i = 0; i < tokens_; ++i) tokens.push_back(micro_batches[size_t(i % k_)]);
  absl::StatusOr<StepStats> data_step = inner()->TrainStep(tokens, [this, &micro_batches, &stats](Module&, const Batch&) {
    return NextBackward(micro_batches, &stats);
  });
  CloseBackward();
  absl::Status rest = status_.ok() && data_step.ok() ? RunRest(micro_batches, &stats) : absl::OkStatus();
  double comm_start = NowS();
  // The sent tensors are rewritten only by later device work (the communicator keeps them
  // alive): on NCCL the compute stream waits for the sends, not the host.
  for (auto& w : sends_) (void)w->WaitOnDevice();
  for (auto& w : tie_works_) (void)w->WaitOnDevice();
  sends_.clear();
  tie_works_.clear();
  flight_.clear();
  BRAID_RETURN_IF_ERROR(status_);
  if (!data_step.ok()) return data_step.status();
  BRAID_RETURN_IF_ERROR(rest);
  RefreshTiesAtNextForward();
  stats.comm_exposed_s = data_step->comm_exposed_s + (NowS() - comm_start);
  stats.backward_s = data_step->backward_s;
  stats.optimizer_s = data_step->optimizer_s;
  stats.grad_norm = data_step->grad_norm;
  stats.comm_bytes = data_step->comm_bytes;
  stats.comm_bytes_overlapped = data_step->comm_bytes_overlapped;
  stats.comm_what = data_step->comm_what.empty() ? "" : absl::StrCat(data_step->comm_what, " over each stage's replicas");
  const double opt_start = NowS() - stats.optimizer_s;
  // Every stage reports the loss the data-axis layer read: the last stage's, handed to the
  // others on the device before that read (Setup).
  const size_t p = size_t(stages_);
  stats.loss = data_step->loss;
  if (steps_ > 0) {
    busy_s_ += step_busy_;
    step_s_ += NowS() - step_start;
    ++measured_steps_;
    // One all-reduce over the pipeline carries what one stage alone knows, added to the others'
    // zeros: every stage's busy time (summed) and each stage's own timings for the span
    // (SpanOfStep). Durations from each rank's own first compute, not clock readings, so ranks
    // need no common clock. On the device, written by fills (a copy from host memory would
    // wait for the device), and read only by the summary (FoldTimings): no step waits for it.
    Tensor t = Tensor::Zeros({int64_t(1 + 3 * p)}, DType::kF32, device_);
    const int64_t mine = 1 + 3 * int64_t(stage_);
    t.FlatRange(0, 1).Fill(float(step_busy_));
    t.FlatRange(mine, 1).Fill(float(step_last_ - step_first_));
    t.FlatRange(mine + 1, 1).Fill(float(step_grad_in_ - step_first_));
    t.FlatRange(mine + 2, 1).Fill(float(step_grad_out_ - step_first_));
    if (stages_ > 1) BRAID_RETURN_IF_ERROR(pipe_->AllReduce(t, ReduceOp::kSum)->Wait());
    timings_on_device_.push_back(t);
    if (timings_on_device_.size() >= kTimingsKept) FoldTimings();  // one read per kTimingsKept steps
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
    path.replace(at, key.size(), std::to_string(world_rank_));
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

// The measured steps' timings kept on the device, read in one read and added into the span and
// the pipeline's busy time.
void PipelineStrategy::FoldTimings() const {
  if (timings_on_device_.empty()) return;
  const size_t p = size_t(stages_), width = 1 + 3 * p;
  const std::vector<float> all = ReadValues(timings_on_device_);
  for (size_t k = 0; k < timings_on_device_.size(); ++k) {
    const float* row = all.data() + k * width;
    std::vector<float> e(p), r(p), s(p);
    for (size_t q = 0; q < p; ++q) {
      e[q] = row[1 + 3 * q];
      r[q] = row[1 + 3 * q + 1];
      s[q] = row[1 + 3 * q + 2];
    }
    pipe_busy_s_ += row[0];
    span_s_ += SpanOfStep(e, r, s);
  }
  timings_on_device_.clear();
}

// The bubble as the formula means it: the share of the schedule's span the stages spend not
// computing, over all stages (1 - the stages' summed forward, backward and weight-gradient time /
// (P x span)), the span running from stage 0's first forward to the end of the last compute of
// any stage (SpanOfStep). Waiting for a message,
// posting one, and stages of unequal speed all count as bubble; the per-step work outside the
// span (zeroing gradients, the tied-weight and data-parallel reductions, the optimizer step)
// does not, and is reported beside it as its share of this rank's step.
std::vector<std::string> PipelineStrategy::SummaryLines() const {
  FoldTimings();
  std::vector<std::string> lines = WrappingStrategy::SummaryLines();
  if (measured_steps_ == 0 || span_s_ <= 0) return lines;
  const double bubble = 1 - pipe_busy_s_ / (stages_ * span_s_);
  const double idle = 1 - busy_s_ / span_s_;
  const double outside = step_s_ > 0 ? 1 - span_s_ / step_s_ : 0;
  lines.push_back(absl::StrFormat(
      "pipeline (stage %d of %d, %d micro-batch(es), %s%s%s): bubble %.1f%% measured, bubble "
      "formula %.1f%% (idle share of %d stages x the schedule's span, stage 0's first forward to "
      "the last compute of any stage, steps 2..%d); this stage idle %.1f%%; outside the span (gradient zeroing, "
      "reductions, optimizer) %.1f%% of the step; peak activations held %.2f MiB",
      stage_, stages_, k_, opts_.schedule, opts_.chunks > 1 ? absl::StrCat(" x", opts_.chunks).c_str() : "",
      opts_.split_backward ? ", split backward" : "",
      100 * bubble, 100 * BubbleFormula(opts_.schedule, {stages_, k_, opts_.chunks}), stages_, steps_,
      100 * idle, 100 * outside, double(act_peak_) / (1 << 20)));
  return lines;
}

}  // namespace braid::pipeline
