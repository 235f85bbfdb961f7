// The zero strategy's training step: units, hooks, reductions, the optimizer's step
// (zero_strategy.h says what each stage keeps). State dicts are in zero_state.cc.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/deferred_init.h"
#include "core/kernels.h"
#include "core/micro_batches.h"
#include "core/pinned_host.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "plugins/zero/zero_strategy.h"

namespace braid::zero {

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
  }
}

// Gives every unit its flat buffer (stage 1/2: full; stage 3: the shard, and a released full
// buffer) with the parameters' values, and makes each parameter a view of the full buffer.
absl::Status ZeroStrategy::Materialize(Unit& u) {
  const Device dev = u.slots.front().param.device();
  if (opts_.stage < 3) {
    u.flat = Tensor::Zeros({u.padded}, dtype_, dev);
    params_.Add(Bytes(u.padded));
    for (Slot& s : u.slots) {
      Tensor dst = u.flat.FlatRange(s.offset, s.param.numel(), s.param.shape());
      if (IsDeferred(s.param)) braid::Materialize(s.param);
      dst.CopyFrom(s.param);
      s.param.RebindTo(dst);
    }
    return absl::OkStatus();
  }
  // Stage 3: only this rank's shard is ever materialised (with offload_param, in host memory;
  // its device-side copy exists only while the unit is gathered).
  if (opts_.offload_param) {
    u.host_shard = Tensor::Zeros({u.shard}, dtype_, host_device_);
    host_params_.Add(Bytes(u.shard));
    u.param_shard = Tensor::Unallocated({u.shard}, dtype_, dev);
  } else {
    u.param_shard = Tensor::Zeros({u.shard}, dtype_, dev);
    params_.Add(Bytes(u.shard));
  }
  auto [own_b, own_e] = OwnRange(u);
  std::vector<float> buf;
  for (Slot& s : u.slots) {
    int64_t b = std::max(own_b, s.offset), e = std::min(own_e, s.offset + s.param.numel());
    if (b >= e) continue;
    Tensor dst = ShardHome(u).FlatRange(b - own_b, e - b);
    if (IsDeferred(s.param)) {
      buf.resize(size_t(e - b));
      InitialValues(s.param, b - s.offset, e - s.offset, buf.data());
      dst.CopyFrom(Tensor::FromVector(buf, {e - b}));
    } else {
      dst.CopyFrom(s.param.Detach().Reshape({-1}).FlatRange(b - s.offset, e - b));
    }
  }
  u.flat = Tensor::Unallocated({u.padded}, dtype_, dev);
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
  // Offloaded state in page-locked memory where the device's backend has it (CUDA), else in
  // pageable host memory (a CPU run copies nothing across a bus: pinning means nothing there).
  if (host_step()) host_device_ = OffloadHost(ctx.device, opts_.pin_memory);
  comm_ = ctx.comm;
  rank_ = comm_->rank();
  world_ = comm_->size();
  max_grad_norm_ = ctx.max_grad_norm;
  model_parallel_sum_on_device_ = ctx.model_parallel_sum_on_device;
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
  // One dtype for every flat buffer: f32, or bf16/f16 under mixed precision (core/
  // mixed_precision.h), whose optimizer keeps f32 masters of this rank's shards.
  bool first = true;
  for (const auto& [n, p] : model.NamedParameters()) {
    if (!p.requires_grad()) continue;
    if (first) dtype_ = p.dtype();
    first = false;
    if (p.dtype() != dtype_) {
      return Invalid(absl::StrCat("parameter ", p.DescribeForError(), " is not ", DTypeName(dtype_),
                                  " like the others: ZeRO flattens parameters of one dtype"));
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
  std::vector<Tensor> homes;  // offload_param: each piece's view of its host shard
  for (Unit& u : units_) {
    auto [own_b, own_e] = OwnRange(u);
    if (opts_.stage == 1) {
      // Stage 1 keeps the full gradients anyway: the reduced shard is written over this rank's
      // own slice of them, so it costs nothing more (8Ψ + 8Ψ/N in all, as the paper counts).
      PrepareGrads(u);
      u.grad_shard = u.flat_grad.FlatRange(int64_t(rank_) * u.shard, u.shard);
    } else {
      u.grad_shard = Tensor::Zeros({u.shard}, dtype_, ctx.device);
      grads_.Add(Bytes(u.shard));
    }
    for (Slot& s : u.slots) {
      int64_t b = std::max(own_b, s.offset), e = std::min(own_e, s.offset + s.param.numel());
      if (b >= e) continue;
      Tensor piece = opts_.stage < 3 ? u.flat.FlatRange(b, e - b)
                                     : u.param_shard.FlatRange(b - own_b, e - b);
      piece.set_name(absl::StrCat(s.name, "[", b - s.offset, ":", e - s.offset, "]"));
      piece.set_weight_decay(s.param.weight_decay());
      piece.set_grad_norm_share(s.param.grad_norm_share());  // 1/t when tensor parallelism replicates it
      piece.set_grad(u.grad_shard.FlatRange(b - own_b, e - b));
      named.emplace_back(s.name, piece);
      homes.push_back(opts_.offload_param ? u.host_shard.FlatRange(b - own_b, e - b) : Tensor());
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
  std::vector<Tensor> sorted_homes;
  pieces_.clear();
  for (size_t i : idx) {
    sorted.push_back(named[i]);
    sorted_homes.push_back(homes[i]);
    pieces_.push_back(named[i].second);
  }
  named = std::move(sorted);
  if (host_step()) {
    // ZeRO-Offload: the optimizer steps host copies; only gradients go to the host and
    // updated parameters come back, each step. The copies keep the pieces' dtype: under
    // fp16/bf16 the optimizer the factory builds (launcher/mixed_precision/mixed_precision.h) then keeps its f32
    // masters and its state on the host too, as ZeRO-Offload does. With offload_param the
    // shards already live on the host: the optimizer steps them in place (its state is then on
    // the host whether or not offload_optimizer says so), and only gradients are copied.
    for (size_t i = 0; i < named.size(); ++i) {
      Tensor& piece = named[i].second;
      Tensor h = opts_.offload_param ? sorted_homes[i] : piece.Detach().To(host_device_);
      h.set_name(piece.name()).set_weight_decay(piece.weight_decay());
      h.set_grad_norm_share(piece.grad_norm_share());
      h.set_grad(Tensor::Zeros(piece.shape(), piece.dtype(), host_device_));
      host_.Add((opts_.offload_param ? 1 : 2) * int64_t(piece.nbytes()));
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

// offload_param: the unit's shard copied from host memory to the device for its all-gather (on
// CUDA a host-to-device copy on the copy stream, a DMA from page-locked memory with
// pin_memory), which the host never waits for. `ahead`: only issued, so that it runs while the
// units before it compute (PrefetchAfter); otherwise the current stream, which the gather is
// ordered after, also waits for it (on the device).
void ZeroStrategy::StageIn(Unit& u, bool ahead) {
  if (!opts_.offload_param) return;
  if (!u.param_shard.has_data()) {
    u.param_shard.storage()->Reallocate();
    params_.Add(Bytes(u.shard));
    u.copy_in = CopyAsync(u.host_shard, u.param_shard, CopyQueue::kCopy);
  }
  if (!ahead) u.copy_in->OrderBeforeCurrentStream();
}

// offload_param: the device-side copy given back once its all-gather is done (or at the end of
// the step, staged ahead and never gathered). Nothing is copied out: the optimizer steps the host
// shard itself. The memory goes back to the current stream's pool, so that stream first waits
// for the copy that writes it (already so after a gather).
void ZeroStrategy::StageOut(Unit& u) {
  if (!opts_.offload_param || !u.param_shard.has_data()) return;
  u.copy_in->OrderBeforeCurrentStream();
  u.param_shard.storage()->Release();
  params_.Sub(Bytes(u.shard));
}

// Before the optimizer writes host memory a copy reads (offload_param's host shards, the
// offload_optimizer pieces copied back last step) or reads host memory a copy writes (the
// gradients): every such copy was ordered before the compute stream (StageIn / StageOut, or
// enqueued on it), and the step's one read (ReadStepScalarsAndClip) has synchronised that stream,
// so each is done. Asked of the device without waiting; one still in flight is a broken
// invariant, not a race to lose.
void ZeroStrategy::CheckHostCopiesDone(const std::vector<std::unique_ptr<InFlightCopy>>& grad_copies) {
  for (Unit& u : units_) {
    if (!u.copy_in) continue;
    BRAID_CHECK(u.copy_in->Done()) << "zero: the optimizer would write the host shard of unit '"
                                   << u.name << "' while its copy to the device still reads it";
    if (!u.param_shard.has_data()) u.copy_in.reset();
  }
  for (const auto& c : param_copies_) {
    BRAID_CHECK(c->Done()) << "zero: the optimizer would write offloaded parameters still being "
                              "copied to the device";
  }
  param_copies_.clear();
  for (const auto& c : grad_copies) {
    BRAID_CHECK(c->Done()) << "zero: the optimizer would read gradients still being copied to the host";
  }
}

// For writers of offloaded state outside a step (loading a checkpoint): the host waits for every
// copy that may still read it. Not per step.
void ZeroStrategy::SettleHostCopies() {
  for (Unit& u : units_) {
    if (u.copy_in) u.copy_in->Wait();
  }
  for (const auto& c : param_copies_) c->Wait();
  param_copies_.clear();
}

// Gives the unit's full buffer memory and launches the all-gather of the shards into it.
std::shared_ptr<Work> ZeroStrategy::StartGather(Unit& u) {
  u.flat.storage()->Reallocate();
  params_.Add(Bytes(u.padded));
  StageIn(u);
  return comm_->AllGather(u.param_shard, u.flat);
}

// A unit that stays gathered (persistent), all-gathered again from the shards as they are now.
void ZeroStrategy::Regather(Unit& u, const char* what) {
  StageIn(u);
  (void)WaitOnDevice(comm_->AllGather(u.param_shard, u.flat), what);
  StageOut(u);
}

void ZeroStrategy::Gather(Unit& u) {
  if (u.gathered++ > 0) return;
  if (u.prefetch) {  // launched ahead of use: the unit's kernels wait for it
    (void)WaitOnDevice(u.prefetch, "all-gathering parameters (prefetched)");
    u.prefetch.reset();
    StageOut(u);
    return;
  }
  if (u.flat.has_data()) return;  // persistent
  (void)WaitOnDevice(StartGather(u), "all-gathering parameters");
  StageOut(u);
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
  u.prefetch = StartGather(u);
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
    if (budget < 0) {
      ++it;
      break;
    }
    budget -= next.padded;
  }
  // offload_param: the shard of the unit after the prefetched ones starts its copy to the device
  // now, so the copy runs while the units before it compute, ahead of its own gather.
  if (opts_.offload_param && it != order.end()) {
    Unit& after = units_[size_t(*it)];
    if (after.gathered == 0 && !after.prefetch && !after.flat.has_data()) StageIn(after, /*ahead=*/true);
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
    u.flat_grad = Tensor::Unallocated({u.padded}, dtype_, u.flat.device());
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
  u.pending_out = Tensor::Empty({u.shard}, dtype_, u.grad_shard.device());
  transient_.Add(Bytes(u.shard));
  u.pending = comm_->ReduceScatter(u.flat_grad, u.pending_out, ReduceOp::kAvg);
  if (!opts_.overlap_comm) (void)WaitOnDevice(u.pending, "reduce-scattering gradients");
}

// Waits for a unit's reduce-scatter and adds the result into its gradient shard; stage 2/3 then
// give the full gradient buffer back.
void ZeroStrategy::FinishReduceScatter(Unit& u, StepStats* stats) {
  if (!u.pending) return;
  u.reduced = true;
  absl::Time start = absl::Now();
  if (WaitOnDevice(u.pending, "reduce-scattering gradients").ok()) {
    if (opts_.stage == 1) {
      u.grad_shard.CopyFrom(u.pending_out);  // once per step, over the local gradients
    } else {
      kernels::axpby.Get(u.grad_shard.device(), dtype_)(1.0f, u.pending_out, 1.0f, u.grad_shard);
    }
  }
  if (!in_backward_ && stats != nullptr) stats->comm_exposed_s += Seconds(start);
  u.pending.reset();
  u.pending_out = Tensor();
  transient_.Sub(Bytes(u.shard));
  if (stats != nullptr) {
    stats->comm_bytes += Bytes(u.padded);
    stats->comm_what = "gradients reduce-scattered";
  }
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
    // Stage 1's gradients (the shard is a slice of them) live from step to step: zeroed here.
    (opts_.stage == 1 ? u.flat_grad : u.grad_shard).Zero();
  }
  step_stats_ = &stats;
  MicroBatchEvents events;
  events.read_loss_later = true;  // read with the norm, after the step's reductions
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
  // A prefetch still outstanding holds the values from before the step: drop it, so the next
  // use gathers the updated shards. (A model run in pieces, a pipeline stage's chunks, may end
  // the step right after a forward that prefetched a unit it did not use.)
  for (Unit& u : units_) {
    if (!u.prefetch) continue;
    (void)WaitOnDevice(u.prefetch, "all-gathering parameters (prefetched)");
    u.prefetch.reset();
    StageOut(u);
    if (u.gathered == 0 && !u.persistent) {
      u.flat.storage()->Release();
      params_.Sub(Bytes(u.padded));
    }
  }

  for (Unit& u : units_) {
    if (u.gathered == 0) StageOut(u);  // staged ahead of a gather the step did not make
  }

  absl::Time start = absl::Now();
  std::vector<std::unique_ptr<InFlightCopy>> grad_copies;
  if (host_step()) {
    // Enqueued behind backward on the compute stream, which the one read below synchronises:
    // the host finds them done there instead of waiting for each piece.
    for (size_t i = 0; i < pieces_.size(); ++i) {
      grad_copies.push_back(CopyAsync(pieces_[i].grad(), host_pieces_[i].grad(), CopyQueue::kCompute));
    }
  }
  // The global norm over every rank's shard; every rank scales by the same factor (through the
  // optimizer, which steps the host copies under offload). The shards' squared norms are taken
  // from the gradients on the device (the host copies hold the same values), summed over the
  // ranks there, then read with the loss and the optimizer's checks: the step's one host
  // synchronisation (core/micro_batches.h).
  ReadStepScalarsAndClip(
      *optimizer_, pieces_, max_grad_norm_, units_.front().grad_shard.device(),
      [this, &stats](Tensor& squared) {
        // world_ == 1: exactly what one process computes.
        if (world_ > 1) (void)WaitOnDevice(comm_->AllReduce(squared, ReduceOp::kSum), "all-reducing the gradient norm");
        if (model_parallel_sum_on_device_) model_parallel_sum_on_device_(squared, stats.device_loss);
      },
      /*global_sum=*/nullptr, &stats);
  CheckHostCopiesDone(grad_copies);
  optimizer_->Step();
  if (opts_.offload_optimizer && !opts_.offload_param) {
    // The host pieces are next written by the next step's optimizer, after its one read.
    for (size_t i = 0; i < pieces_.size(); ++i) {
      param_copies_.push_back(CopyAsync(host_pieces_[i], pieces_[i], CopyQueue::kCompute));
    }
  }
  if (optim_.peak == 0) {  // the optimizer makes its state at its first step
    int64_t bytes = 0;
    for (auto& [n, t] : optimizer_->StateDict()) bytes += int64_t(t.nbytes());
    optim_.Add(bytes);
  }
  stats.optimizer_s = Seconds(start);

  // Stage 1/2: every rank gets everyone's updated shard (stage 3 gathers on use, except the
  // units that stay gathered, which must see the step too).
  start = absl::Now();
  for (Unit& u : units_) {
    if (opts_.stage < 3) {
      Tensor own = u.flat.FlatRange(int64_t(rank_) * u.shard, u.shard).Clone();
      transient_.Add(Bytes(u.shard));
      (void)WaitOnDevice(comm_->AllGather(own, u.flat), "all-gathering parameters");
      transient_.Sub(Bytes(u.shard));
    } else if (u.persistent) {
      Regather(u, "all-gathering persistent parameters");
    }
  }
  stats.comm_exposed_s += Seconds(start);
  BRAID_RETURN_IF_ERROR(comm_status_);
  return stats;
}

}  // namespace braid::zero

BRAID_PLUGIN(registry) {
  // Declares the config sections it implements: zero_optimization.stage 1, 2 and 3.
  absl::Status s = registry->AddStrategy(
      braid::zero::kName, [] { return std::make_unique<braid::zero::ZeroStrategy>(); },
      braid::StrategyTraits{{"zero1", "zero2", "zero3", "fp16", "bf16"}});
  return s.ok() ? 0 : 1;
}
