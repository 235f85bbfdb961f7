// The "pipeline" strategy: the model's layers (Module::PipelineLayers) cut into P stages (v
// chunks per rank for the interleaved schedule), one stage per rank; the micro-batches of a
// step flow through them as a schedule (schedule.h) says. The device mesh gives the layout (P
// stages x D replicas, rank r of a model replica being stage r % P of replica r / P) and its
// groups: each stage's D copies average their gradients, and a weight used by two stages (GPT's
// wte: embedding and head) gets the sum of both stages' gradients, so it keeps one value. One
// step equals one step of one process on the global batch.
// This file: the cut, the mesh's groups and the full state; executor.cc runs the steps.
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
  // On the model's device: NCCL moves device memory only (a copy there and back, at Setup).
  Tensor t = Tensor::FromVector(cost, {int64_t(cost.size())}).To(device_);
  // Stage 0's measurement on replica 0 (and tensor rank 0), so every rank of the model cuts
  // alike: each broadcast from the group's first rank, which holds it after the previous one.
  for (Communicator* g : groups_) BRAID_RETURN_IF_ERROR(g->Broadcast(t, 0)->Wait());
  return t.ToVector<int64_t>();
}

absl::Status PipelineStrategy::Setup(Module& model, const OptimizerFactory& make_optimizer,
                                     const StrategyContext& ctx) {
  if (model_ != nullptr) return Error(absl::StatusCode::kFailedPrecondition, "Setup called twice");
  if (ctx.comm == nullptr) return Invalid("no communicator in the strategy context");
  if (!make_optimizer) return Invalid("no optimizer factory given");
  if (!ctx.criterion) return Invalid("no criterion in the strategy context: the last stage computes the loss");
  BRAID_RETURN_IF_ERROR(RequireWrapped());
  // The options are the stack's: the pipeline's own keys are read here, the rest belong to the
  // data-axis layer below (whichever of the two the config named: ContextBelow hands them down).
  std::map<std::string, std::string> mine;
  for (auto& [k, v] : ctx.options) {
    if (OwnsOption(k)) mine[k] = v;
  }
  // The composer hands the pipeline its group (this replica's stages, in stage order) and the
  // data-axis layer below its own (this stage's replicas, in replica order): the stage count and
  // this rank's place come from them. The pipeline builds no groups and looks none up.
  if (ctx.groups_below.empty()) {
    return Invalid("no data-parallel group for the layer below in the strategy context: the "
                   "composer hands each layer its group; give the layout as parallel { pipeline: N "
                   "data: M } (in a test, DeviceMesh::GroupOf for each layer)");
  }
  pipe_ = ctx.comm;
  data_ = ctx.groups_below.front();
  groups_ = {pipe_, data_};
  groups_.insert(groups_.end(), ctx.groups_above.begin(), ctx.groups_above.end());
  BRAID_ASSIGN_OR_RETURN(opts_, ParseOptions(mine, pipe_->size()));
  device_ = ctx.device;
  criterion_ = ctx.criterion;
  max_grad_norm_ = ctx.max_grad_norm;
  stages_ = opts_.stages;
  dp_size_ = data_->size();
  stage_ = pipe_->rank();
  dp_ = data_->rank();
  world_rank_ = ctx.mesh != nullptr ? ctx.mesh->rank() : dp_ * stages_ + stage_;
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
  if (stage_ == 0 && dp_ == 0) {
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
  // This stage's view holds the parameters it owns (a tied one on its first stage only); the
  // data-axis layer materialises them as it keeps them (ZeRO-3: its shard), unless it wants
  // them whole from here. Parameters of other stages are never allocated.
  const bool inner_defers = inner()->wants_deferred_init(ContextBelow(ctx));
  for (auto& [n, p] : model.NamedParameters()) {
    const bool used = used_by[n].count(stage_) > 0;
    const bool owned = used && owner_[n] == stage_;
    if (owned && p.requires_grad()) own_.insert(n);
    if (used && (!owned || !inner_defers || !p.requires_grad())) {
      if (IsDeferred(p)) Materialize(p);
      p.MoveTo(device_);
    } else if (!used && p.has_data()) {
      p.storage()->Release();  // built whole (not deferred): another stage's, never used here
    }
  }
  for (auto& [n, b] : model.NamedBuffers()) {
    if (IsDeferred(b)) Materialize(b);
    b.MoveTo(device_);
  }
  view_ = std::make_unique<StageView>(model, own_);
  BRAID_RETURN_IF_ERROR(SetUpTies(model, used_by));
  // The data-axis layer trains the view over this stage's replicas. The norm it clips by sums
  // over the stages too (a tied weight counts once: on its owner), then over what the layer
  // above adds (tensor parallelism's group); the loss it reads is the last stage's.
  StrategyContext inner_ctx = ContextBelow(ctx);  // data_ as its comm
  // The squared norm summed over the stages on the device, where NCCL moves it, before the
  // inner strategy's one read, and the loss with it: only the last stage computed it (there the
  // data-axis layer's mean of its tokens is the mean loss; elsewhere that mean is of surrogates,
  // replaced by 0), so every stage reads the last stage's value in its own one read. Then what
  // the layer above adds (tensor parallelism's group).
  Communicator* pipe = pipe_;
  const bool last_stage = stage_ == stages_ - 1;
  std::function<void(Tensor&, Tensor&)> outer = ctx.model_parallel_sum_on_device;
  inner_ctx.model_parallel_sum_on_device = [pipe, last_stage, outer](Tensor& squared, Tensor& loss) {
    if (pipe->size() > 1) {
      absl::Status st = pipe->AllReduce(squared, ReduceOp::kSum)->WaitOnDevice();
      BRAID_CHECK(st.ok()) << "pipeline: all-reducing the gradient norm over the stages: " << st.message();
      if (!last_stage || !loss.defined()) loss = Tensor::Zeros({}, DType::kF32, squared.device());
      st = pipe->AllReduce(loss, ReduceOp::kSum)->WaitOnDevice();
      BRAID_CHECK(st.ok()) << "pipeline: handing the last stage's loss to the others: " << st.message();
    }
    if (outer) outer(squared, loss);
  };
  inner_ctx.make_replica = nullptr;  // the stage is not a whole model
  inner_ctx.sample_batch = nullptr;
  BRAID_RETURN_IF_ERROR(inner()->Setup(*view_, make_optimizer, inner_ctx));
  if (inner()->data_parallel_size() != dp_size_ || inner()->data_parallel_rank() != dp_) {
    return Invalid(absl::StrCat("the data-axis strategy \"", inner()->name(), "\" trains ",
                                inner()->data_parallel_size(), " replica(s) of each stage, but the layout has ",
                                dp_size_, "; it must train over the communicator it is given"));
  }
  // The owner of a tied weight sends its value, whole, when its first forward of a step has it
  // (ZeRO-3 gathers it there): after the data-axis layer's own hooks, which run first.
  view_->AddForwardPreHook([this](Module&) {
    if (tie_send_) SendTieValues();
  });
  act_shape_.assign(size_t(parts), Shape());
  act_dtype_.assign(size_t(parts), DType::kF32);
  return absl::OkStatus();
}

absl::Status PipelineStrategy::SetUpTies(Module& model, const std::map<std::string, std::set<int>>& used_by) {
  for (auto& [n, p] : model.NamedParameters()) {
    auto it = used_by.find(n);
    if (it == used_by.end() || it->second.size() < 2 || !it->second.count(stage_) || !p.requires_grad()) continue;
    Tie t;
    t.name = n;
    t.param = p;
    t.owner = owner_[n] == stage_;
    for (int s : it->second) {
      if (t.owner ? s != stage_ : s == owner_[n]) t.others.push_back(s);
    }
    for (const Chunk& c : chunks_) {
      for (const PipelineLayer& l : c.layers) {
        if (std::find(l.parameters.begin(), l.parameters.end(), n) != l.parameters.end()) {
          ++t.per_step;  // per micro-batch, for now: times k_ at each step
          break;
        }
      }
    }
    ties_.push_back(std::move(t));
  }
  for (size_t i = 0; i < ties_.size(); ++i) {
    Tie& t = ties_[i];
    if (t.owner) {
      // The owner's last gradient of the step adds what every copy accumulated: they finished
      // their backward of that micro-batch before this one could start, and sent it then.
      t.param.RegisterGradTransform([this, i](const Tensor& g) {
        Tie& tie = ties_[i];
        if (++tie.seen < tie.per_step * k_) return g;
        Tensor sum = g.Detach().Clone();
        for (int s : tie.others) {
          Tensor part = Tensor::Empty(sum.shape(), sum.dtype(), sum.device());
          absl::Status st = pipe_->Recv(part, s, Tag(4, int(i), 0))->Wait();
          BRAID_CHECK(st.ok()) << "pipeline: receiving the gradient of tied weight '" << tie.name
                               << "' from stage " << s << ": " << st.message();
          autograd::AccumulateInto(sum, part);
        }
        return sum;
      });
    } else {
      // A copy sends its gradient once the step's last contribution is in: from inside that
      // backward, so the owner (which waits for it) is never behind a collective of ours.
      t.param.RegisterPostAccumulateGradHook([this, i](Tensor& p) {
        Tie& tie = ties_[i];
        if (++tie.seen < tie.per_step * k_) return;
        tie.sent = p.grad();
        sends_.push_back(pipe_->Send(tie.sent, tie.others.front(), Tag(4, int(i), 0)));
      });
    }
  }
  return absl::OkStatus();
}

void PipelineStrategy::SendTieValues() {
  tie_send_ = false;
  for (size_t i = 0; i < ties_.size(); ++i) {
    Tie& t = ties_[i];
    if (!t.owner) continue;
    t.sent = t.param.Detach().Clone();  // whole now; it may be released after this forward
    for (int s : t.others) tie_works_.push_back(pipe_->Send(t.sent, s, Tag(3, int(i), 0)));
  }
}

absl::Status PipelineStrategy::ReceiveTieValues() {
  tie_receive_ = false;
  for (size_t i = 0; i < ties_.size(); ++i) {
    Tie& t = ties_[i];
    if (t.owner) continue;
    Tensor v = t.param.Detach();
    BRAID_RETURN_IF_ERROR(pipe_->Recv(v, t.others.front(), Tag(3, int(i), 0))->Wait());
  }
  return absl::OkStatus();
}

Tensor PipelineStrategy::ForwardChunk(const Chunk& c, const Tensor& x) {
  Tensor h = x;
  for (const PipelineLayer& l : c.layers) h = l.forward(h);
  return h;
}

absl::StatusOr<std::map<std::string, Tensor>> PipelineStrategy::FullStateDict() {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "FullStateDict before Setup");
  // The stage's own parameters whole from the data-axis layer (gathered if it shards them),
  // then each parameter from the stage that owns it, to every stage of this replica.
  BRAID_ASSIGN_OR_RETURN(auto mine, inner()->FullStateDict());
  std::map<std::string, Tensor> out;
  for (auto& [n, p] : model_->NamedParameters()) {
    auto it = owner_.find(n);
    const int owner = it == owner_.end() ? -1 : it->second;
    Tensor t;
    if (owner == stage_ && mine.count(n)) {
      t = mine.at(n).Detach().Clone();
    } else if (owner == stage_ || owner < 0) {
      t = p.Detach().Clone();  // frozen: held whole by every stage that uses it
    } else {
      t = Tensor::Empty(p.shape(), p.dtype(), device_);
    }
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
  std::map<std::string, Tensor> mine;
  for (const std::string& n : own_) mine[n] = state.at(n);
  for (auto& [n, b] : view_->NamedBuffers()) {
    if (state.count(n)) mine[n] = state.at(n);
  }
  BRAID_RETURN_IF_ERROR(inner()->LoadFullStateDict(mine));
  for (Tie& t : ties_) {
    if (!t.owner) Tensor(t.param).CopyFrom(state.at(t.name));
  }
  for (auto& [n, b] : model_->NamedBuffers()) {
    if (state.count(n)) Tensor(b).CopyFrom(state.at(n));
  }
  return absl::OkStatus();
}

absl::Status PipelineStrategy::Evaluate(const std::function<void(Module&)>& eval) {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "Evaluate before Setup");
  using State = std::map<std::string, Tensor>;
  BRAID_ASSIGN_OR_RETURN(State whole, FullStateDict());
  std::vector<Tensor> borrowed;
  for (auto& [n, p] : model_->NamedParameters()) {
    if (!p.has_data()) {
      p.storage()->Reallocate();
      borrowed.push_back(p);
    }
    Tensor(p).CopyFrom(whole.at(n));
  }
  {
    autograd::NoGradGuard no_grad;
    eval(*model_);
  }
  // Put back what the data-axis layer holds (a sharded view's values were overwritten with
  // equal ones; a parameter another stage owns is given back).
  for (Tensor& p : borrowed) p.storage()->Release();
  return absl::OkStatus();
}

}  // namespace braid::pipeline

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy(
      braid::pipeline::kName, [] { return std::make_unique<braid::pipeline::PipelineStrategy>(); },
      // Serves the pipeline axis; each stage's data axis is the strategy it wraps.
      braid::StrategyTraits{{}, {braid::kAxisPipeline}});
  return s.ok() ? 0 : 1;
}
