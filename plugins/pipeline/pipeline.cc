// The "pipeline" strategy: the model's layers (Module::PipelineLayers) cut into P stages (v
// chunks per rank for the interleaved schedule), one stage per rank; the micro-batches of a
// step flow through them as a schedule (schedule.h) says. With W = P x D ranks, rank r is stage
// r % P of data-parallel replica r / P: each stage's D copies average their gradients, and a
// weight used by two stages (GPT's wte: embedding and head) gets the sum of both stages'
// gradients, so it keeps one value. One step equals one step of one process on the global batch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/allocator.h"
#include "core/autograd.h"
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
#include "plugins/pipeline/schedule.h"
#include "plugins/pipeline/stage_optimizer.h"
#include "core/config/train_config.pb.h"

namespace braid::pipeline {
namespace {

constexpr char kName[] = "pipeline";

absl::Status Error(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat("strategy 'pipeline': ", msg));
}
absl::Status Invalid(const std::string& msg) { return Error(absl::StatusCode::kInvalidArgument, msg); }
double NowS() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

struct Options {
  int stages = 0;
  std::string schedule = "1f1b";
  int chunks = 1;                          // virtual stages per rank (interleaved)
  std::string partition = "parameters";    // "parameters", "time", "uniform", or counts "2,3,1"
  // Chrome trace of the last step, one file per rank ("{rank}" is replaced): pid = replica,
  // tid = stage, so the files of one replica opened together show one row per stage.
  std::string trace_file;
};

absl::StatusOr<Options> ParseOptions(const std::map<std::string, std::string>& options) {
  Options o;
  for (const auto& [k, v] : options) {
    if (k == "stages") {
      if (!absl::SimpleAtoi(v, &o.stages) || o.stages < 1) {
        return Invalid(absl::StrCat("option stages='", v, "' is not a number of stages >= 1"));
      }
    } else if (k == "schedule") {
      o.schedule = v;
    } else if (k == "virtual_stages") {
      if (!absl::SimpleAtoi(v, &o.chunks) || o.chunks < 1) {
        return Invalid(absl::StrCat("option virtual_stages='", v, "' is not a number >= 1"));
      }
    } else if (k == "partition") {
      o.partition = v;
    } else if (k == "trace_file") {
      o.trace_file = v;
    } else {
      return Invalid(absl::StrCat("unknown option '", k,
                                  "' (known: stages, schedule, virtual_stages, partition, trace_file)"));
    }
  }
  if (o.stages == 0) return Invalid("option stages is missing: how many pipeline stages?");
  if (o.schedule != "interleaved" && o.chunks != 1) {
    return Invalid(absl::StrCat("virtual_stages ", o.chunks, " needs schedule 'interleaved'"));
  }
  if (o.schedule != "gpipe" && o.schedule != "1f1b" && o.schedule != "interleaved") {
    return Invalid(absl::StrCat("unknown schedule '", o.schedule, "'; known: gpipe, 1f1b, interleaved"));
  }
  return o;
}

// Contiguous ranges [begin, end) of layers for each of `parts` pieces.
absl::StatusOr<std::vector<std::pair<int, int>>> Partition(const std::vector<int64_t>& cost,
                                                           int parts, const std::string& how) {
  const int n = int(cost.size());
  std::vector<int> counts;
  if (how == "uniform") {
    for (int i = 0; i < parts; ++i) counts.push_back(n / parts + (i < n % parts ? 1 : 0));
  } else if (how == "parameters") {
    // Minimise the largest piece's parameter count (dynamic programming over cut points).
    const int64_t kInf = std::numeric_limits<int64_t>::max();
    std::vector<int64_t> prefix(size_t(n) + 1, 0);
    for (int i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + cost[size_t(i)];
    std::vector<std::vector<int64_t>> best(size_t(parts) + 1, std::vector<int64_t>(size_t(n) + 1, kInf));
    std::vector<std::vector<int>> cut(size_t(parts) + 1, std::vector<int>(size_t(n) + 1, 0));
    best[0][0] = 0;
    for (int k = 1; k <= parts; ++k) {
      for (int i = k; i <= n; ++i) {
        for (int j = k - 1; j < i; ++j) {
          if (best[size_t(k) - 1][size_t(j)] == kInf) continue;
          int64_t v = std::max(best[size_t(k) - 1][size_t(j)], prefix[size_t(i)] - prefix[size_t(j)]);
          if (v < best[size_t(k)][size_t(i)]) {
            best[size_t(k)][size_t(i)] = v;
            cut[size_t(k)][size_t(i)] = j;
          }
        }
      }
    }
    counts.assign(size_t(parts), 0);
    for (int k = parts, i = n; k > 0; --k) {
      int j = cut[size_t(k)][size_t(i)];
      counts[size_t(k) - 1] = i - j;
      i = j;
    }
  } else {
    for (absl::string_view part : absl::StrSplit(how, ',')) {
      int c;
      if (!absl::SimpleAtoi(part, &c) || c < 1) {
        return Invalid(absl::StrCat("partition '", how, "' is not 'parameters', 'time', 'uniform' or a list of ",
                                    "layer counts such as 2,3,1"));
      }
      counts.push_back(c);
    }
    int total = 0;
    for (int c : counts) total += c;
    if (int(counts.size()) != parts || total != n) {
      return Invalid(absl::StrCat("partition '", how, "' gives ", counts.size(), " stage(s) of ", total,
                                  " layer(s); the model has ", n, " layers for ", parts, " stage(s)"));
    }
  }
  std::vector<std::pair<int, int>> ranges;
  int at = 0;
  for (int c : counts) {
    ranges.push_back({at, at + c});
    at += c;
  }
  return ranges;
}

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
  };
  int RankOfVirtualStage(int vs) const { return vs % stages_; }  // in the pipeline group
  int Tag(int kind, int vs, int mb) const { return (kind * stages_ * opts_.chunks + vs) * 100000 + mb; }
  absl::Status Run(const Action& a, const std::vector<Batch>& mbs, StepStats* stats);
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
  std::vector<std::unique_ptr<Communicator>> groups_;  // every group this rank belongs to
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
  // Measured: compute time and step time (from the second step), peak activations held.
  double busy_s_ = 0, wall_s_ = 0;
  int measured_steps_ = 0, steps_ = 0;
  int64_t act_base_ = 0, act_peak_ = 0;
  struct Event {
    std::string name;
    double start_s, end_s;
  };
  std::vector<Event> events_;  // this step's forwards, backwards and waits
  void WriteTrace() const;  // device bytes above the step's start, at most
  absl::Status status_;
};

// Each layer's forward + backward time on `sample` in microseconds (the fastest of 3, so a
// preempted run does not count), on every rank at once; rank 0's figures are everyone's, so all
// ranks cut alike. Materialises the whole model for it (the layers not this stage's are
// released again when Setup keeps its own).
absl::StatusOr<std::vector<int64_t>> PipelineStrategy::TimeLayers(Module& model,
                                                                  const std::vector<PipelineLayer>& layers,
                                                                  const Batch& sample,
                                                                  const CriterionFn& criterion) {
  for (auto& [n, p] : model.NamedParameters()) {
    if (IsDeferred(p)) Materialize(p);
    p.MoveTo(device_);
  }
  std::vector<int64_t> cost(layers.size(), 1);
  Tensor x = sample.inputs.To(device_);
  for (size_t i = 0; i < layers.size(); ++i) {
    double best = 1e30;
    Tensor next;
    for (int rep = 0; rep < 3; ++rep) {
      Tensor in = x;
      if (i > 0) in = x.Detach().set_requires_grad(true);
      const double t0 = NowS();
      Tensor out = layers[i].forward(in);
      Tensor root = i + 1 == layers.size() ? criterion(out, Batch{sample.inputs, sample.targets.To(device_)})
                                           : ops::Sum(out);
      root.Backward();
      best = std::min(best, NowS() - t0);
      next = out.Detach();
    }
    cost[i] = std::max<int64_t>(1, int64_t(best * 1e6));
    x = next;
  }
  model.ZeroGrad();
  Tensor t = Tensor::FromVector(cost, {int64_t(cost.size())});
  BRAID_RETURN_IF_ERROR(world_->Broadcast(t, 0)->Wait());
  return t.ToVector<int64_t>();
}

absl::Status PipelineStrategy::Setup(Module& model, const OptimizerFactory& make_optimizer,
                                     const StrategyContext& ctx) {
  if (model_ != nullptr) return Error(absl::StatusCode::kFailedPrecondition, "Setup called twice");
  if (ctx.comm == nullptr) return Invalid("no communicator in the strategy context");
  if (!make_optimizer) return Invalid("no optimizer factory given");
  if (!ctx.criterion) return Invalid("no criterion in the strategy context: the last stage computes the loss");
  BRAID_ASSIGN_OR_RETURN(opts_, ParseOptions(ctx.options));
  // ZeRO on the data axis (declared as feature zero1): the config's section, when there is one.
  if (ctx.config != nullptr) zero_stage_ = ctx.config->zero_optimization().stage();
  if (zero_stage_ > 2) {
    return Invalid(absl::StrCat("zero_optimization.stage ", zero_stage_,
                                " is not supported inside a pipeline (each stage holds its layers "
                                "whole); stages 1 and 2 shard over each stage's data-parallel replicas"));
  }
  world_ = ctx.comm;
  device_ = ctx.device;
  criterion_ = ctx.criterion;
  max_grad_norm_ = ctx.max_grad_norm;
  model_parallel_sum_ = ctx.model_parallel_sum;
  stages_ = opts_.stages;
  const int w = world_->size();
  if (w % stages_ != 0) {
    return Invalid(absl::StrCat(stages_, " pipeline stages do not divide the world of ", w,
                                " ranks; use a world size that is a multiple of the stages"));
  }
  dp_size_ = w / stages_;
  stage_ = world_->rank() % stages_;
  dp_ = world_->rank() / stages_;
  std::vector<PipelineLayer> layers = model.PipelineLayers();
  if (layers.empty()) {
    return Invalid(absl::StrCat("model ", model.type_name(), " lists no pipeline layers (Module::",
                                "PipelineLayers), so it cannot be cut into stages"));
  }
  const int parts = stages_ * opts_.chunks;
  if (parts > int(layers.size())) {
    return Invalid(absl::StrCat(stages_, " stage(s) x ", opts_.chunks, " virtual stage(s) = ", parts,
                                " pieces for a model of ", layers.size(), " layers; use at most ",
                                layers.size(), " pieces"));
  }
  std::map<std::string, Tensor> params;
  for (auto& [n, p] : model.NamedParameters()) params[n] = p;
  std::vector<int64_t> cost;
  for (const PipelineLayer& l : layers) {
    int64_t c = 0;
    for (const std::string& n : l.parameters) {
      auto it = params.find(n);
      if (it == params.end()) return Invalid(absl::StrCat("layer ", l.name, " lists unknown parameter '", n, "'"));
      c += it->second.numel();
    }
    cost.push_back(std::max<int64_t>(c, 1));
    layer_names_.push_back(l.name);
  }
  std::string how = opts_.partition, unit = "parameters";
  if (how == "time") {
    // Balanced by measured time instead: the same cut, over each layer's forward + backward.
    if (!ctx.sample_batch) {
      return Invalid("partition 'time' times the layers on a sample batch, and none was given");
    }
    BRAID_ASSIGN_OR_RETURN(cost, TimeLayers(model, layers, ctx.sample_batch(), ctx.criterion));
    how = "parameters";
    unit = "us forward+backward";
  }
  BRAID_ASSIGN_OR_RETURN(ranges_, Partition(cost, parts, how));
  if (world_->rank() == 0) {
    std::vector<std::string> desc;
    for (int vs = 0; vs < parts; ++vs) {
      int64_t n = 0;
      for (int i = ranges_[size_t(vs)].first; i < ranges_[size_t(vs)].second; ++i) n += cost[size_t(i)];
      desc.push_back(absl::StrCat(vs, ": ", layer_names_[size_t(ranges_[size_t(vs)].first)],
                                  ranges_[size_t(vs)].second - ranges_[size_t(vs)].first > 1
                                      ? absl::StrCat("..", layer_names_[size_t(ranges_[size_t(vs)].second) - 1])
                                      : "",
                                  " (", n, " ", unit, ")"));
    }
    std::printf("braid: pipeline of %d stage(s)%s, schedule %s, cut by %s: %s\n", stages_,
                opts_.chunks > 1 ? absl::StrCat(" x ", opts_.chunks, " virtual").c_str() : "",
                opts_.schedule.c_str(), opts_.partition.c_str(), absl::StrJoin(desc, " | ").c_str());
    std::fflush(stdout);
  }
  // The virtual stages this rank runs, and which stages use each parameter.
  std::map<std::string, std::set<int>> used_by;  // name -> stages
  for (int vs = 0; vs < parts; ++vs) {
    for (int i = ranges_[size_t(vs)].first; i < ranges_[size_t(vs)].second; ++i) {
      for (const std::string& n : layers[size_t(i)].parameters) used_by[n].insert(vs % stages_);
    }
  }
  for (auto& [n, stages] : used_by) owner_[n] = *stages.begin();
  for (int vs = 0; vs < parts; ++vs) {
    if (vs % stages_ == stage_) {
      Chunk c;
      c.virtual_stage = vs;
      for (int i = ranges_[size_t(vs)].first; i < ranges_[size_t(vs)].second; ++i) {
        c.layers.push_back(layers[size_t(i)]);
      }
      chunks_.push_back(std::move(c));
    }
  }
  model_ = &model;
  for (auto& [n, p] : model.NamedParameters()) {
    bool mine = used_by[n].count(stage_) > 0;
    if (mine) {
      if (IsDeferred(p)) Materialize(p);
      p.MoveTo(device_);
      if (p.requires_grad()) {
        own_.emplace_back(n, p);
        // A tied parameter counts once in the norm: on the first stage that holds it.
        if (*used_by[n].begin() == stage_) counted_.insert(n);
      }
    } else if (p.has_data()) {
      p.storage()->Release();  // built whole (not deferred): another stage's, never used here
    }
  }
  for (auto& [n, b] : model.NamedBuffers()) {
    if (IsDeferred(b)) Materialize(b);
    b.MoveTo(device_);
  }
  // Groups, created by every rank in the same order: each replica's pipeline, each stage's
  // replicas, and for every set of stages sharing parameters, one group per replica.
  auto join = [&](const std::vector<int>& ranks, Communicator** slot) -> absl::Status {
    BRAID_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> g, world_->NewGroup(ranks));
    if (g) {
      if (slot) *slot = g.get();
      groups_.push_back(std::move(g));
    }
    return absl::OkStatus();
  };
  for (int d = 0; d < dp_size_; ++d) {
    std::vector<int> ranks;
    for (int s = 0; s < stages_; ++s) ranks.push_back(d * stages_ + s);
    BRAID_RETURN_IF_ERROR(join(ranks, d == dp_ ? &pipe_ : nullptr));
  }
  for (int s = 0; s < stages_; ++s) {
    std::vector<int> ranks;
    for (int d = 0; d < dp_size_; ++d) ranks.push_back(d * stages_ + s);
    BRAID_RETURN_IF_ERROR(join(ranks, s == stage_ ? &data_ : nullptr));
  }
  std::map<std::set<int>, std::vector<std::string>> tied;
  for (auto& [n, p] : model.NamedParameters()) {
    if (used_by[n].size() > 1 && p.requires_grad()) tied[used_by[n]].push_back(n);
  }
  for (auto& [set, names] : tied) {
    for (int d = 0; d < dp_size_; ++d) {
      std::vector<int> ranks;
      for (int s : set) ranks.push_back(d * stages_ + s);
      Communicator* g = nullptr;
      BRAID_RETURN_IF_ERROR(join(ranks, &g));
      if (g != nullptr && d == dp_) {
        std::vector<Tensor> ts;
        for (const std::string& n : names) ts.push_back(params[n]);
        ties_.push_back({g, ts});
      }
    }
  }
  // Every replica of a stage starts from the first replica's values.
  if (dp_size_ > 1) {
    for (auto& [n, p] : own_) {
      Tensor t = p;
      BRAID_RETURN_IF_ERROR(data_->Broadcast(t, 0)->Wait());
    }
  }
  std::set<std::string> tied_names;
  for (auto& [set, names] : tied) tied_names.insert(names.begin(), names.end());
  BRAID_ASSIGN_OR_RETURN(stage_opt_, StageOptimizer::Create(own_, counted_, *data_, zero_stage_,
                                                            make_optimizer, device_, tied_names));
  act_shape_.assign(size_t(parts), Shape());
  return absl::OkStatus();
}

Tensor PipelineStrategy::ForwardChunk(const Chunk& c, const Tensor& x) {
  Tensor h = x;
  for (const PipelineLayer& l : c.layers) h = l.forward(h);
  return h;
}

absl::Status PipelineStrategy::Run(const Action& a, const std::vector<Batch>& mbs, StepStats* stats) {
  const Chunk& chunk = chunks_[size_t(a.chunk)];
  const int vs = chunk.virtual_stage, last = stages_ * opts_.chunks - 1;
  InFlight& f = flight_[{a.micro_batch, a.chunk}];
  const Batch& batch = mbs[size_t(a.micro_batch)];
  switch (a.op) {
    case Op::kRecvActivation: {
      Shape& shape = act_shape_[size_t(vs)];
      if (shape.empty()) {  // the first time: the sender says the shape
        Tensor header = Tensor::Empty({8}, DType::kI64, Device::CPU());
        BRAID_RETURN_IF_ERROR(pipe_->Recv(header, RankOfVirtualStage(vs - 1), Tag(2, vs, a.micro_batch))->Wait());
        std::vector<int64_t> h = header.ToVector<int64_t>();
        shape.assign(h.begin() + 1, h.begin() + 1 + h[0]);
      }
      f.recv_act = Tensor::Empty(shape, DType::kF32, device_);
      f.act_work = pipe_->Recv(f.recv_act, RankOfVirtualStage(vs - 1), Tag(0, vs, a.micro_batch));
      return absl::OkStatus();
    }
    case Op::kForward: {
      double start = NowS();
      if (vs == 0) {
        f.input = batch.inputs;
      } else {
        BRAID_RETURN_IF_ERROR(f.act_work->Wait());
        events_.push_back({absl::StrCat("wait activation ", a.micro_batch), start, NowS()});
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
      stats->forward_s += NowS() - start;
      busy_s_ += steps_ > 0 ? NowS() - start : 0;
      events_.push_back({absl::StrCat("F", a.micro_batch, opts_.chunks > 1 ? absl::StrCat(".", a.chunk) : ""),
                         start, NowS()});
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
    case Op::kRecvGrad:
      f.recv_grad = Tensor::Empty(f.output.shape(), DType::kF32, device_);
      f.grad_work = pipe_->Recv(f.recv_grad, RankOfVirtualStage(vs + 1), Tag(1, vs, a.micro_batch));
      return absl::OkStatus();
    case Op::kBackward: {
      double start = NowS();
      if (vs == last) {
        f.loss.Backward();
      } else {
        BRAID_RETURN_IF_ERROR(f.grad_work->Wait());
        events_.push_back({absl::StrCat("wait gradient ", a.micro_batch), start, NowS()});
        start = NowS();
        f.output.Backward(f.recv_grad);
      }
      if (vs > 0) f.input_grad = f.input.grad();
      f.output = Tensor();
      f.loss = Tensor();
      f.recv_grad = Tensor();
      stats->backward_s += NowS() - start;
      busy_s_ += steps_ > 0 ? NowS() - start : 0;
      // ZeRO-2: this micro-batch's gradients are complete on this rank after its lowest chunk's
      // backward; they go into the shard now (asynchronously), not at the step's end.
      if (a.chunk == 0) BRAID_RETURN_IF_ERROR(stage_opt_->ReduceMicroBatch());
      events_.push_back({absl::StrCat("B", a.micro_batch, opts_.chunks > 1 ? absl::StrCat(".", a.chunk) : ""),
                         start, NowS()});
      return absl::OkStatus();
    }
    case Op::kSendGrad:
      if (!f.input_grad.defined()) {
        return Error(absl::StatusCode::kInternal, absl::StrCat("no gradient reached the input of virtual stage ", vs));
      }
      sends_.push_back(pipe_->Send(f.input_grad, RankOfVirtualStage(vs - 1), Tag(1, vs - 1, a.micro_batch)));
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
  const double step_start = NowS();
  StepStats stats;
  stage_opt_->ZeroGrad();
  loss_sum_ = 0;
  flight_.clear();
  events_.clear();
  act_base_ = GetMemoryStats(device_).current_bytes;
  for (const Action& a : schedule) {
    absl::Status st = Run(a, micro_batches, &stats);
    // What the step holds above its start: activations and the graph's saved tensors, in flight.
    act_peak_ = std::max(act_peak_, GetMemoryStats(device_).current_bytes - act_base_);
    if (!st.ok()) {
      for (auto& w : sends_) (void)w->Wait();
      sends_.clear();
      return st;
    }
  }
  // The bubble is the idle share of the schedule itself: from the step's start to its last
  // action, against the forwards and backwards this stage computed in between.
  const double schedule_end = NowS();
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
  stats.optimizer_s = NowS() - opt_start;
  // Only the last stage saw the loss: every stage reports it.
  Tensor loss = Tensor::Full({1}, float(loss_sum_ / k_));
  if (stages_ > 1) BRAID_RETURN_IF_ERROR(pipe_->Broadcast(loss, stages_ - 1)->Wait());
  stats.loss = loss.item();
  if (steps_ > 0) {
    wall_s_ += schedule_end - step_start;
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
    items.push_back(absl::StrFormat(R"({"name":"%s","ph":"X","pid":%d,"tid":%d,"ts":%.1f,"dur":%.1f})",
                                    e.name, dp_, stage_, e.start_s * 1e6,
                                    std::max(0.0, e.end_s - e.start_s) * 1e6));
  }
  // Written whole under a temporary name, then renamed: a reader never sees half a trace.
  std::string tmp = path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "{\"traceEvents\":[\n%s\n]}\n", absl::StrJoin(items, ",\n").c_str());
    bool ok = std::fclose(f) == 0;
    if (ok) std::rename(tmp.c_str(), path.c_str());
  }
}

std::vector<std::string> PipelineStrategy::SummaryLines() const {
  if (measured_steps_ == 0) return {};
  const double bubble = wall_s_ > 0 ? 1 - busy_s_ / wall_s_ : 0;
  return {absl::StrFormat(
      "pipeline (stage %d of %d, %d micro-batch(es), %s%s): idle %.1f%% of the schedule measured "
      "(forward and backward against its span, steps 2..%d), bubble formula %.1f%%; peak "
      "activations held "
      "%.2f MiB",
      stage_, stages_, k_, opts_.schedule,
      opts_.chunks > 1 ? absl::StrCat(" x", opts_.chunks).c_str() : "", 100 * bubble, steps_,
      100 * BubbleFormula(opts_.schedule, {stages_, k_, opts_.chunks}),
      double(act_peak_) / (1 << 20))};
}

absl::StatusOr<std::map<std::string, Tensor>> PipelineStrategy::FullStateDict() {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "FullStateDict before Setup");
  // Each parameter from the first stage that holds it, to every stage of this replica.
  std::map<std::string, Tensor> out;
  std::map<std::string, bool> mine;
  for (auto& [n, p] : own_) mine[n] = true;
  for (auto& [n, p] : model_->NamedParameters()) {
    auto it = owner_.find(n);
    const int owner = it == owner_.end() ? -1 : it->second;
    Tensor t = owner == stage_ ? p.Detach().Clone() : Tensor::Empty(p.shape(), p.dtype(), device_);
    if (stages_ > 1 && owner >= 0) BRAID_RETURN_IF_ERROR(pipe_->Broadcast(t, owner)->Wait());
    out[n] = t;
  }
  for (auto& [n, b] : model_->NamedBuffers()) out[n] = b.Detach().Clone();
  return out;
}

absl::Status PipelineStrategy::LoadFullStateDict(const std::map<std::string, Tensor>& state) {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "LoadFullStateDict before Setup");
  std::vector<std::string> missing;
  for (auto& [n, p] : model_->NamedParameters()) {
    if (!state.count(n)) missing.push_back(n);
  }
  if (!missing.empty()) return Invalid(absl::StrCat("cannot load the weights: missing ", absl::StrJoin(missing, ", ")));
  for (auto& [n, p] : own_) Tensor(p).CopyFrom(state.at(n));
  for (auto& [n, b] : model_->NamedBuffers()) {
    if (state.count(n)) Tensor(b).CopyFrom(state.at(n));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace braid::pipeline

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy(
      braid::pipeline::kName, [] { return std::make_unique<braid::pipeline::PipelineStrategy>(); },
      braid::StrategyTraits{{"zero1", "zero2"}});
  return s.ok() ? 0 : 1;
}
