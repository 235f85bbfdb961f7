// The "paramserver" strategy: a parameter server. It is also the worked example of
// docs/WRITING_A_STRATEGY.md, which walks through this file section by section.
//
// Roles. Rank `server_rank` (option, default 0) is the server: it holds the authoritative
// parameters and the optimizer, and trains on no data (the micro-batches the trainer hands it
// are ignored), so a job needs at least two ranks. Every other rank is a worker: it computes the
// gradient of its micro-batches, pushes it to the server and gets fresh parameters back.
// The data-parallel group is the workers alone (data_parallel_rank/size): with W workers they
// read the data W DDP ranks would read, so a sync run equals DDP on W ranks, not on W + 1 of
// which one stream is thrown away (and tokens/s counts only tokens that are trained on).
//
// Messages (point to point only, after Setup). A worker sends one push per step and the server
// answers each push with one reply, in order:
//   push  (worker -> server): header i64 [step, version the gradient was computed on]
//                             payload f32 [gradient..., mean loss, forward s, backward s]
//   reply (server -> worker): header i64 [version, step answered (kFinal from FullStateDict)]
//                             payload f32 [parameters...]
// The version is the number of optimizer updates the server has applied. The server's k-th
// TrainStep receives exactly the k-th push of every worker. It never posts a receive for a push
// that might not come (every rank runs the same number of steps, so a push numbered k is certain
// only once the server itself is in step k); that is what lets training end without a receive
// left waiting, on any communicator.
//
// Modes (option `mode`):
//   sync (default): the server waits for every worker's push, averages the gradients and steps
//     once; every worker waits for the reply. With equal micro-batches on every worker this is
//     one step on the workers' concatenated batch, exactly as single-process training.
//   async: the server applies each push the moment it arrives (one optimizer update per
//     gradient) and answers that worker at once. A worker does not wait for the answer: it
//     computes its next gradient with the parameters it has, as long as at most `max_staleness`
//     of its pushes are unanswered; otherwise it waits for fresh parameters.
//
// Host synchronisations on a GPU (docs/GPU.md, "Synchronisation points"). The headers and a
// push's statistics travel in device memory (the communicator moves device tensors), and what the
// host knows is copied into them, or what it needs copied out of them, by copies it does not wait
// for (core/async_copy.h) on the compute stream. Each rank's one read then covers them: a worker's
// loss and norm read (ComputeGradient), after which it checks the header of the reply it received
// before (its version); the server's read of the mean gradient's squared norm in sync mode
// (ApplyMean), after which it checks the pushes' headers and adds their statistics. In sync mode
// every rank thus waits for its device once per step; async mode still reads each push as it
// comes.
//
// The building blocks live beside this file: the options and their parser in
// paramserver_options.h, the parameters as one flat vector (FlatLayout) in flat_layout.h, the
// messages' buffers and the class in paramserver_strategy.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/async_copy.h"
#include "core/autograd.h"
#include "core/communicator.h"
#include "core/micro_batches.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/scalar_reads.h"
#include "core/strategy.h"
#include "plugins/paramserver/flat_layout.h"
#include "plugins/paramserver/paramserver_errors.h"
#include "plugins/paramserver/paramserver_options.h"
#include "plugins/paramserver/paramserver_stats.h"
#include "plugins/paramserver/paramserver_strategy.h"

namespace braid::paramserver {
namespace {

double Seconds(absl::Time from) { return absl::ToDoubleSeconds(absl::Now() - from); }

}  // namespace

absl::Status ParamServerStrategy::Setup(Module& model, const OptimizerFactory& make_optimizer,
                                        const StrategyContext& ctx) {
  // 1. Options and the world, before any communication.
  BRAID_ASSIGN_OR_RETURN(opts_, ParseOptions(ctx.options));
  const int size = ctx.comm == nullptr ? 1 : ctx.comm->size();
  if (size < 2) {
    return Invalid(absl::StrCat(
        "needs at least 2 ranks (one server, the rest workers) but the world has ", size,
        "; launch more processes (e.g. --nproc_per_node=3 for a server and 2 workers)"));
  }
  if (opts_.server_rank >= size) {
    return Invalid(absl::StrCat("option server_rank=", opts_.server_rank,
                                " is out of range: the world has ", size, " ranks (0..", size - 1,
                                ")"));
  }
  if (!make_optimizer) return Invalid("no optimizer factory given");
  Module::NamedTensors named = model.NamedParameters();
  for (const auto& [n, p] : named) {
    if (p.dtype() != DType::kF32) {
      return Invalid(absl::StrCat("parameter ", p.DescribeForError(),
                                  " is not f32; this strategy sends f32 parameters and gradients"));
    }
  }

  // 2. Placement: every rank keeps the whole model on its device. The server's copy is the
  // authoritative one; a worker's is a cache refreshed by every reply.
  comm_ = ctx.comm;
  device_ = ctx.device;
  max_grad_norm_ = ctx.max_grad_norm;
  for (const auto& [n, p] : named) p.MoveTo(device_);
  for (const auto& [n, b] : model.NamedBuffers()) b.MoveTo(device_);
  std::vector<Tensor> params;
  for (const auto& [n, p] : named) params.push_back(p);
  layout_ = FlatLayout(params);

  // 3. Every rank must run the same protocol on the same message layout.
  BRAID_RETURN_IF_ERROR(CheckRanksAgree(named));

  // 4. Version 0 is the server's initial parameters, on every rank.
  Tensor flat = Tensor::Empty({layout_.numel()}, DType::kF32, device_);
  if (is_server()) layout_.CopyParamsTo(flat);
  BRAID_RETURN_IF_ERROR(comm_->Broadcast(flat, opts_.server_rank)->Wait());
  if (!is_server()) layout_.CopyParamsFrom(flat);

  // 5. The optimizer (see optimizer() for why workers build one too) and the server's buffers.
  optimizer_ = make_optimizer(named);
  if (optimizer_ == nullptr) return Invalid("the optimizer factory returned null");
  stats_ = ParamServerStats{};
  stats_.is_server = is_server();
  if (is_server()) {
    for (int r = 0; r < size; ++r) {
      if (r == opts_.server_rank) continue;
      Peer peer;
      peer.rank = r;
      peer.payload = Tensor::Empty({layout_.numel() + kPushExtras}, DType::kF32, device_);
      peer.reply_params = Tensor::Empty({layout_.numel()}, DType::kF32, device_);
      peers_.push_back(std::move(peer));
    }
  }
  model_ = &model;
  return absl::OkStatus();
}

absl::Status ParamServerStrategy::CheckRanksAgree(const Module::NamedTensors& named) {
  static const char* const kFields[] = {"mode",
                                        "max_staleness",
                                        "server_rank",
                                        "number of parameters",
                                        "number of parameter values",
                                        "parameter names and shapes"};
  const std::vector<int64_t> mine = {int64_t(opts_.mode),   opts_.max_staleness, opts_.server_rank,
                                     int64_t(named.size()), layout_.numel(),     LayoutHash(named)};
  const int64_t n = int64_t(mine.size());
  Tensor all = Tensor::Empty({n * comm_->size()}, DType::kI64, device_);
  BRAID_RETURN_IF_ERROR(comm_->AllGather(Tensor::FromVector(mine, {n}, device_), all)->Wait());
  std::vector<int64_t> rows = all.ToVector<int64_t>();
  for (int r = 0; r < comm_->size(); ++r) {
    for (int64_t f = 0; f < n; ++f) {
      const int64_t theirs = rows[size_t(r * n + f)];
      if (theirs == mine[size_t(f)]) continue;
      std::string detail =
          f == 0 ? absl::StrCat(": rank ", r, " has mode=", ModeName(Mode(theirs)), ", rank ",
                                comm_->rank(), " has mode=", ModeName(opts_.mode))
                 : absl::StrCat(": rank ", r, " has ", theirs, ", rank ", comm_->rank(), " has ",
                                mine[size_t(f)]);
      return Invalid(absl::StrCat("the ranks disagree on the ", kFields[f], detail,
                                  "; every rank must get the same options and the same model"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> ParamServerStrategy::TrainStep(const std::vector<Batch>& micro_batches,
                                                         const LossFn& loss_fn) {
  if (model_ == nullptr) {
    return Failed(absl::StatusCode::kFailedPrecondition, "TrainStep before Setup");
  }
  absl::StatusOr<StepStats> stats = is_server() ? ServerStep() : WorkerStep(micro_batches, loss_fn);
  if (stats.ok()) ++stats_.steps;
  return stats;
}

// ---- Worker -------------------------------------------------------------------------------------

absl::StatusOr<StepStats> ParamServerStrategy::WorkerStep(const std::vector<Batch>& micro_batches,
                                                          const LossFn& loss_fn) {
  if (micro_batches.empty()) return Invalid("TrainStep got no micro-batches");
  StepStats stats;
  const int64_t step = stats_.steps + 1;  // 1-based, as the server counts

  // 1. Fresh enough parameters: take every reply that has arrived, then, if more pushes than
  // the bound are still unanswered, wait for the oldest ones.
  absl::Time wait_start = absl::Now();
  while (!in_flight_.empty() && in_flight_.front().Answered()) {
    BRAID_RETURN_IF_ERROR(FinishOldestPush());
  }
  const size_t bound = opts_.mode == Mode::kAsync ? size_t(opts_.max_staleness) : 0;
  if (in_flight_.size() > bound) ++stats_.waits_for_fresh;
  while (in_flight_.size() > bound) BRAID_RETURN_IF_ERROR(FinishOldestPush());
  stats_.max_steps_ahead = std::max(stats_.max_steps_ahead, int(in_flight_.size()));
  stats.comm_exposed_s = Seconds(wait_start);

  // 2. The gradient of this worker's micro-batches, with the parameters it holds.
  BRAID_RETURN_IF_ERROR(ComputeGradient(micro_batches, loss_fn, &stats));

  // 3. Push it. In sync mode the reply is the step's result, so wait for it here.
  SendPush(step, stats);
  if (opts_.mode == Mode::kSync) {
    wait_start = absl::Now();
    BRAID_RETURN_IF_ERROR(FinishOldestPush());
    stats.comm_exposed_s += Seconds(wait_start);
  }
  return stats;
}

// As the "single" strategy: each micro-batch's loss is scaled by 1/k, so the accumulated gradient
// is that of the mean loss over their concatenation (equal micro-batches).
absl::Status ParamServerStrategy::ComputeGradient(const std::vector<Batch>& micro_batches,
                                                  const LossFn& loss_fn, StepStats* stats) {
  model_->ZeroGrad();
  MicroBatchEvents events;
  events.read_loss_later = true;  // read with the norm: one host synchronisation, not two
  BRAID_RETURN_IF_ERROR(RunMicroBatches(name(), *model_, micro_batches, loss_fn, stats, events));
  // A worker never sees the gradient the server applies: like its loss, the norm it reports is
  // that of its own (pushed) gradient. Measured only; the server clips.
  const std::vector<float> read =
      ReadScalars({stats->device_loss, SquaredGradNormOnDevice(model_->Parameters())});
  stats->loss = read[0];
  stats->grad_norm = float(std::sqrt(double(read[1])));
  // That read synchronised the stream the last replies' headers were copied out on.
  return CheckReplies(/*wait=*/false);
}

// The headers of the replies received so far: each must answer its push, and the last gives the
// version the next push is computed on. Copied out with no wait; `wait` only where no read has
// synchronised the device since (the final state).
absl::Status ParamServerStrategy::CheckReplies(bool wait) {
  std::vector<ReplyCheck> checks;
  checks.swap(reply_checks_);
  for (ReplyCheck& c : checks) {
    if (wait) c.copy->Wait();
    BRAID_CHECK(c.copy->Done()) << "paramserver: a reply's header is read before its copy to the host is done";
    const std::vector<int64_t> header = c.header_host.ToVector<int64_t>();
    if (header[1] != c.step) {
      return Failed(absl::StatusCode::kInternal,
                    absl::StrCat("rank ", comm_->rank(), " expected the reply to its step ", c.step,
                                 " push but got one for step ", header[1]));
    }
    stats_.version = header[0];
  }
  return absl::OkStatus();
}

void ParamServerStrategy::SendPush(int64_t step, const StepStats& stats) {
  Push p;
  if (!spare_.empty()) {
    p = std::move(spare_.back());
    spare_.pop_back();
  } else {
    p.payload = Tensor::Empty({layout_.numel() + kPushExtras}, DType::kF32, device_);
    p.reply_params = Tensor::Empty({layout_.numel()}, DType::kF32, device_);
  }
  p.step = step;
  layout_.CopyGradsTo(p.payload);
  // Host values into device memory by copies the host does not wait for: the buffers stay in the
  // push until it is answered.
  p.extras_host = Tensor::FromVector(
      std::vector<float>{stats.loss, float(stats.forward_s), float(stats.backward_s)}, {kPushExtras});
  (void)CopyAsync(p.extras_host, p.payload.FlatRange(layout_.numel(), kPushExtras), CopyQueue::kCompute);
  p.header_host = Tensor::FromVector(std::vector<int64_t>{step, stats_.version}, {2});
  p.header = Tensor::Empty({2}, DType::kI64, device_);
  (void)CopyAsync(p.header_host, p.header, CopyQueue::kCompute);
  p.reply_header = Tensor::Empty({2}, DType::kI64, device_);
  const int server = opts_.server_rank;
  // The reply's receives are posted with the push, so the server's answer never waits for us.
  p.works = {comm_->Send(p.header, server, kPushHeader),
             comm_->Send(p.payload, server, kPushPayload),
             comm_->Recv(p.reply_header, server, kReplyHeader),
             comm_->Recv(p.reply_params, server, kReplyParams)};
  in_flight_.push_back(std::move(p));
}

// Waits for the oldest push's reply and loads the parameters it carries into the model.
absl::Status ParamServerStrategy::FinishOldestPush() {
  Push& p = in_flight_.front();
  for (const auto& w : p.works) BRAID_RETURN_IF_ERROR(w->Wait());
  // The header is checked after the next read (CheckReplies): reading it now would wait.
  ReplyCheck check;
  check.step = p.step;
  check.header_host = Tensor::Empty({2}, DType::kI64);
  check.copy = CopyAsync(p.reply_header, check.header_host, CopyQueue::kCompute);
  reply_checks_.push_back(std::move(check));
  layout_.CopyParamsFrom(p.reply_params);
  p.works.clear();
  spare_.push_back(std::move(p));
  in_flight_.pop_front();
  return absl::OkStatus();
}

// ---- Server -------------------------------------------------------------------------------------

absl::StatusOr<StepStats> ParamServerStrategy::ServerStep() {
  StepStats stats;
  const int64_t step = stats_.steps + 1;
  absl::Time start = absl::Now();
  // Every rank runs this step, so each worker's push numbered `step` is certain to come.
  for (Peer& peer : peers_) {
    peer.header = Tensor::Empty({2}, DType::kI64, device_);
    peer.recvs = {comm_->Recv(peer.header, peer.rank, kPushHeader),
                  comm_->Recv(peer.payload, peer.rank, kPushPayload)};
    peer.received = false;
  }
  PushSums sums;
  float norm_sum = 0;
  if (opts_.mode == Mode::kSync) {
    // Wait for all, then one update with the mean gradient (summed in rank order, so the result
    // does not depend on arrival order).
    for (Peer& peer : peers_) BRAID_RETURN_IF_ERROR(ReceivePush(peer));
    Tensor mean;
    {
      autograd::NoGradGuard no_grad;
      for (Peer& peer : peers_) {
        Tensor g = peer.payload.FlatRange(0, layout_.numel());
        mean = mean.defined() ? ops::Add(mean, g) : g;
      }
      mean = ops::Scale(mean, 1.0f / float(peers_.size()));
    }
    // The headers and statistics are checked after the norm's read, before anything is stepped.
    absl::Status checked;
    norm_sum = ApplyMean(
        mean,
        [&]() -> absl::Status {
          for (Peer& peer : peers_) BRAID_RETURN_IF_ERROR(CheckPush(peer, step, &sums));
          return absl::OkStatus();
        },
        &checked, &stats);
    BRAID_RETURN_IF_ERROR(checked);
    for (Peer& peer : peers_) SendReply(peer, step);
  } else {
    // Apply each push as it arrives and answer that worker at once. The communicator has no
    // "receive from anyone", so the server polls its posted receives.
    absl::Time deadline = absl::Now() + comm_->timeout();
    absl::Duration nap = absl::Microseconds(20);
    size_t done = 0;
    while (done < peers_.size()) {
      bool progressed = false;
      for (Peer& peer : peers_) {
        if (peer.received || !peer.recvs[0]->IsCompleted() || !peer.recvs[1]->IsCompleted()) {
          continue;
        }
        BRAID_ASSIGN_OR_RETURN(int64_t computed_on, TakePush(peer, step, &sums));
        norm_sum += Apply(peer.payload.FlatRange(0, layout_.numel()), computed_on, &stats);
        SendReply(peer, step);
        ++done;
        progressed = true;
      }
      if (progressed) {
        deadline = absl::Now() + comm_->timeout();
        nap = absl::Microseconds(20);
        continue;
      }
      if (absl::Now() > deadline) {
        std::vector<int> missing;
        for (const Peer& peer : peers_) {
          if (!peer.received) missing.push_back(peer.rank);
        }
        return Failed(
            absl::StatusCode::kDeadlineExceeded,
            absl::StrCat("the server heard from no worker for ",
                         absl::FormatDuration(comm_->timeout()), " while waiting for the step ",
                         step, " gradient of worker rank(s) ", absl::StrJoin(missing, ", "),
                         "; a worker failed or runs fewer steps (see its log)"));
      }
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
  }
  BRAID_RETURN_IF_ERROR(WaitForReplies());
  const size_t updates = opts_.mode == Mode::kSync ? 1 : peers_.size();
  const double workers = double(peers_.size());
  stats.loss = float(sums.loss / workers);
  stats.grad_norm = norm_sum / float(updates);  // of the applied gradient(s), before clipping
  // The job's time split as seen from here: the workers' mean forward and backward, then what
  // is left of the step besides the optimizer (transfers, waiting for the slowest worker).
  stats.forward_s = sums.forward_s / workers;
  stats.backward_s = sums.backward_s / workers;
  stats.comm_exposed_s = std::max(
      0.0, Seconds(start) - stats.optimizer_s - stats.forward_s - stats.backward_s);
  return stats;
}

// Waits for `peer`'s push (already complete in async mode), checks that it is the one due, adds
// its loss and times to `sums` and returns the version its gradient was computed on.
absl::StatusOr<int64_t> ParamServerStrategy::TakePush(Peer& peer, int64_t step, PushSums* sums) {
  for (const auto& w : peer.recvs) BRAID_RETURN_IF_ERROR(w->Wait());
  peer.received = true;
  std::vector<int64_t> header = peer.header.ToVector<int64_t>();
  if (header[0] != step) {
    return Failed(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("worker rank ", peer.rank, " pushed its step ", header[0],
                               " gradient during the server's step ", step,
                               "; every rank must call TrainStep the same number of times"));
  }
  const std::vector<float> extras =
      peer.payload.FlatRange(layout_.numel(), kPushExtras).ToFloatVector();
  sums->loss += extras[0];
  sums->forward_s += extras[1];
  sums->backward_s += extras[2];
  return header[1];
}

// Sync mode: waits for `peer`'s push to arrive (the communicator's wait) and copies its header
// and statistics to the host without waiting for the device (CheckPush reads them).
absl::Status ParamServerStrategy::ReceivePush(Peer& peer) {
  for (const auto& w : peer.recvs) BRAID_RETURN_IF_ERROR(w->Wait());
  peer.received = true;
  if (!peer.header_host.defined()) {
    peer.header_host = Tensor::Empty({2}, DType::kI64);
    peer.extras_host = Tensor::Empty({kPushExtras}, DType::kF32);
  }
  peer.copies.clear();
  peer.copies.push_back(CopyAsync(peer.header, peer.header_host, CopyQueue::kCompute));
  peer.copies.push_back(
      CopyAsync(peer.payload.FlatRange(layout_.numel(), kPushExtras), peer.extras_host, CopyQueue::kCompute));
  return absl::OkStatus();
}

// Sync mode, after the step's read: `peer`'s push is the one due, on the current version; adds
// its loss and times to `sums`.
absl::Status ParamServerStrategy::CheckPush(Peer& peer, int64_t step, PushSums* sums) {
  for (const auto& c : peer.copies) {
    BRAID_CHECK(c->Done()) << "paramserver: a push's header is read before its copy to the host is done";
  }
  peer.copies.clear();
  const std::vector<int64_t> header = peer.header_host.ToVector<int64_t>();
  if (header[0] != step) {
    return Failed(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("worker rank ", peer.rank, " pushed its step ", header[0],
                               " gradient during the server's step ", step,
                               "; every rank must call TrainStep the same number of times"));
  }
  if (header[1] != stats_.version) {
    return Failed(absl::StatusCode::kInternal,
                  absl::StrCat("worker rank ", peer.rank, " computed its step ", step,
                               " gradient on version ", header[1], ", not the current ",
                               stats_.version));
  }
  const std::vector<float> extras = peer.extras_host.ToFloatVector();
  sums->loss += extras[0];
  sums->forward_s += extras[1];
  sums->backward_s += extras[2];
  return absl::OkStatus();
}

// Sync mode's update with the mean gradient: its squared norm is computed on the device and read
// in the step's one host synchronisation, after which `after_read` (the pushes' checks) runs; its
// error goes to `checked` and nothing is stepped. Clips as Apply does (the same factor, through
// the optimizer) and returns the norm before clipping.
float ParamServerStrategy::ApplyMean(const Tensor& mean, const std::function<absl::Status()>& after_read,
                                     absl::Status* checked, StepStats* stats) {
  absl::Time start = absl::Now();
  layout_.UseAsGrads(mean);
  const std::vector<Tensor> params = model_->Parameters();
  const float squared = ReadScalars({SquaredGradNormOnDevice(params)})[0];
  *checked = after_read();
  if (!checked->ok()) {
    optimizer_->ZeroGrad();
    return 0;
  }
  const float norm =
      ClipGradNormFromSquared(*optimizer_, squared, max_grad_norm_, [](double sum) { return sum; });
  optimizer_->Step();
  optimizer_->ZeroGrad();
  ++stats_.version;
  ++stats_.gradients_applied;
  stats->optimizer_s += Seconds(start);
  return norm;
}

// One optimizer update with `gradient` (flat, numel values), computed on parameters of version
// `computed_on`. Returns the gradient's norm before clipping (measured whether or not clipping
// is on: ClipGradNorm with max_grad_norm_ <= 0 only measures).
float ParamServerStrategy::Apply(const Tensor& gradient, int64_t computed_on, StepStats* stats) {
  absl::Time start = absl::Now();
  layout_.UseAsGrads(gradient);
  const float norm = ClipGradNorm(model_->Parameters(), max_grad_norm_);
  optimizer_->Step();
  optimizer_->ZeroGrad();
  stats_.max_version_lag = std::max(stats_.max_version_lag, stats_.version - computed_on);
  ++stats_.version;
  ++stats_.gradients_applied;
  stats->optimizer_s += Seconds(start);
  return norm;
}

// Sends `peer` the current parameters. The buffer is `peer`'s own and its previous reply has
// been waited for (WaitForReplies), so nothing still being sent is overwritten.
void ParamServerStrategy::SendReply(Peer& peer, int64_t step) {
  layout_.CopyParamsTo(peer.reply_params);
  // Written by a copy the host does not wait for, from a host buffer kept until the next reply.
  peer.reply_header_host = Tensor::FromVector(std::vector<int64_t>{stats_.version, step}, {2});
  peer.reply_header = Tensor::Empty({2}, DType::kI64, device_);
  (void)CopyAsync(peer.reply_header_host, peer.reply_header, CopyQueue::kCompute);
  reply_sends_.push_back(comm_->Send(peer.reply_header, peer.rank, kReplyHeader));
  reply_sends_.push_back(comm_->Send(peer.reply_params, peer.rank, kReplyParams));
}

absl::Status ParamServerStrategy::WaitForReplies() {
  std::vector<std::shared_ptr<Work>> sends;
  sends.swap(reply_sends_);
  for (const auto& w : sends) BRAID_RETURN_IF_ERROR(w->Wait());
  return absl::OkStatus();
}

// ---- The final state ----------------------------------------------------------------------------

// A collective call, like a sharded strategy's: the server sends its parameters to every worker,
// so that each rank returns the authoritative state (in async mode a worker's own copy is a
// little behind the server's).
absl::StatusOr<std::map<std::string, Tensor>> ParamServerStrategy::FullStateDict() {
  if (model_ == nullptr) {
    return Failed(absl::StatusCode::kFailedPrecondition, "FullStateDict before Setup");
  }
  if (is_server()) {
    for (Peer& peer : peers_) SendReply(peer, kFinal);
    BRAID_RETURN_IF_ERROR(WaitForReplies());
    return model_->StateDict();
  }
  while (!in_flight_.empty()) BRAID_RETURN_IF_ERROR(FinishOldestPush());
  BRAID_RETURN_IF_ERROR(CheckReplies(/*wait=*/true));
  Tensor header = Tensor::Empty({2}, DType::kI64, device_);
  Tensor params = Tensor::Empty({layout_.numel()}, DType::kF32, device_);
  std::shared_ptr<Work> h = comm_->Recv(header, opts_.server_rank, kReplyHeader);
  std::shared_ptr<Work> p = comm_->Recv(params, opts_.server_rank, kReplyParams);
  BRAID_RETURN_IF_ERROR(h->Wait());
  BRAID_RETURN_IF_ERROR(p->Wait());
  std::vector<int64_t> fields = header.ToVector<int64_t>();
  if (fields[1] != kFinal) {
    return Failed(absl::StatusCode::kInternal,
                  absl::StrCat("rank ", comm_->rank(),
                               " expected the final parameters but got "
                               "the reply to a step ",
                               fields[1], " push"));
  }
  layout_.CopyParamsFrom(params);
  stats_.version = fields[0];
  return model_->StateDict();
}

}  // namespace braid::paramserver

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy(
      "paramserver", [] { return std::make_unique<braid::paramserver::ParamServerStrategy>(); },
      braid::StrategyTraits{{}, {braid::kAxisData}, "its server keeps the whole model"});
  return s.ok() ? 0 : 1;
}
