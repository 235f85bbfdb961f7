// The "ddp" strategy: data parallelism in the manner of PyTorch's DistributedDataParallel.
//
// Every rank holds the whole model (made identical by a broadcast from rank 0 at Setup) and
// its own share of the batch. Gradients are averaged across ranks in buckets (flat buffers of
// several parameters' gradients) while the backward pass is still running: each parameter's
// post-accumulate-grad hook marks it ready, and a bucket's AllReduce is launched as soon as its
// last gradient is ready and every earlier bucket has been launched. Launching strictly in
// bucket order is what keeps the ranks' collectives in the same sequence even when their
// gradients become ready in different orders. At the end of the backward pass the step waits
// only for the reductions still in flight.
//
// The buckets, the hooks and the reductions -- the gradient reducer -- are in ddp_reducer.h,
// with the bucket layout and the flags that let every rank reach the same verdict. This file
// holds the strategy around it: options, Setup, the training step and its timeline,
// checkpoints.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/config/sections.pb.h"
#include "core/autograd.h"
#include "core/broadcast.h"
#include "core/communicator.h"
#include "core/micro_batches.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "plugins/ddp/chrome_trace.h"
#include "plugins/ddp/ddp_reducer.h"
#include "plugins/ddp/ddp_trace.h"
#include "plugins/ddp/ddp_util.h"

namespace braid::ddp {
namespace {

constexpr char kName[] = "ddp";

// ---- Options ------------------------------------------------------------------------------

struct Options {
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = true;
  std::string trace_file;
  int trace_steps = 10;
};

const std::vector<std::string>& KnownOptions() {
  static const auto* known =
      new std::vector<std::string>{"bucket_cap_mb",   "find_unused_parameters",
                                   "first_bucket_mb", "gradient_as_bucket_view",
                                   "trace_file",      "trace_steps"};
  return *known;
}

absl::StatusOr<Options> ParseOptions(const std::map<std::string, std::string>& in) {
  Options o;
  auto bad = [](const std::string& key, const std::string& value, const char* want) {
    return Error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("option ", key, "='", value, "' must be ", want));
  };
  for (const auto& [key, value] : in) {
    if (key == "bucket_cap_mb" || key == "first_bucket_mb") {
      double mb = 0;
      if (!absl::SimpleAtod(value, &mb) || !(mb > 0) || !std::isfinite(mb)) {
        return bad(key, value, "a positive number of MiB");
      }
      (key == "bucket_cap_mb" ? o.bucket_cap_mb : o.first_bucket_mb) = mb;
    } else if (key == "find_unused_parameters" || key == "gradient_as_bucket_view") {
      bool b = false;
      if (!absl::SimpleAtob(value, &b)) return bad(key, value, "true or false");
      (key == "find_unused_parameters" ? o.find_unused_parameters : o.gradient_as_bucket_view) = b;
    } else if (key == "trace_file") {
      if (value.empty()) return bad(key, value, "a file path");
      o.trace_file = value;
    } else if (key == "trace_steps") {
      if (!absl::SimpleAtoi(value, &o.trace_steps) || o.trace_steps < 1) {
        return bad(key, value, "a positive integer");
      }
    } else {
      return Error(absl::StatusCode::kInvalidArgument,
                   absl::StrCat("unknown option '", key,
                                "'; known options: ", absl::StrJoin(KnownOptions(), ", ")));
    }
  }
  return o;
}

// One trace file per rank: "{rank}" in the path is replaced, or else "-rank<r>" is inserted
// before a ".json" suffix when there are several ranks.
std::string TracePath(const std::string& pattern, int rank, int size) {
  if (pattern.find("{rank}") != std::string::npos) {
    return absl::StrReplaceAll(pattern, {{"{rank}", absl::StrCat(rank)}});
  }
  if (size == 1) return pattern;
  const std::string suffix = ".json";
  if (pattern.size() > suffix.size() &&
      pattern.compare(pattern.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return absl::StrCat(pattern.substr(0, pattern.size() - suffix.size()), "-rank", rank, suffix);
  }
  return absl::StrCat(pattern, "-rank", rank);
}

// FNV-1a over what must match across ranks before a broadcast can make them equal.
class Fingerprint {
 public:
  void Add(const std::string& s) {
    for (unsigned char c : s) Byte(c);
    Byte(0xff);
  }
  void Add(int64_t v) {
    for (int i = 0; i < 8; ++i) Byte(uint8_t(uint64_t(v) >> (8 * i)));
  }
  // 62 bits: the value and its negation both fit an int64 (one max-reduction gives min and max).
  int64_t value() const { return int64_t(h_ >> 2); }

 private:
  void Byte(uint8_t b) {
    h_ ^= b;
    h_ *= 1099511628211ull;
  }
  uint64_t h_ = 14695981039346656037ull;
};

// ---- The strategy ---------------------------------------------------------------------------

class DdpStrategy final : public Strategy, public DdpIntrospection {
 public:
  DdpStrategy() = default;
  ~DdpStrategy() override {
    if (!trace_path_.empty() && trace_dirty_) WriteTrace();
  }

  std::string name() const override { return kName; }

  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override;
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override;
  // Every rank holds the whole model: Setup adopts it with the optimizer and this group, and
  // Strategy's defaults answer the optimizer, the full state, evaluation, the data shard and the
  // checkpoint chunks (rank 0 writes).

  std::vector<TraceEvent> TraceEvents() const override {
    std::vector<TraceEvent> out = setup_events_;
    for (const auto& step : past_steps_) out.insert(out.end(), step.begin(), step.end());
    return out;
  }
  std::vector<BucketInfo> Buckets() const override {
    if (reducer_ == nullptr) return {};
    return reducer_->Buckets();
  }
  bool BucketsRebuilt() const override { return reducer_ != nullptr && reducer_->rebuilt(); }

 private:
  absl::Status CheckSameModelEverywhere(Module& model);
  void RecordEvent(TraceEvent e) {
    e.step = step_;
    current_events_.push_back(std::move(e));
  }
  void EndStepTrace();
  void WriteTrace();

  Communicator* comm_ = nullptr;
  int rank_ = 0;  // kept: the communicator may be gone when the destructor writes the trace
  Options opts_;
  float max_grad_norm_ = 0;
  // The layers above's sums (the pipeline's stages, tensor parallelism's group), or null.
  std::function<void(Tensor&, Tensor&)> model_parallel_sum_on_device_;
  Device device_ = Device::CPU();
  std::unique_ptr<Reducer> reducer_;  // made at Setup: the trainable parameters and buckets

  // The step now running (one at a time, on the step's thread).
  int64_t step_ = 0;
  double backward_start_us_ = 0;

  // Timeline.
  std::vector<TraceEvent> setup_events_;
  std::vector<TraceEvent> current_events_;
  std::deque<std::vector<TraceEvent>> past_steps_;
  std::string trace_path_;
  bool trace_dirty_ = false;
};

absl::Status DdpStrategy::Setup(Module& model, const OptimizerFactory& make_optimizer,
                                const StrategyContext& ctx) {
  if (Strategy::model() != nullptr || (reducer_ != nullptr && reducer_->num_params() > 0)) {
    return Error(absl::StatusCode::kFailedPrecondition,
                 "Setup called twice (make a new strategy object to train another model)");
  }
  if (ctx.comm == nullptr) {
    return Error(absl::StatusCode::kInvalidArgument,
                 "no communicator in the strategy context (a world of one needs one too)");
  }
  if (!make_optimizer) {
    return Error(absl::StatusCode::kInvalidArgument, "no optimizer factory given");
  }
  BRAID_ASSIGN_OR_RETURN(opts_, ParseOptions(ctx.options));
  // Mixed precision (launcher/mixed_precision/mixed_precision.h) hands DDP bf16/f16 parameters; their gradients are
  // reduced in that dtype unless the config asks for f32 ("communication_data_type": "fp32"):
  // then buckets are f32, gradients are copied in (up-cast) and out (rounded once), and cannot
  // be views of a bucket of another dtype.
  bool reduce_in_f32 = false;
  if (ctx.config != nullptr && ctx.config->communication_data_type() == "fp32") {
    reduce_in_f32 = true;
    opts_.gradient_as_bucket_view = false;
  }
  comm_ = ctx.comm;
  rank_ = comm_->rank();
  max_grad_norm_ = ctx.max_grad_norm;
  model_parallel_sum_on_device_ = ctx.model_parallel_sum_on_device;
  device_ = ctx.device;
  const double setup_start = NowUs();

  for (const auto& [n, p] : model.NamedParameters()) p.MoveTo(ctx.device);
  for (const auto& [n, b] : model.NamedBuffers()) b.MoveTo(ctx.device);
  BRAID_RETURN_IF_ERROR(CheckSameModelEverywhere(model));

  // Rank 0's values everywhere: parameters (frozen ones too) and buffers, about a bucket per
  // collective.
  if (absl::Status s = BroadcastModuleState(model, *comm_, 0, int64_t(opts_.bucket_cap_mb * (1 << 20)));
      !s.ok()) {
    return Error(s.code(), absl::StrCat("at Setup: ", s.message()));
  }

  Reducer::Options reducer_opts;
  reducer_opts.bucket_cap_mb = opts_.bucket_cap_mb;
  reducer_opts.first_bucket_mb = opts_.first_bucket_mb;
  reducer_opts.find_unused_parameters = opts_.find_unused_parameters;
  reducer_opts.gradient_as_bucket_view = opts_.gradient_as_bucket_view;
  reducer_opts.reduce_in_f32 = reduce_in_f32;
  reducer_ = std::make_unique<Reducer>(model.NamedParameters(), reducer_opts, comm_,
                                       [this](TraceEvent e) { RecordEvent(std::move(e)); });

  BRAID_RETURN_IF_ERROR(Adopt(model, make_optimizer(model.NamedParameters()), comm_));

  TraceEvent e;
  e.name = "setup";
  e.start_us = setup_start;
  e.end_us = NowUs();
  setup_events_.push_back(e);
  if (!opts_.trace_file.empty()) {
    trace_path_ = TracePath(opts_.trace_file, comm_->rank(), comm_->size());
    // Fail now, not after hours of training, when the trace cannot be written.
    absl::Status s = WriteFileAtomically(trace_path_, ChromeTraceJson(TraceEvents(), rank_));
    if (!s.ok()) {
      return Error(s.code(), absl::StrCat("option trace_file: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status DdpStrategy::CheckSameModelEverywhere(Module& model) {
  Fingerprint fp;
  auto add = [&fp](const std::string& kind, const std::string& name, const Tensor& t) {
    fp.Add(kind);
    fp.Add(name);
    fp.Add(int64_t(t.dtype()));
    fp.Add(int64_t(t.requires_grad()));
    for (int64_t d : t.shape()) fp.Add(d);
  };
  for (const auto& [n, p] : model.NamedParameters()) add("param", n, p);
  for (const auto& [n, b] : model.NamedBuffers()) add("buffer", n, b);
  const int64_t h = fp.value();
  // On the model's device: NCCL moves device memory only (a copy there and back, once, at Setup).
  Tensor t = Tensor::FromVector<int64_t>({h, -h}, {2}).To(device_);
  absl::Status s = comm_->AllReduce(t, ReduceOp::kMax)->Wait();
  if (!s.ok()) {
    return Error(s.code(), absl::StrCat("comparing the ranks' models at Setup: ", s.message()));
  }
  std::vector<int64_t> r = t.ToVector<int64_t>();
  if (r[0] != h || -r[1] != h) {
    return Error(absl::StatusCode::kFailedPrecondition,
                 absl::StrCat("the ranks' models differ (parameter or buffer names, shapes, "
                              "dtypes or requires_grad; rank ",
                              comm_->rank(), " has ", model.NamedParameters().size(),
                              " parameters): every rank must build the same model"));
  }
  return absl::OkStatus();
}


absl::StatusOr<StepStats> DdpStrategy::TrainStep(const std::vector<Batch>& micro_batches,
                                                 const LossFn& loss_fn) {
  if (model() == nullptr) {
    return Error(absl::StatusCode::kFailedPrecondition, "TrainStep before Setup");
  }
  if (micro_batches.empty()) {
    return Error(absl::StatusCode::kInvalidArgument, "TrainStep got no micro-batches");
  }
  StepStats stats;
  BRAID_RETURN_IF_ERROR(reducer_->BeginStep(step_));
  // The shared micro-batch loop (core/micro_batches.h); DDP's part is in the events: only the
  // last micro-batch's backward reduces (no_sync before it), and the trace records each phase.
  TraceEvent fwd;
  MicroBatchEvents events;
  events.before_forward = [&](int i, bool last) {
    reducer_->BeginPass(last);
    fwd = TraceEvent();
    fwd.name = "forward";
    fwd.micro_batch = i;
    fwd.start_us = NowUs();
  };
  events.on_bad_loss = [&](int) {
    // Still take part in this step's reductions (flagged as abandoned) so that the other ranks
    // are not left waiting; they return an error too.
    reducer_->AbandonStep();
  };
  events.before_backward = [&](int, bool last, const Tensor& loss) {
    fwd.end_us = NowUs();
    RecordEvent(fwd);
    if (last && opts_.find_unused_parameters) reducer_->MarkUnreachableReady(loss);
    backward_start_us_ = NowUs();
  };
  events.after_backward = [&](int i, bool last) {
    if (last && !reducer_->finished()) {
      reducer_->FinishSyncPass();  // no gradient reached any parameter
    }
    const double end = NowUs();
    reducer_->EndPass();
    TraceEvent bwd;
    bwd.name = "backward";
    bwd.micro_batch = i;
    bwd.start_us = backward_start_us_;
    bwd.end_us = last ? reducer_->backward_end_us() : end;
    RecordEvent(bwd);
    if (!last) return;
    // Waiting for the reductions after backward is exposed communication, not backward time.
    stats.comm_exposed_s += (reducer_->waited_us() - reducer_->backward_end_us()) * 1e-6;
    TraceEvent wait;
    wait.name = "wait_comm";
    wait.start_us = reducer_->backward_end_us();
    wait.end_us = reducer_->waited_us();
    RecordEvent(wait);
    TraceEvent unpack;
    unpack.name = "unpack_grads";
    unpack.start_us = reducer_->waited_us();
    unpack.end_us = reducer_->unpacked_us();
    RecordEvent(unpack);
    reducer_->AddBucketStats(&stats);
  };
  events.read_loss_later = true;  // read with the norm below
  absl::Status local_error =
      RunMicroBatches(name(), *model(), micro_batches, loss_fn, &stats, events);
  reducer_->EndPass();

  absl::Status status = reducer_->comm_status();
  if (!status.ok()) {
    // A reduction failed: no further collective on this communicator.
    if (!local_error.ok()) status = local_error;
  } else {
    TraceEvent opt;
    opt.name = "optimizer";
    opt.start_us = NowUs();
    // The step's one read (on a GPU: its one synchronisation of the device, core/micro_batches.h):
    // the loss, the norm of the averaged gradient (measured always; clipped to max_grad_norm_
    // when clipping is on), the optimizer's checks and every bucket's flags, which decide,
    // before anything is clipped or stepped, whether the step stands on every rank. A rank whose
    // own loss was bad reads too, so that the collectives before the read (the norm's sum over
    // other groups, mixed precision's overflow agreement) stay matched across the ranks.
    std::vector<Tensor> trainable = reducer_->Parameters();
    status = ReadStepScalarsAndClip(
        *optimizer(), trainable, max_grad_norm_, device_,
        [this, &stats](Tensor& squared) {
          if (model_parallel_sum_on_device_) model_parallel_sum_on_device_(squared, stats.device_loss);
        },
        /*global_sum=*/nullptr,
        reducer_->ValuesToRead(),
        [&](const std::vector<float>& values) -> absl::Status {
          reducer_->Decide(values);
          if (!local_error.ok()) return local_error;
          if (reducer_->peer_failed()) {
            return Error(absl::StatusCode::kAborted,
                         absl::StrCat("step ", step_,
                                      " was abandoned by another rank (its error says why); no "
                                      "update was made"));
          }
          return reducer_->unused_status();
        },
        &stats);
    if (status.ok()) {
      optimizer()->Step();
      opt.end_us = NowUs();
      RecordEvent(opt);
      stats.optimizer_s = (opt.end_us - opt.start_us) * 1e-6;
    }
  }
  EndStepTrace();
  ++step_;
  if (!status.ok()) return status;
  return stats;
}

void DdpStrategy::EndStepTrace() {
  past_steps_.push_back(std::move(current_events_));
  current_events_.clear();
  while (int(past_steps_.size()) > opts_.trace_steps) past_steps_.pop_front();
  if (trace_path_.empty()) return;
  trace_dirty_ = true;
  // Every step of the first window (a short or crashed run still leaves its trace), then once
  // per window; the destructor writes whatever is left.
  if (step_ < opts_.trace_steps || (step_ + 1) % opts_.trace_steps == 0) WriteTrace();
}

void DdpStrategy::WriteTrace() {
  absl::Status s = WriteFileAtomically(trace_path_, ChromeTraceJson(TraceEvents(), rank_));
  if (!s.ok()) {
    // Not worth failing (and desynchronising) training over: say so once per write.
    std::fprintf(stderr, "strategy 'ddp': %s\n", std::string(s.message()).c_str());
  }
  trace_dirty_ = false;
}

}  // namespace
}  // namespace braid::ddp

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy(
      braid::ddp::kName, [] { return std::make_unique<braid::ddp::DdpStrategy>(); },
      // Half parameters (launcher/mixed_precision/mixed_precision.h), and their gradients reduced in f32 on request;
      // what a config of several data-parallel ranks that names no strategy trains with.
      braid::StrategyTraits{{"fp16", "bf16", "communication_data_type"}, {}, "", 0,
                            braid::StrategyTraits::DefaultFor::kSeveralDataRanks});
  return s.ok() ? 0 : 1;
}
