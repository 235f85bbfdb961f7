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
// The layout starts in reverse registration order (roughly the order backward produces
// gradients) and is rebuilt once, after the first step, in the order gradients actually became
// ready on rank 0 (broadcast, so that every rank uses the same layout).
//
// Each bucket carries, after its gradients, one flag per parameter (1: this rank produced a
// gradient for it this step) and one "step ok" flag. They are averaged with the gradients, so
// every rank learns, at no extra collective, which parameters some rank left without a gradient
// and whether some rank abandoned the step; all ranks therefore reach the same verdict and return
// the same error instead of one rank skipping a collective the others wait for. The flags are
// exact in f32; in 16-bit buckets they stay reliable up to a few hundred ranks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/config/train_config.pb.h"
#include "core/autograd.h"
#include "core/communicator.h"
#include "core/micro_batches.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "plugins/ddp/chrome_trace.h"
#include "plugins/ddp/ddp_buckets.h"
#include "plugins/ddp/ddp_trace.h"

namespace braid::ddp {
namespace {

constexpr char kName[] = "ddp";

double NowUs() { return absl::ToDoubleMicroseconds(absl::Now() - absl::UnixEpoch()); }

absl::Status Error(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat("strategy 'ddp': ", msg));
}

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
    for (Param& p : params_) {
      if (p.hook_id != 0) p.tensor.RemoveHook(p.hook_id);
    }
    if (!trace_path_.empty() && trace_dirty_) WriteTrace();
  }

  std::string name() const override { return kName; }

  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override;
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override;
  Optimizer* optimizer() override { return optimizer_.get(); }
  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override {
    if (model_ == nullptr) {
      return Error(absl::StatusCode::kFailedPrecondition, "FullStateDict before Setup");
    }
    return model_->StateDict();  // every rank holds the whole, identical model
  }
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override {
    if (model_ == nullptr) {
      return Error(absl::StatusCode::kFailedPrecondition, "LoadFullStateDict before Setup");
    }
    return model_->LoadStateDict(state, /*strict=*/true);  // every rank loads the same values
  }
  // Every rank holds the same model and optimizer state: rank 0 writes it, all read it.
  absl::StatusOr<std::vector<StateChunk>> StateChunks(bool create) override {
    if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "StateChunks before Setup");
    return WholeModelChunks(*model_, *optimizer_, create, comm_ == nullptr || comm_->rank() == 0);
  }
  absl::Status AfterStateLoaded(const std::vector<StateChunk>& chunks) override {
    RestoreOptimizerStep(*optimizer_, chunks);
    return absl::OkStatus();
  }
  int data_parallel_rank() const override { return comm_ ? comm_->rank() : 0; }
  int data_parallel_size() const override { return comm_ ? comm_->size() : 1; }
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "Evaluate before Setup");
    autograd::NoGradGuard no_grad;
    eval(*model_);
    return absl::OkStatus();
  }

  std::vector<TraceEvent> TraceEvents() const override {
    std::vector<TraceEvent> out = setup_events_;
    for (const auto& step : past_steps_) out.insert(out.end(), step.begin(), step.end());
    return out;
  }
  std::vector<BucketInfo> Buckets() const override {
    std::vector<BucketInfo> out;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      BucketInfo info;
      info.index = int(b);
      for (int i : buckets_[b].params) info.params.push_back(params_[size_t(i)].name);
      info.grad_bytes = buckets_[b].numel * int64_t(SizeOf(buckets_[b].dtype));
      out.push_back(std::move(info));
    }
    return out;
  }
  bool BucketsRebuilt() const override { return rebuilt_; }

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
    int pending = 0;    // parameters not yet ready in this pass
    std::shared_ptr<Work> work;
    double ready_us = 0, launch_us = 0, done_us = 0;
  };

  // The dtype a parameter's gradient is reduced in.
  DType BucketDType(const Tensor& t) const {
    return reduce_in_f32_ && IsFloating(t.dtype()) ? DType::kF32 : t.dtype();
  }
  bool reduce_in_f32_ = false;

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

  absl::Status CheckSameModelEverywhere(Module& model);
  absl::Status BroadcastFromRank0(const std::vector<Tensor>& tensors);
  void BuildBuckets(const std::vector<int>& order);
  absl::Status RebuildBuckets();
  void PrepareGrads();
  void BeginPass(bool sync);
  void OnGradReady(int index);
  void MarkReady(int index);
  void LaunchReadyBuckets();
  void PollCompleted();
  void MarkUnreachableReady(const Tensor& loss);
  void FinishSyncPass();
  void Unpack();
  void RecordEvent(TraceEvent e) {
    e.step = step_;
    current_events_.push_back(std::move(e));
  }
  void EndStepTrace();
  void WriteTrace();

  Module* model_ = nullptr;
  Communicator* comm_ = nullptr;
  int rank_ = 0;  // kept: the communicator may be gone when the destructor writes the trace
  Options opts_;
  std::unique_ptr<Optimizer> optimizer_;
  float max_grad_norm_ = 0;
  std::function<double(double)> model_parallel_sum_;  // tensor parallelism's, or null
  std::vector<Param> params_;  // trainable parameters, registration order
  std::vector<Bucket> buckets_;
  bool rebuilt_ = false;
  bool rebuild_pending_ = false;
  std::vector<int> ready_order_;  // of the first synchronising pass, until the rebuild
  bool recording_order_ = true;

  // State of the backward pass now running (one at a time, on the step's thread).
  int64_t step_ = 0;
  bool in_pass_ = false;
  bool sync_pass_ = false;
  bool finish_queued_ = false;
  bool finished_ = false;
  float step_ok_ = 1;  // 0 once this rank abandoned the step
  size_t next_launch_ = 0, next_done_ = 0;
  double backward_start_us_ = 0, backward_end_us_ = 0, waited_us_ = 0, unpacked_us_ = 0;
  absl::Status comm_status_;
  absl::Status unused_status_;
  bool peer_failed_ = false;

  // Timeline.
  std::vector<TraceEvent> setup_events_;
  std::vector<TraceEvent> current_events_;
  std::deque<std::vector<TraceEvent>> past_steps_;
  std::string trace_path_;
  bool trace_dirty_ = false;
};

absl::Status DdpStrategy::Setup(Module& model, const OptimizerFactory& make_optimizer,
                                const StrategyContext& ctx) {
  if (model_ != nullptr || !params_.empty()) {
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
  // Mixed precision (core/mixed_precision.h) hands DDP bf16/f16 parameters; their gradients are
  // reduced in that dtype unless the config asks for f32 ("communication_data_type": "fp32"):
  // then buckets are f32, gradients are copied in (up-cast) and out (rounded once), and cannot
  // be views of a bucket of another dtype.
  if (ctx.config != nullptr && ctx.config->communication_data_type() == "fp32") {
    reduce_in_f32_ = true;
    opts_.gradient_as_bucket_view = false;
  }
  comm_ = ctx.comm;
  rank_ = comm_->rank();
  max_grad_norm_ = ctx.max_grad_norm;
  model_parallel_sum_ = ctx.model_parallel_sum;
  const double setup_start = NowUs();

  for (const auto& [n, p] : model.NamedParameters()) p.MoveTo(ctx.device);
  for (const auto& [n, b] : model.NamedBuffers()) b.MoveTo(ctx.device);
  BRAID_RETURN_IF_ERROR(CheckSameModelEverywhere(model));

  // Rank 0's values everywhere: parameters (frozen ones too) and buffers.
  std::vector<Tensor> state;
  for (const auto& [n, p] : model.NamedParameters()) state.push_back(p);
  for (const auto& [n, b] : model.NamedBuffers()) state.push_back(b);
  BRAID_RETURN_IF_ERROR(BroadcastFromRank0(state));

  for (const auto& [n, p] : model.NamedParameters()) {
    if (!p.requires_grad()) continue;
    Param param;
    param.name = n;
    param.tensor = p;
    params_.push_back(std::move(param));
  }
  std::vector<int> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(order.size() - 1 - i);
  BuildBuckets(order);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].hook_id = params_[i].tensor.RegisterPostAccumulateGradHook(
        [this, i](Tensor&) { OnGradReady(int(i)); });
  }

  optimizer_ = make_optimizer(model.NamedParameters());
  if (optimizer_ == nullptr) {
    return Error(absl::StatusCode::kInvalidArgument, "the optimizer factory returned null");
  }
  model_ = &model;

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
  Tensor t = Tensor::FromVector<int64_t>({h, -h}, {2});
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

absl::Status DdpStrategy::BroadcastFromRank0(const std::vector<Tensor>& tensors) {
  // Coalesced into flat chunks of one dtype and device, at most about one bucket each.
  const int64_t cap = int64_t(opts_.bucket_cap_mb * (1 << 20));
  std::map<std::pair<int, std::string>, std::vector<Tensor>> groups;
  for (const Tensor& t : tensors) {
    groups[{int(t.dtype()), t.device().ToString()}].push_back(t);
  }
  autograd::NoGradGuard no_grad;
  for (auto& [key, members] : groups) {
    size_t begin = 0;
    while (begin < members.size()) {
      size_t end = begin;
      int64_t numel = 0;
      while (end < members.size() &&
             (end == begin ||
              (numel + members[end].numel()) * int64_t(SizeOf(members[end].dtype())) <= cap)) {
        numel += members[end].numel();
        ++end;
      }
      Tensor flat = Tensor::Empty({numel}, members[begin].dtype(), members[begin].device());
      int64_t off = 0;
      for (size_t i = begin; i < end; ++i) {
        flat.FlatRange(off, members[i].numel()).CopyFrom(members[i]);
        off += members[i].numel();
      }
      absl::Status s = comm_->Broadcast(flat, 0)->Wait();
      if (!s.ok()) {
        return Error(s.code(),
                     absl::StrCat("broadcasting rank 0's parameters at Setup: ", s.message()));
      }
      off = 0;
      for (size_t i = begin; i < end; ++i) {
        Tensor dst = members[i];
        dst.CopyFrom(flat.FlatRange(off, members[i].numel()));
        off += members[i].numel();
      }
      begin = end;
    }
  }
  return absl::OkStatus();
}

void DdpStrategy::BuildBuckets(const std::vector<int>& order) {
  std::map<std::pair<int, std::string>, int> keys;
  std::vector<BucketableParam> sizes;
  for (const Param& p : params_) {
    auto key = std::make_pair(int(BucketDType(p.tensor)), p.tensor.device().ToString());
    int id = keys.emplace(key, int(keys.size())).first->second;
    sizes.push_back(BucketableParam{int64_t(p.tensor.nbytes()), id});
  }
  std::vector<std::vector<int>> assignment =
      AssignBuckets(sizes, order, int64_t(opts_.first_bucket_mb * (1 << 20)),
                    int64_t(opts_.bucket_cap_mb * (1 << 20)));
  buckets_.clear();
  for (auto& members : assignment) {
    Bucket b;
    b.params = std::move(members);
    const Tensor& first = params_[size_t(b.params[0])].tensor;
    b.dtype = BucketDType(first);
    b.device = first.device();
    for (size_t s = 0; s < b.params.size(); ++s) {
      Param& p = params_[size_t(b.params[s])];
      p.bucket = int(buckets_.size());
      p.slot = int(s);
      p.offset = b.numel;
      b.numel += p.tensor.numel();
    }
    b.flat = Tensor::Zeros({b.numel + int64_t(b.params.size()) + 1}, b.dtype, b.device);
    buckets_.push_back(std::move(b));
  }
}

absl::Status DdpStrategy::RebuildBuckets() {
  const double start = NowUs();
  // Rank 0's order for everyone: ranks may see gradients become ready in different orders.
  std::vector<int64_t> order(ready_order_.begin(), ready_order_.end());
  BRAID_CHECK_EQ(order.size(), params_.size()) << "every parameter is marked ready once per pass";
  Tensor t = Tensor::FromVector<int64_t>(order, {int64_t(order.size())});
  absl::Status s = comm_->Broadcast(t, 0)->Wait();
  if (!s.ok()) {
    return Error(s.code(), absl::StrCat("broadcasting the bucket order: ", s.message()));
  }
  std::vector<int> agreed;
  for (int64_t i : t.ToVector<int64_t>()) agreed.push_back(int(i));
  BuildBuckets(agreed);
  rebuilt_ = true;
  rebuild_pending_ = false;
  ready_order_.clear();
  ready_order_.shrink_to_fit();
  TraceEvent e;
  e.name = "rebuild_buckets";
  e.start_us = start;
  e.end_us = NowUs();
  RecordEvent(e);
  return absl::OkStatus();
}

void DdpStrategy::PrepareGrads() {
  for (Param& p : params_) {
    p.used = false;
    if (opts_.gradient_as_bucket_view) {
      // Backward accumulates straight into the bucket: no copy in, no copy out.
      if (!GradIsBucketView(p)) p.tensor.set_grad(GradSlot(p));
    } else {
      p.tensor.ZeroGrad();
    }
  }
  if (opts_.gradient_as_bucket_view) {
    for (Bucket& b : buckets_) b.flat.Zero();
  }
}

void DdpStrategy::BeginPass(bool sync) {
  in_pass_ = true;
  sync_pass_ = sync;
  finish_queued_ = false;
  finished_ = false;
  for (Param& p : params_) p.ready = false;
  for (Bucket& b : buckets_) {
    b.pending = int(b.params.size());
    b.work.reset();
    b.ready_us = b.launch_us = b.done_us = 0;
  }
  next_launch_ = next_done_ = 0;
}

void DdpStrategy::OnGradReady(int index) {
  if (!in_pass_) return;  // a backward pass that is not part of a training step
  Param& p = params_[size_t(index)];
  p.used = true;
  if (!sync_pass_) {
    p.ready = true;  // accumulating locally (no_sync); nothing to communicate yet
    return;
  }
  BRAID_CHECK(!p.ready) << "gradient of " << p.tensor.DescribeForError()
                        << " reported ready twice in one backward pass";
  if (!finish_queued_) {
    finish_queued_ = true;
    autograd::QueueEndOfBackwardCallback([this] { FinishSyncPass(); });
  }
  MarkReady(index);
}

void DdpStrategy::MarkReady(int index) {
  Param& p = params_[size_t(index)];
  p.ready = true;
  if (recording_order_) ready_order_.push_back(index);
  if (p.used) {
    if (!GradIsBucketView(p)) GradSlot(p).CopyFrom(p.tensor.grad());
  } else if (!opts_.gradient_as_bucket_view) {
    GradSlot(p).Zero();  // counts as zero (the slot still holds the previous step's average)
  }
  Bucket& b = buckets_[size_t(p.bucket)];
  if (--b.pending == 0) {
    b.ready_us = NowUs();
    LaunchReadyBuckets();
  }
}

void DdpStrategy::LaunchReadyBuckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    std::vector<float> flags;
    flags.reserve(b.params.size() + 1);
    for (int i : b.params) flags.push_back(params_[size_t(i)].used ? 1.0f : 0.0f);
    flags.push_back(step_ok_);
    b.flat.FlatRange(b.numel, int64_t(flags.size()))
        .CopyFrom(Tensor::FromVector(flags, {int64_t(flags.size())}));
    b.launch_us = NowUs();
    b.work = comm_->AllReduce(b.flat, ReduceOp::kAvg);
    ++next_launch_;
  }
  PollCompleted();
}

void DdpStrategy::PollCompleted() {
  while (next_done_ < next_launch_ && buckets_[next_done_].work->IsCompleted()) {
    buckets_[next_done_].done_us = NowUs();
    ++next_done_;
  }
}

void DdpStrategy::MarkUnreachableReady(const Tensor& loss) {
  // As PyTorch does after forward with find_unused_parameters: parameters the loss does not
  // depend on will get no gradient, so they are ready (as zeros) before backward starts, and
  // their buckets need not wait for the end of the pass.
  std::set<const autograd::Node*> seen;
  std::vector<const autograd::Node*> stack;
  if (loss.grad_fn()) {
    seen.insert(loss.grad_fn().get());
    stack.push_back(loss.grad_fn().get());
  }
  while (!stack.empty()) {
    const autograd::Node* n = stack.back();
    stack.pop_back();
    for (const autograd::Edge& e : n->next_edges) {
      if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const autograd::Node* acc = params_[i].tensor.impl()->grad_accumulator.get();
    if (acc == nullptr || !seen.count(acc)) MarkReady(int(i));
  }
}

void DdpStrategy::FinishSyncPass() {
  if (finished_) return;
  finished_ = true;
  backward_end_us_ = NowUs();
  // Parameters that got no gradient in this pass: ready now (zeros unless an earlier
  // micro-batch gave them one), in bucket order so that launches keep their sequence.
  for (const Bucket& b : buckets_) {
    for (int i : b.params) {
      if (!params_[size_t(i)].ready) MarkReady(i);
    }
  }
  BRAID_CHECK_EQ(next_launch_, buckets_.size())
      << "every bucket is launched by the end of backward";
  for (; next_done_ < buckets_.size(); ++next_done_) {
    Bucket& b = buckets_[next_done_];
    absl::Status s = b.work->Wait();
    b.done_us = NowUs();
    if (!s.ok() && comm_status_.ok()) {
      comm_status_ = Error(s.code(), absl::StrCat("gradient reduction of bucket ", next_done_,
                                                  " in step ", step_, ": ", s.message()));
    }
  }
  waited_us_ = NowUs();
  if (comm_status_.ok()) Unpack();
  unpacked_us_ = NowUs();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    TraceEvent e;
    e.name = "allreduce";
    e.lane = Lane::kComm;
    e.bucket = int(i);
    e.bytes = b.flat.nbytes();
    e.ready_us = b.ready_us;
    e.start_us = b.launch_us;
    e.end_us = b.done_us;
    RecordEvent(e);
  }
  if (recording_order_) {
    // The readiness order of the first clean step (the same verdict on every rank: peer_failed_
    // comes from the reduced flags) decides the rebuilt layout.
    if (comm_status_.ok() && !peer_failed_) {
      recording_order_ = false;
      rebuild_pending_ = !rebuilt_;
    } else {
      ready_order_.clear();
    }
  }
}

void DdpStrategy::Unpack() {
  const double n = comm_->size();
  const double all = 1.0 - 0.5 / n, none = 0.5 / n;  // thresholds on averaged 0/1 flags
  std::vector<std::string> missing;
  for (const Bucket& b : buckets_) {
    std::vector<float> flags =
        b.flat.FlatRange(b.numel, int64_t(b.params.size()) + 1).ToFloatVector();
    if (flags.back() < all) peer_failed_ = true;
    for (size_t s = 0; s < b.params.size(); ++s) {
      Param& p = params_[size_t(b.params[s])];
      const double used = flags[s];
      if (used < all && !opts_.find_unused_parameters) {
        const int ranks_without = int(std::lround((1.0 - used) * n));
        missing.push_back(absl::StrCat("'", p.name, "' (on ", ranks_without, " of ", int(n),
                                       " ranks", p.used ? "" : ", this one included", ")"));
      }
      if (used < none) {
        // No rank produced a gradient: leave it undefined, as one process would, so that the
        // optimizer skips the parameter instead of decaying it on a zero gradient.
        p.tensor.ZeroGrad();
      } else if (!GradIsBucketView(p)) {
        Tensor g = p.tensor.grad();
        if (g.defined()) {
          g.CopyFrom(GradSlot(p));
        } else {
          p.tensor.set_grad(GradSlot(p).To(p.tensor.dtype()));  // a copy, rounded when f32 reduced
        }
      }
    }
  }
  if (!missing.empty() && !peer_failed_) {
    unused_status_ = Error(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("step ", step_, ": ", missing.size(),
                     " parameter(s) got no gradient: ", absl::StrJoin(missing, ", "),
                     ". Every parameter must contribute to the loss on every rank, or set the "
                     "strategy option find_unused_parameters=true (their gradient then counts as "
                     "zero in the average)"));
  }
}

absl::StatusOr<StepStats> DdpStrategy::TrainStep(const std::vector<Batch>& micro_batches,
                                                 const LossFn& loss_fn) {
  if (model_ == nullptr) {
    return Error(absl::StatusCode::kFailedPrecondition, "TrainStep before Setup");
  }
  if (micro_batches.empty()) {
    return Error(absl::StatusCode::kInvalidArgument, "TrainStep got no micro-batches");
  }
  StepStats stats;
  if (rebuild_pending_) {
    BRAID_RETURN_IF_ERROR(RebuildBuckets());
  }
  PrepareGrads();
  comm_status_ = absl::OkStatus();
  unused_status_ = absl::OkStatus();
  peer_failed_ = false;
  step_ok_ = 1;
  // The shared micro-batch loop (core/micro_batches.h); DDP's part is in the events: only the
  // last micro-batch's backward reduces (no_sync before it), and the trace records each phase.
  TraceEvent fwd;
  MicroBatchEvents events;
  events.before_forward = [&](int i, bool last) {
    BeginPass(last);
    fwd = TraceEvent();
    fwd.name = "forward";
    fwd.micro_batch = i;
    fwd.start_us = NowUs();
  };
  events.on_bad_loss = [&](int) {
    // Still take part in this step's reductions (flagged as abandoned) so that the other ranks
    // are not left waiting; they return an error too.
    step_ok_ = 0;
    sync_pass_ = true;
    FinishSyncPass();
  };
  events.before_backward = [&](int, bool last, const Tensor& loss) {
    fwd.end_us = NowUs();
    RecordEvent(fwd);
    if (last && opts_.find_unused_parameters) MarkUnreachableReady(loss);
    backward_start_us_ = NowUs();
  };
  events.after_backward = [&](int i, bool last) {
    if (last && !finished_) FinishSyncPass();  // no gradient reached any parameter
    const double end = NowUs();
    in_pass_ = false;
    TraceEvent bwd;
    bwd.name = "backward";
    bwd.micro_batch = i;
    bwd.start_us = backward_start_us_;
    bwd.end_us = last ? backward_end_us_ : end;
    RecordEvent(bwd);
    if (!last) return;
    // Waiting for the reductions after backward is exposed communication, not backward time.
    stats.comm_exposed_s += (waited_us_ - backward_end_us_) * 1e-6;
    TraceEvent wait;
    wait.name = "wait_comm";
    wait.start_us = backward_end_us_;
    wait.end_us = waited_us_;
    RecordEvent(wait);
    TraceEvent unpack;
    unpack.name = "unpack_grads";
    unpack.start_us = waited_us_;
    unpack.end_us = unpacked_us_;
    RecordEvent(unpack);
    for (const Bucket& b : buckets_) {
      int64_t bytes = b.numel * int64_t(SizeOf(b.dtype));
      stats.comm_bytes += bytes;
      // The share of this bucket's reduction (launch to observed completion) that ran while
      // backward was still computing; a bucket launched at the very end hides nothing.
      double span = b.done_us - b.launch_us;
      double hidden = std::min(b.done_us, backward_end_us_) - b.launch_us;
      if (b.launch_us > 0 && span > 0 && hidden > 0) {
        stats.comm_bytes_overlapped += int64_t(double(bytes) * std::min(1.0, hidden / span));
      }
    }
  };
  absl::Status local_error =
      RunMicroBatches(name(), *model_, micro_batches, loss_fn, &stats, events);
  in_pass_ = false;

  absl::Status status = !local_error.ok()    ? local_error
                        : !comm_status_.ok() ? comm_status_
                        : peer_failed_
                            ? Error(absl::StatusCode::kAborted,
                                    absl::StrCat("step ", step_,
                                                 " was abandoned by another rank "
                                                 "(its error says why); no update was made"))
                            : unused_status_;
  if (status.ok()) {
    TraceEvent opt;
    opt.name = "optimizer";
    opt.start_us = NowUs();
    // The norm of the averaged gradient, measured always (max_grad_norm_ <= 0 only measures)
    // and clipped to max_grad_norm_ when clipping is on.
    std::vector<Tensor> trainable;
    for (const Param& p : params_) trainable.push_back(p.tensor);
    // Under tensor parallelism the norm also sums over the ranks holding the other slices.
    stats.grad_norm = ClipGradNormSharded(*optimizer_, trainable, max_grad_norm_, [this](double local) {
      return model_parallel_sum_ ? model_parallel_sum_(local) : local;
    });
    optimizer_->Step();
    opt.end_us = NowUs();
    RecordEvent(opt);
    stats.optimizer_s = (opt.end_us - opt.start_us) * 1e-6;
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
      braid::StrategyTraits{{"fp16", "bf16"}});  // half parameters: core/mixed_precision.h
  return s.ok() ? 0 : 1;
}
