// The "pipeline" strategy: the model's layers (Module::PipelineLayers) cut into P stages (v
// chunks per rank for the interleaved schedule), one stage per rank; the micro-batches of a
// step flow through them as a schedule (schedule.h) says. With W = P x D ranks, rank r is stage
// r % P of data-parallel replica r / P: each stage's D copies average their gradients, and a
// weight used by two stages (GPT's wte: embedding and head) gets the sum of both stages'
// gradients, so it keeps one value. One step equals one step of one process on the global batch.
// This file: the cut, the groups and the full state; executor.cc runs the steps.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/deferred_init.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "plugins/pipeline/pipeline_strategy.h"

namespace braid::pipeline {

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
  BRAID_ASSIGN_OR_RETURN(opts_, ParseOptions(ctx.options, ctx.mesh ? ctx.mesh->shape().pipeline : 0));
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
  if (ctx.mesh != nullptr) {
    // The mesh built these once for every layer (core/mesh.h): this rank's pipeline (its
    // replica's stages, in stage order) and its stage's replicas (in replica order).
    pipe_ = &ctx.mesh->pipeline();
    data_ = &ctx.mesh->data();
    if (pipe_->size() != stages_ || pipe_->rank() != stage_ || data_->size() != dp_size_ ||
        data_->rank() != dp_) {
      return Error(absl::StatusCode::kInternal,
                   absl::StrCat("the mesh's groups (pipeline rank ", pipe_->rank(), " of ", pipe_->size(),
                                ", data rank ", data_->rank(), " of ", data_->size(),
                                ") disagree with stage ", stage_, " of ", stages_, ", replica ", dp_,
                                " of ", dp_size_));
    }
  } else {
    // Without a mesh (tests that give the stage count as an option): the same groups, made here.
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
  // Every replica of a stage starts from the first replica's values (coalesced: core/broadcast.h).
  if (dp_size_ > 1) {
    std::vector<Tensor> own_tensors;
    for (auto& [n, p] : own_) own_tensors.push_back(p);
    BRAID_RETURN_IF_ERROR(BroadcastTensors(own_tensors, *data_, 0));
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

}  // namespace braid::pipeline

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy(
      braid::pipeline::kName, [] { return std::make_unique<braid::pipeline::PipelineStrategy>(); },
      // Serves the pipeline axis and, inside each stage, the data axis (ZeRO-1/2 over a stage's
      // replicas: stage_optimizer.h); it does not take a data-axis layer of another strategy yet.
      braid::StrategyTraits{{"zero1", "zero2"}, {braid::kAxisPipeline, braid::kAxisData}});
  return s.ok() ? 0 : 1;
}
