// The "zero" strategy: ZeRO stages 1, 2 and 3 (Rajbhandari et al.) over the data-parallel ranks.
//
// The model's parameters are grouped into units: one per block (a transformer layer) and one for
// everything outside the blocks (embeddings, final norm). Each unit's parameters live in one flat
// buffer, padded to a multiple of the world size N, so that rank r owns the r-th of N equal
// shards. What each stage keeps on a rank:
//   stage 1: full parameters and full gradients; optimizer state for its shard only. After
//            backward the gradients are reduce-scattered (averaged), each rank steps its shard,
//            and the parameter shards are all-gathered.
//   stage 2: as 1, but each unit's gradients are reduce-scattered as soon as backward has
//            produced them (overlapping the rest of backward), and only the gradient shard stays.
//   stage 3: as 2, and the parameters too are kept as shards: a unit's are all-gathered just
//            before its forward and again before its backward, and released right after.
// The optimizer steps views of the shard, one per parameter piece, so each piece keeps its
// parameter's weight-decay attribute. The step equals one step of one process on the global batch.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/autograd.h"
#include "core/communicator.h"
#include "core/config/train_config.pb.h"
#include "core/deferred_init.h"
#include "core/kernels.h"
#include "core/micro_batches.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/strategy.h"

namespace braid {
namespace {

constexpr char kName[] = "zero";

absl::Status Error(absl::StatusCode code, const std::string& msg) {
  return absl::Status(code, absl::StrCat("strategy 'zero': ", msg));
}
absl::Status Invalid(const std::string& msg) {
  return Error(absl::StatusCode::kInvalidArgument, msg);
}

double Seconds(absl::Time from) { return absl::ToDoubleSeconds(absl::Now() - from); }

// Current and peak bytes of one kind of model state on this rank.
struct Account {
  int64_t current = 0, peak = 0;
  void Add(int64_t bytes) {
    current += bytes;
    peak = std::max(peak, current);
  }
  void Sub(int64_t bytes) { current -= bytes; }
};

struct Options {
  int stage = 0;
  bool overlap_comm = true;  // stage 2/3: reduce-scatter each unit while backward goes on
  int64_t persistence_threshold = 0;  // stage 3: units this small stay gathered
  // Stage 3: parameter elements all-gathered ahead of use; -1 = the next unit whatever its size.
  int64_t prefetch_elements = -1;
  bool offload_optimizer = false;  // the optimizer's states and step in host memory
};

absl::StatusOr<Options> ParseOptions(const StrategyContext& ctx) {
  Options o;
  if (ctx.config != nullptr) {
    const config::ZeroOptimizationConfig& z = ctx.config->zero_optimization();
    o.stage = z.stage();
    if (z.has_overlap_comm()) o.overlap_comm = z.overlap_comm();
    // DeepSpeed's settings that Braid does not implement are errors, never silently ignored.
    std::vector<std::string> unsupported;
    if (z.has_reduce_bucket_size()) unsupported.push_back("reduce_bucket_size");
    if (z.has_allgather_bucket_size()) unsupported.push_back("allgather_bucket_size");
    if (z.has_contiguous_gradients() && !z.contiguous_gradients()) {
      unsupported.push_back("contiguous_gradients: false");
    }
    if (z.has_reduce_scatter() && !z.reduce_scatter()) unsupported.push_back("reduce_scatter: false");
    if (z.has_allgather_partitions() && !z.allgather_partitions()) {
      unsupported.push_back("allgather_partitions: false");
    }
    if (z.has_stage3_prefetch_bucket_size()) o.prefetch_elements = z.stage3_prefetch_bucket_size();
    if (z.has_stage3_param_persistence_threshold()) {
      o.persistence_threshold = z.stage3_param_persistence_threshold();
    }
    o.offload_optimizer = z.offload_optimizer().device() == "cpu";
    if (z.offload_param().device() == "cpu") {
      unsupported.push_back("offload_param (device \"cpu\")");
    }
    if (!unsupported.empty()) {
      return Invalid(absl::StrCat(
          "zero_optimization: ", absl::StrJoin(unsupported, ", "),
          " not supported: Braid reduce-scatters and all-gathers one layer (block) at a time, "
          "into contiguous flat buffers; remove ",
          unsupported.size() == 1 ? "it" : "them"));
    }
  }
  for (const auto& [k, v] : ctx.options) {
    if (k == "stage") {
      if (!absl::SimpleAtoi(v, &o.stage)) return Invalid(absl::StrCat("option stage='", v, "' is not 1, 2 or 3"));
    } else if (k == "overlap_comm") {
      if (v != "true" && v != "false") {
        return Invalid(absl::StrCat("option overlap_comm='", v, "' is not true or false"));
      }
      o.overlap_comm = v == "true";
    } else if (k == "offload_optimizer") {
      if (v != "cpu" && v != "none") {
        return Invalid(absl::StrCat("option offload_optimizer='", v, "' is not cpu or none"));
      }
      o.offload_optimizer = v == "cpu";
    } else if (k == "prefetch_elements") {
      if (!absl::SimpleAtoi(v, &o.prefetch_elements) || o.prefetch_elements < -1) {
        return Invalid(absl::StrCat("option prefetch_elements='", v,
                                    "' is not a number of elements >= 0 (or -1: the next layer)"));
      }
    } else if (k == "param_persistence_threshold") {
      if (!absl::SimpleAtoi(v, &o.persistence_threshold) || o.persistence_threshold < 0) {
        return Invalid(absl::StrCat("option param_persistence_threshold='", v,
                                    "' is not a number of elements >= 0"));
      }
    } else {
      return Invalid(absl::StrCat("unknown option '", k,
                                  "' (known: stage, overlap_comm, offload_optimizer, prefetch_elements, "
                                  "param_persistence_threshold)"));
    }
  }
  if (o.stage < 1 || o.stage > 3) {
    return Invalid(absl::StrCat("ZeRO stage ", o.stage,
                                " is not 1, 2 or 3; set zero_optimization.stage (stage 0 is plain "
                                "data parallelism: use strategy ddp)"));
  }
  return o;
}

// One parameter's place in its unit's flat buffer.
struct Slot {
  std::string name;
  Tensor param;
  int64_t offset = 0;  // in the unit's flat buffer
};

// A group of parameters gathered, released and reduced together: one block, or the rest.
struct Unit {
  std::string name;  // the block's module name, or "" for the parameters outside blocks
  Module* module = nullptr;
  std::vector<Slot> slots;
  int64_t numel = 0;   // real elements
  int64_t padded = 0;  // numel rounded up to a multiple of N
  int64_t shard = 0;   // padded / N
  Tensor flat;         // [padded]: the full parameters (released between uses at stage 3)
  Tensor flat_grad;    // [padded]: full gradients while backward produces them
  Tensor grad_shard;   // [shard]: this rank's averaged gradient (stage 2/3)
  Tensor param_shard;  // [shard]: this rank's parameters at stage 3 (the optimizer's)
  bool persistent = false;  // stage 3: never released (small units)
  int gathered = 0;         // stage 3: nesting depth of uses (forward/backward)
  std::shared_ptr<Work> prefetch;  // stage 3: an all-gather launched ahead of use
  std::shared_ptr<Work> pending;  // the reduce-scatter in flight
  bool reduced = false;           // this micro-batch's gradients are in grad_shard
  Tensor pending_out;             // its output (stage 2/3; added into grad_shard when done)
};

class ZeroStrategy final : public Strategy {
 public:
  ~ZeroStrategy() override {
    if (model_ != nullptr) {
      for (uint64_t id : hook_ids_) model_->RemoveHook(id);  // hooks live on the model's modules
      for (auto& [m, id] : module_hooks_) m->RemoveHook(id);
    }
  }

  std::string name() const override { return kName; }
  bool wants_deferred_init(const StrategyContext& ctx) const override {
    auto o = ParseOptions(ctx);
    return o.ok() && o->stage == 3;  // a bad config fails in Setup, saying why
  }

  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override;
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override;
  Optimizer* optimizer() override { return optimizer_.get(); }
  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override;
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override;
  int data_parallel_rank() const override { return rank_; }
  int data_parallel_size() const override { return world_; }
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "Evaluate before Setup");
    autograd::NoGradGuard no_grad;
    eval(*model_);  // stage 3: the forward hooks gather each unit around its forward
    return comm_status_;
  }
  std::vector<std::pair<std::string, int64_t>> ModelStatePeaks() const override {
    std::vector<std::pair<std::string, int64_t>> out = {
        {"parameters", params_.peak}, {"gradients", grads_.peak},
        {opts_.offload_optimizer ? "optimizer state (host)" : "optimizer state", optim_.peak},
        {"transient", transient_.peak}};
    if (opts_.offload_optimizer) out.emplace_back("host copies of shards", host_.peak);
    return out;
  }

 private:
  int64_t Bytes(int64_t numel) const { return numel * int64_t(sizeof(float)); }
  // This rank's range [begin, end) of a unit's real elements.
  std::pair<int64_t, int64_t> OwnRange(const Unit& u) const {
    int64_t b = std::min(u.numel, int64_t(rank_) * u.shard);
    return {b, std::min(u.numel, b + u.shard)};
  }
  absl::Status Wait(const std::shared_ptr<Work>& w, const char* what) {
    absl::Status st = w->Wait();
    if (!st.ok() && comm_status_.ok()) {
      comm_status_ = Error(st.code(), absl::StrCat(what, ": ", st.message()));
    }
    return st;
  }

  void BuildUnits(Module& model);
  absl::Status Materialize(Unit& u);
  void InstallStage3Hooks();
  void Gather(Unit& u);
  void ReleaseIfDone(Unit& u);
  void Prefetch(Unit& u);
  void PrefetchAfter(int unit, const std::vector<int>& order);
  void Record(int unit, std::vector<int>* order);
  void PrepareGrads(Unit& u);
  void LaunchReduceScatter(Unit& u);
  void FinishReduceScatter(Unit& u, StepStats* stats);
  void FinishMicroBatch(bool last, StepStats* stats);

  Options opts_;
  Module* model_ = nullptr;
  Communicator* comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  float max_grad_norm_ = 0;
  std::vector<Unit> units_;
  std::map<const Module*, int> unit_of_module_;
  std::vector<Tensor> pieces_;  // views of this rank's shards, one per parameter piece
  // With offload_optimizer: host copies of the pieces (and of their gradients), which the
  // optimizer steps; the device pieces get the result copied back.
  std::vector<Tensor> host_pieces_;
  Account host_;
  // Stage 3: the order units are used in, recorded in the first step, for prefetching.
  std::vector<int> forward_order_, backward_order_;
  bool orders_known_ = false;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<uint64_t> hook_ids_;
  std::vector<std::pair<Module*, uint64_t>> module_hooks_;
  absl::Status comm_status_;
  bool in_backward_ = false;
  std::vector<int> in_flight_;  // units whose reduce-scatter was launched, oldest first
  StepStats* step_stats_ = nullptr;
  Account params_, grads_, optim_, transient_;
};

void ZeroStrategy::BuildUnits(Module& model) {
  std::map<std::string, int> unit_by_prefix;
  for (auto& [bname, block] : model.NamedBlocks()) {
    if (bname.empty()) continue;  // the model itself marked a block: everything is "outside"
    unit_by_prefix[bname + "."] = int(units_.size());
    Unit u;
    u.name = bname;
    u.module = block;
    units_.push_back(std::move(u));
  }
  Unit rest;
  rest.name = "";
  rest.module = &model;
  const int rest_index = int(units_.size());
  units_.push_back(std::move(rest));
  for (auto& [n, p] : model.NamedParameters()) {
    if (!p.requires_grad()) continue;
    int idx = rest_index;
    // The longest block prefix: a block's own parameters (nested blocks are their own units).
    size_t best = 0;
    for (auto& [prefix, i] : unit_by_prefix) {
      if (n.compare(0, prefix.size(), prefix) == 0 && prefix.size() > best) {
        best = prefix.size();
        idx = i;
      }
    }
    Unit& u = units_[size_t(idx)];
    u.slots.push_back({n, p, u.numel});
    u.numel += p.numel();
  }
  // Units without trainable parameters take no part.
  units_.erase(std::remove_if(units_.begin(), units_.end(), [](const Unit& u) { return u.numel == 0; }),
               units_.end());
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    u.padded = (u.numel + world_ - 1) / world_ * world_;
    u.shard = u.padded / world_;
    unit_of_module_[u.module] = int(i);
  }
}

// Gives every unit its flat buffer (stage 1/2: full; stage 3: the shard, and a released full
// buffer) with the parameters' values, and makes each parameter a view of the full buffer.
absl::Status ZeroStrategy::Materialize(Unit& u) {
  const Device dev = u.slots.front().param.device();
  if (opts_.stage < 3) {
    u.flat = Tensor::Zeros({u.padded}, DType::kF32, dev);
    params_.Add(Bytes(u.padded));
    for (Slot& s : u.slots) {
      Tensor dst = u.flat.FlatRange(s.offset, s.param.numel(), s.param.shape());
      if (IsDeferred(s.param)) braid::Materialize(s.param);
      dst.CopyFrom(s.param);
      s.param.RebindTo(dst);
    }
    return absl::OkStatus();
  }
  // Stage 3: only this rank's shard is ever materialised.
  u.param_shard = Tensor::Zeros({u.shard}, DType::kF32, dev);
  params_.Add(Bytes(u.shard));
  auto [own_b, own_e] = OwnRange(u);
  std::vector<float> buf;
  for (Slot& s : u.slots) {
    int64_t b = std::max(own_b, s.offset), e = std::min(own_e, s.offset + s.param.numel());
    if (b >= e) continue;
    Tensor dst = u.param_shard.FlatRange(b - own_b, e - b);
    if (IsDeferred(s.param)) {
      buf.resize(size_t(e - b));
      InitialValues(s.param, b - s.offset, e - s.offset, buf.data());
      dst.CopyFrom(Tensor::FromVector(buf, {e - b}));
    } else {
      dst.CopyFrom(s.param.Detach().Reshape({-1}).FlatRange(b - s.offset, e - b));
    }
  }
  u.flat = Tensor::Unallocated({u.padded}, DType::kF32, dev);
  for (Slot& s : u.slots) {
    s.param.RebindTo(u.flat.FlatRange(s.offset, s.param.numel(), s.param.shape()));
  }
  u.persistent = u.numel <= opts_.persistence_threshold;
  if (u.persistent) {
    Gather(u);  // stays gathered: gathered stays > 0
  }
  return absl::OkStatus();
}

absl::Status ZeroStrategy::Setup(Module& model, const OptimizerFactory& make_optimizer,
                                 const StrategyContext& ctx) {
  if (model_ != nullptr) {
    return Error(absl::StatusCode::kFailedPrecondition, "Setup called twice");
  }
  if (ctx.comm == nullptr) return Invalid("no communicator in the strategy context");
  if (!make_optimizer) return Invalid("no optimizer factory given");
  BRAID_ASSIGN_OR_RETURN(opts_, ParseOptions(ctx));
  comm_ = ctx.comm;
  rank_ = comm_->rank();
  world_ = comm_->size();
  max_grad_norm_ = ctx.max_grad_norm;
  model_ = &model;
  for (const auto& [n, b] : model.NamedBuffers()) {
    if (IsDeferred(b)) braid::Materialize(b);
    b.MoveTo(ctx.device);
  }
  for (const auto& [n, p] : model.NamedParameters()) {
    if (!p.requires_grad()) {
      if (IsDeferred(p)) braid::Materialize(p);
      p.MoveTo(ctx.device);
    } else if (!IsDeferred(p)) {
      p.MoveTo(ctx.device);
    } else if (p.device() != ctx.device) {
      return Invalid(absl::StrCat("parameter ", p.DescribeForError(), " was made for another device than ",
                                  ctx.device.ToString()));
    }
  }
  BuildUnits(model);
  if (units_.empty()) return Invalid("the model has no trainable parameter");
  for (Unit& u : units_) BRAID_RETURN_IF_ERROR(Materialize(u));
  if (opts_.stage < 3) {
    // Rank 0's initial values everywhere (as DDP), so ranks started from different seeds agree.
    for (Unit& u : units_) {
      BRAID_RETURN_IF_ERROR(Wait(comm_->Broadcast(u.flat, 0), "broadcasting the initial parameters"));
    }
  }
  // The optimizer's parameters: for each parameter, the piece of it this rank owns, as a view
  // of the shard, with the parameter's name and weight-decay attribute.
  std::vector<std::pair<std::string, Tensor>> named;
  for (Unit& u : units_) {
    auto [own_b, own_e] = OwnRange(u);
    u.grad_shard = Tensor::Zeros({u.shard}, DType::kF32, ctx.device);
    grads_.Add(Bytes(u.shard));
    for (Slot& s : u.slots) {
      int64_t b = std::max(own_b, s.offset), e = std::min(own_e, s.offset + s.param.numel());
      if (b >= e) continue;
      Tensor piece = opts_.stage < 3 ? u.flat.FlatRange(b, e - b)
                                     : u.param_shard.FlatRange(b - own_b, e - b);
      piece.set_name(absl::StrCat(s.name, "[", b - s.offset, ":", e - s.offset, "]"));
      piece.set_weight_decay(s.param.weight_decay());
      piece.set_grad(u.grad_shard.FlatRange(b - own_b, e - b));
      named.emplace_back(s.name, piece);
    }
  }
  // In the model's parameter order, so the norm sums in the order one process's does.
  std::map<std::string, int> order;
  for (auto& [n, p] : model.NamedParameters()) order.emplace(n, int(order.size()));
  std::vector<size_t> idx(named.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return order[named[a].first] < order[named[b].first]; });
  std::vector<std::pair<std::string, Tensor>> sorted;
  pieces_.clear();
  for (size_t i : idx) {
    sorted.push_back(named[i]);
    pieces_.push_back(named[i].second);
  }
  named = std::move(sorted);
  if (opts_.offload_optimizer) {
    // ZeRO-Offload: the optimizer steps host copies; only gradients go to the host and
    // updated parameters come back, each step.
    for (auto& [n, piece] : named) {
      Tensor h = piece.Detach().To(Device::Host());
      h.set_name(piece.name()).set_weight_decay(piece.weight_decay());
      h.set_grad(Tensor::Zeros(piece.shape(), DType::kF32, Device::Host()));
      host_.Add(2 * int64_t(piece.nbytes()));
      host_pieces_.push_back(h);
      piece = h;
    }
  }
  optimizer_ = make_optimizer(named);
  if (optimizer_ == nullptr) return Invalid("the optimizer factory returned null");
  if (opts_.stage == 3) InstallStage3Hooks();
  // Stage 2/3: a unit's gradient buffer exists only while backward produces it: made when the
  // gradient of the unit's output arrives, reduce-scattered (and given back) once the unit's
  // parameters all have theirs.
  if (opts_.stage >= 2) {
    for (size_t i = 0; i < units_.size(); ++i) {
      Module* m = units_[i].module;
      module_hooks_.emplace_back(m, m->AddBackwardPreHook([this, i](Module&) {
        if (!in_backward_) return;
        if (opts_.stage == 3) {
          Gather(units_[i]);  // ops saved views of the parameters
          Record(int(i), &backward_order_);
          PrefetchAfter(int(i), backward_order_);
        }
        PrepareGrads(units_[i]);
      }));
      module_hooks_.emplace_back(m, m->AddBackwardHook([this, i](Module&) {
        if (!in_backward_ || units_[i].pending) return;
        LaunchReduceScatter(units_[i]);
        in_flight_.push_back(int(i));
        if (opts_.stage == 3) ReleaseIfDone(units_[i]);  // not needed until the next forward
        // At most two units' full gradients at once: the one just launched, and the one before,
        // whose reduction had this unit's backward to hide behind.
        while (in_flight_.size() > 1) {
          FinishReduceScatter(units_[size_t(in_flight_.front())], step_stats_);
          in_flight_.erase(in_flight_.begin());
        }
      }));
    }
  }
  return absl::OkStatus();
}

void ZeroStrategy::Gather(Unit& u) {
  if (u.gathered++ > 0) return;
  if (u.prefetch) {  // launched ahead of use: wait for it
    (void)Wait(u.prefetch, "all-gathering parameters (prefetched)");
    u.prefetch.reset();
    return;
  }
  if (u.flat.has_data()) return;  // persistent
  u.flat.storage()->Reallocate();
  params_.Add(Bytes(u.padded));
  (void)Wait(comm_->AllGather(u.param_shard, u.flat), "all-gathering parameters");
}

void ZeroStrategy::ReleaseIfDone(Unit& u) {
  if (--u.gathered > 0 || u.persistent || u.prefetch) return;
  u.flat.storage()->Release();
  params_.Sub(Bytes(u.padded));
}

// Starts all-gathering a unit that is not gathered yet, without waiting: it then arrives while
// the unit before it computes.
void ZeroStrategy::Prefetch(Unit& u) {
  if (u.gathered > 0 || u.prefetch || u.flat.has_data()) return;
  u.flat.storage()->Reallocate();
  params_.Add(Bytes(u.padded));
  u.prefetch = comm_->AllGather(u.param_shard, u.flat);
}

// Prefetches the units that follow `unit` in `order`, up to the element budget (-1: one unit).
void ZeroStrategy::PrefetchAfter(int unit, const std::vector<int>& order) {
  if (!orders_known_ || opts_.prefetch_elements == 0) return;
  auto it = std::find(order.begin(), order.end(), unit);
  if (it == order.end()) return;
  int64_t budget = opts_.prefetch_elements;
  for (++it; it != order.end(); ++it) {
    Unit& next = units_[size_t(*it)];
    if (budget >= 0 && next.padded > budget) break;
    Prefetch(next);
    if (budget < 0) break;
    budget -= next.padded;
  }
}

void ZeroStrategy::Record(int unit, std::vector<int>* order) {
  if (!orders_known_ && std::find(order->begin(), order->end(), unit) == order->end()) {
    order->push_back(unit);
  }
}

void ZeroStrategy::InstallStage3Hooks() {
  for (size_t i = 0; i < units_.size(); ++i) {
    Module* m = units_[i].module;
    module_hooks_.emplace_back(m, m->AddForwardPreHook([this, i](Module&) {
      Gather(units_[i]);
      Record(int(i), &forward_order_);
      PrefetchAfter(int(i), forward_order_);
    }));
    module_hooks_.emplace_back(m, m->AddForwardHook([this, i](Module&) { ReleaseIfDone(units_[i]); }));
  }
}

// A unit's full gradient buffer, which its parameters' .grad are views of, so accumulation writes
// there (stage 1: for the whole step; stage 2/3: while backward produces this unit's gradients).
void ZeroStrategy::PrepareGrads(Unit& u) {
  if (u.flat_grad.defined() && u.flat_grad.has_data()) return;
  if (!u.flat_grad.defined()) {
    u.flat_grad = Tensor::Unallocated({u.padded}, DType::kF32, u.grad_shard.device());
  }
  u.flat_grad.storage()->Reallocate();
  u.flat_grad.Zero();
  (opts_.stage == 1 ? grads_ : transient_).Add(Bytes(u.padded));
  for (Slot& s : u.slots) {
    s.param.set_grad(u.flat_grad.FlatRange(s.offset, s.param.numel(), s.param.shape()));
  }
}

// The unit's gradients, averaged over the ranks, reduced to this rank's shard (asynchronously
// when overlap_comm: backward goes on meanwhile).
void ZeroStrategy::LaunchReduceScatter(Unit& u) {
  PrepareGrads(u);  // a unit no gradient reached reduces zeros: every rank calls the same ops
  u.pending_out = Tensor::Empty({u.shard}, DType::kF32, u.grad_shard.device());
  transient_.Add(Bytes(u.shard));
  u.pending = comm_->ReduceScatter(u.flat_grad, u.pending_out, ReduceOp::kAvg);
  if (!opts_.overlap_comm) (void)Wait(u.pending, "reduce-scattering gradients");
}

// Waits for a unit's reduce-scatter and adds the result into its gradient shard; stage 2/3 then
// give the full gradient buffer back.
void ZeroStrategy::FinishReduceScatter(Unit& u, StepStats* stats) {
  if (!u.pending) return;
  u.reduced = true;
  absl::Time start = absl::Now();
  if (Wait(u.pending, "reduce-scattering gradients").ok()) {
    kernels::axpby.Get(u.grad_shard.device())(1.0f, u.pending_out, 1.0f, u.grad_shard);
  }
  if (!in_backward_ && stats != nullptr) stats->comm_exposed_s += Seconds(start);
  u.pending.reset();
  u.pending_out = Tensor();
  transient_.Sub(Bytes(u.shard));
  if (stats != nullptr) stats->comm_bytes += Bytes(u.padded);
  if (opts_.stage >= 2) {
    u.flat_grad.storage()->Release();
    transient_.Sub(Bytes(u.padded));
    for (Slot& s : u.slots) s.param.ZeroGrad();
  }
}

// After a micro-batch's backward: every unit's reduced gradient is in its shard (stage 1 reduces
// once, after the last micro-batch, from the gradients accumulated in full).
void ZeroStrategy::FinishMicroBatch(bool last, StepStats* stats) {
  if (opts_.stage == 1 && !last) return;
  for (Unit& u : units_) {
    // A unit whose hook never fired (no gradient reached it on this rank), or stage 1.
    if (!u.pending && !u.reduced) LaunchReduceScatter(u);
  }
  for (Unit& u : units_) FinishReduceScatter(u, stats);
  in_flight_.clear();
}

absl::StatusOr<StepStats> ZeroStrategy::TrainStep(const std::vector<Batch>& micro_batches,
                                                  const LossFn& loss_fn) {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "TrainStep before Setup");
  StepStats stats;
  comm_status_ = absl::OkStatus();
  for (Unit& u : units_) {
    u.grad_shard.Zero();
    if (opts_.stage == 1) {
      PrepareGrads(u);  // kept from step to step: zeroed here
      u.flat_grad.Zero();
    }
  }
  step_stats_ = &stats;
  MicroBatchEvents events;
  events.before_backward = [&](int, bool, const Tensor&) {
    for (Unit& u : units_) u.reduced = false;
    in_backward_ = true;
  };
  events.after_backward = [&](int, bool last) {
    in_backward_ = false;
    FinishMicroBatch(last, &stats);
  };
  absl::Status st = RunMicroBatches(kName, *model_, micro_batches, loss_fn, &stats, events);
  in_backward_ = false;
  step_stats_ = nullptr;
  if (!st.ok()) return st;
  BRAID_RETURN_IF_ERROR(comm_status_);

  orders_known_ = opts_.stage == 3;  // the first step has shown the order units are used in

  absl::Time start = absl::Now();
  if (opts_.offload_optimizer) {
    for (size_t i = 0; i < pieces_.size(); ++i) host_pieces_[i].grad().CopyFrom(pieces_[i].grad());
  }
  // The global norm over every rank's shard; every rank scales by the same factor.
  const std::vector<Tensor>& stepped = opts_.offload_optimizer ? host_pieces_ : pieces_;
  stats.grad_norm = ClipGradNormSharded(stepped, max_grad_norm_, [this](double local) {
    if (world_ == 1) return local;  // exactly what one process computes
    Tensor t = Tensor::Full({1}, float(local));
    (void)Wait(comm_->AllReduce(t, ReduceOp::kSum), "all-reducing the gradient norm");
    return double(t.item());
  });
  optimizer_->Step();
  if (opts_.offload_optimizer) {
    for (size_t i = 0; i < pieces_.size(); ++i) Tensor(pieces_[i]).CopyFrom(host_pieces_[i]);
  }
  if (optim_.peak == 0) {  // the optimizer makes its state at its first step
    int64_t bytes = 0;
    for (auto& [n, t] : optimizer_->StateDict()) bytes += int64_t(t.nbytes());
    optim_.Add(bytes);
  }
  stats.optimizer_s = Seconds(start);

  // Stage 1/2: every rank gets everyone's updated shard (stage 3 gathers on use).
  start = absl::Now();
  if (opts_.stage < 3) {
    for (Unit& u : units_) {
      Tensor own = u.flat.FlatRange(int64_t(rank_) * u.shard, u.shard).Clone();
      transient_.Add(Bytes(u.shard));
      (void)Wait(comm_->AllGather(own, u.flat), "all-gathering parameters");
      transient_.Sub(Bytes(u.shard));
    }
  }
  stats.comm_exposed_s += Seconds(start);
  BRAID_RETURN_IF_ERROR(comm_status_);
  return stats;
}

absl::StatusOr<std::map<std::string, Tensor>> ZeroStrategy::FullStateDict() {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "FullStateDict before Setup");
  std::map<std::string, Tensor> out;
  for (Unit& u : units_) {
    if (opts_.stage == 3) Gather(u);
    for (Slot& s : u.slots) out[s.name] = s.param.Detach().Clone();
    if (opts_.stage == 3) ReleaseIfDone(u);
  }
  BRAID_RETURN_IF_ERROR(comm_status_);
  for (auto& [n, p] : model_->NamedParameters()) {
    if (!out.count(n)) out[n] = p.Detach().Clone();  // frozen parameters
  }
  for (auto& [n, b] : model_->NamedBuffers()) out[n] = b.Detach().Clone();
  return out;
}

absl::Status ZeroStrategy::LoadFullStateDict(const std::map<std::string, Tensor>& state) {
  if (model_ == nullptr) return Error(absl::StatusCode::kFailedPrecondition, "LoadFullStateDict before Setup");
  // The optimizer's host copies follow whatever was loaded.
  auto refresh_host = [this] {
    for (size_t i = 0; i < host_pieces_.size(); ++i) host_pieces_[i].CopyFrom(pieces_[i]);
  };
  if (opts_.stage < 3) {
    BRAID_RETURN_IF_ERROR(model_->LoadStateDict(state, /*strict=*/true));
    refresh_host();
    return absl::OkStatus();
  }
  // Stage 3: every name checked as the model would, then each rank keeps its shard's part.
  std::vector<std::string> problems;
  std::map<std::string, bool> seen;
  for (auto& [n, p] : model_->NamedParameters()) seen[n] = false;
  for (auto& [n, b] : model_->NamedBuffers()) seen[n] = false;
  for (auto& [n, t] : state) {
    if (!seen.count(n)) problems.push_back(absl::StrCat("unexpected '", n, "'"));
  }
  for (Unit& u : units_) {
    auto [own_b, own_e] = OwnRange(u);
    for (Slot& s : u.slots) {
      auto it = state.find(s.name);
      if (it == state.end()) continue;
      seen[s.name] = true;
      if (it->second.shape() != s.param.shape()) {
        problems.push_back(absl::StrCat("'", s.name, "' has shape ", ShapeToString(it->second.shape()),
                                        ", the model's is ", ShapeToString(s.param.shape())));
        continue;
      }
      int64_t b = std::max(own_b, s.offset), e = std::min(own_e, s.offset + s.param.numel());
      if (b >= e) continue;
      Tensor src = it->second.Detach().Reshape({-1}).FlatRange(b - s.offset, e - b);
      u.param_shard.FlatRange(b - own_b, e - b).CopyFrom(src);
    }
  }
  for (auto& [n, p] : model_->NamedParameters()) {
    auto it = state.find(n);
    if (it != state.end() && !p.requires_grad()) {
      Tensor(p).CopyFrom(it->second);
      seen[n] = true;
    }
  }
  for (auto& [n, b] : model_->NamedBuffers()) {
    auto it = state.find(n);
    if (it != state.end()) {
      Tensor(b).CopyFrom(it->second);
      seen[n] = true;
    }
  }
  for (auto& [n, ok] : seen) {
    if (!ok) problems.push_back(absl::StrCat("missing '", n, "'"));
  }
  if (!problems.empty()) return Invalid(absl::StrCat("cannot load the weights: ", absl::StrJoin(problems, "; ")));
  // Persistent units hold gathered copies: refresh them.
  for (Unit& u : units_) {
    if (u.persistent) {
      (void)Wait(comm_->AllGather(u.param_shard, u.flat), "all-gathering parameters");
    }
  }
  refresh_host();
  return comm_status_;
}

}  // namespace
}  // namespace braid

BRAID_PLUGIN(registry) {
  // Declares the config sections it implements: zero_optimization.stage 1, 2 and 3.
  absl::Status s = registry->AddStrategy(
      braid::kName, [] { return std::make_unique<braid::ZeroStrategy>(); },
      braid::StrategyTraits{{"zero1", "zero2", "zero3"}});
  return s.ok() ? 0 : 1;
}
