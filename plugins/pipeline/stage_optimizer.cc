#include "plugins/pipeline/stage_optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/kernels.h"

namespace braid::pipeline {
namespace {

double SquaredNorm(const Tensor& g) {
  Tensor sq = Tensor::Empty(g.shape(), DType::kF32, g.device());
  kernels::unary.Get(g.device())(kernels::UnaryOp::kSquare, g, 0.0f, sq);
  Tensor s = Tensor::Empty({}, DType::kF32, g.device());
  kernels::sum_all.Get(g.device())(sq, s);
  return double(s.item());
}

}  // namespace

absl::StatusOr<std::unique_ptr<StageOptimizer>> StageOptimizer::Create(
    const std::vector<std::pair<std::string, Tensor>>& own, const std::set<std::string>& counted,
    Communicator& data, int zero_stage, const OptimizerFactory& make_optimizer, Device device,
    const std::set<std::string>& tied) {
  auto so = std::unique_ptr<StageOptimizer>(new StageOptimizer());
  so->tied_ = tied;
  so->zero_stage_ = zero_stage;
  so->data_ = &data;
  so->device_ = device;
  so->own_ = own;
  so->counted_ = counted;
  for (auto& [n, p] : own) so->numel_ += p.numel();
  if (!so->sharded()) {
    so->optimizer_ = make_optimizer(own);
    if (so->optimizer_ == nullptr) {
      return absl::InvalidArgumentError("strategy 'pipeline': the optimizer factory returned null");
    }
    return so;
  }
  const int d = data.size(), r = data.rank();
  so->padded_ = (so->numel_ + d - 1) / d * d;
  so->shard_ = so->padded_ / d;
  so->flat_ = Tensor::Zeros({so->padded_}, DType::kF32, device);
  so->grad_shard_ = Tensor::Zeros({so->shard_}, DType::kF32, device);
  const int64_t own_b = int64_t(r) * so->shard_, own_e = std::min(so->numel_, own_b + so->shard_);
  std::vector<std::pair<std::string, Tensor>> named;
  int64_t at = 0;
  for (auto& [n, p] : own) {
    Tensor view = so->flat_.FlatRange(at, p.numel(), p.shape());
    view.CopyFrom(p);
    p.RebindTo(view);  // every handle to the parameter now reads the flat buffer
    const int64_t b = std::max(own_b, at), e = std::min(own_e, at + p.numel());
    if (b < e) {
      Tensor piece = so->flat_.FlatRange(b, e - b);
      piece.set_name(absl::StrCat(n, "[", b - at, ":", e - at, "]"));
      piece.set_weight_decay(p.weight_decay());
      piece.set_grad_norm_share(counted.count(n) ? p.grad_norm_share() : 0.0f);
      piece.set_grad(so->grad_shard_.FlatRange(b - own_b, e - b));
      so->pieces_.push_back(piece);
      named.emplace_back(n, piece);
    }
    at += p.numel();
  }
  so->optimizer_ = make_optimizer(named);
  if (so->optimizer_ == nullptr) {
    return absl::InvalidArgumentError("strategy 'pipeline': the optimizer factory returned null");
  }
  return so;
}

void StageOptimizer::ZeroGrad() {
  for (auto& [n, p] : own_) p.ZeroGrad();
  // The pieces keep their gradients as views of the shard (never the optimizer's ZeroGrad,
  // which would drop the views): zeroing the shard clears them.
  if (sharded()) grad_shard_.Zero();
}

absl::Status StageOptimizer::FinishPending() {
  if (pending_ == nullptr) return absl::OkStatus();
  absl::Status st = pending_->Wait();
  pending_ = nullptr;
  BRAID_RETURN_IF_ERROR(st);
  kernels::axpby.Get(device_)(1.0f, pending_out_, 1.0f, grad_shard_);
  pending_in_ = pending_out_ = Tensor();
  return absl::OkStatus();
}

absl::Status StageOptimizer::ReduceMicroBatch() {
  if (zero_stage_ < 2 || !sharded()) return absl::OkStatus();
  BRAID_RETURN_IF_ERROR(FinishPending());  // one in flight at a time
  Tensor flat = Tensor::Zeros({padded_}, DType::kF32, device_);
  int64_t at = 0;
  for (auto& [n, p] : own_) {
    if (!tied_.count(n) && p.grad().defined()) {
      flat.FlatRange(at, p.numel()).CopyFrom(p.grad().Reshape({-1}));
      p.ZeroGrad();  // the full gradient is done with: the shard accumulates
    }
    at += p.numel();
  }
  comm_bytes_ += int64_t(flat.nbytes());
  pending_in_ = flat;
  pending_out_ = Tensor::Empty({shard_}, DType::kF32, device_);
  pending_ = data_->ReduceScatter(pending_in_, pending_out_, ReduceOp::kAvg);
  return absl::OkStatus();
}

absl::Status StageOptimizer::Reduce() {
  if (data_->size() == 1) return absl::OkStatus();
  if (zero_stage_ >= 2 && sharded()) {
    // What is left: the tied weights' (summed between their stages by now) and anything a
    // backward added after the last per-micro-batch reduce-scatter.
    BRAID_RETURN_IF_ERROR(FinishPending());
    Tensor flat = Tensor::Zeros({padded_}, DType::kF32, device_);
    int64_t at = 0;
    for (auto& [n, p] : own_) {
      if (p.grad().defined()) flat.FlatRange(at, p.numel()).CopyFrom(p.grad().Reshape({-1}));
      p.ZeroGrad();
      at += p.numel();
    }
    comm_bytes_ += int64_t(flat.nbytes());
    Tensor out = Tensor::Empty({shard_}, DType::kF32, device_);
    BRAID_RETURN_IF_ERROR(data_->ReduceScatter(flat, out, ReduceOp::kAvg)->Wait());
    kernels::axpby.Get(device_)(1.0f, out, 1.0f, grad_shard_);
    return absl::OkStatus();
  }
  // One flat buffer of the stage's gradients (zeros where a parameter got none).
  Tensor flat = Tensor::Zeros({sharded() ? padded_ : numel_}, DType::kF32, device_);
  int64_t at = 0;
  for (auto& [n, p] : own_) {
    if (p.grad().defined()) flat.FlatRange(at, p.numel()).CopyFrom(p.grad().Reshape({-1}));
    at += p.numel();
  }
  comm_bytes_ += int64_t(flat.nbytes());
  if (!sharded()) {
    BRAID_RETURN_IF_ERROR(data_->AllReduce(flat, ReduceOp::kAvg)->Wait());
    at = 0;
    for (auto& [n, p] : own_) {
      p.set_grad(flat.FlatRange(at, p.numel(), p.shape()).Clone());
      at += p.numel();
    }
    return absl::OkStatus();
  }
  BRAID_RETURN_IF_ERROR(data_->ReduceScatter(flat, grad_shard_, ReduceOp::kAvg)->Wait());
  // The full gradients are done with: only the shard is stepped.
  for (auto& [n, p] : own_) p.ZeroGrad();
  return absl::OkStatus();
}

double StageOptimizer::LocalSquaredNorm() const {
  double total = 0;
  if (sharded()) {
    for (const Tensor& piece : pieces_) total += double(piece.grad_norm_share()) * SquaredNorm(piece.grad());
    return total;
  }
  for (auto& [n, p] : own_) {
    if (!counted_.count(n) || !p.grad().defined()) continue;
    total += double(p.grad_norm_share()) * SquaredNorm(p.grad());
  }
  return total;
}

void StageOptimizer::ScaleGradients(float scale) {
  auto scale_one = [scale](Tensor g) {
    if (g.defined()) kernels::unary.Get(g.device())(kernels::UnaryOp::kScale, g, scale, g);
  };
  if (sharded()) {
    scale_one(grad_shard_);
  } else {
    for (auto& [n, p] : own_) scale_one(p.grad());
  }
}

absl::Status StageOptimizer::Step() {
  optimizer_->Step();
  if (optimizer_state_bytes_ == 0) {  // the optimizer makes its state at its first step
    for (auto& [n, t] : optimizer_->StateDict()) optimizer_state_bytes_ += int64_t(t.nbytes());
  }
  if (!sharded()) return absl::OkStatus();
  Tensor mine = flat_.FlatRange(int64_t(data_->rank()) * shard_, shard_).Clone();
  comm_bytes_ += int64_t(flat_.nbytes());
  return data_->AllGather(mine, flat_)->Wait();
}

std::vector<StateChunk> StageOptimizer::Chunks(bool create,
                                               const std::function<bool(const std::string&)>& writes,
                                               bool write_step) {
  std::vector<StateChunk> out;
  for (auto& [n, p] : own_) out.push_back(WholeChunk(n, p, writes(n)));
  const size_t params = out.size();
  // The optimizer's parameters: the whole ones above, or (stage 1) this replica's pieces, each
  // a run of its parameter, written by every replica (each holds different pieces) of the owner.
  std::vector<StateChunk> pieces;
  if (sharded()) {
    const int64_t own_b = int64_t(data_->rank()) * shard_, own_e = std::min(numel_, own_b + shard_);
    int64_t at = 0;
    for (auto& [n, p] : own_) {
      const int64_t b = std::max(own_b, at), e = std::min(own_e, at + p.numel());
      if (b < e) {
        StateChunk c;
        c.name = n;
        c.global_shape = p.shape();
        c.runs = {{b - at, e - at}};
        c.local = flat_.FlatRange(b, e - b);
        c.write = true;  // set below: the owning stage's replicas each write theirs
        pieces.push_back(std::move(c));
      }
      at += p.numel();
    }
  }
  std::map<std::string, bool> owner;  // parameter -> written by this stage at all
  for (auto& [n, p] : own_) owner[n] = counted_.count(n) > 0;
  std::vector<StateChunk> opt = OptimizerStateChunks(
      *optimizer_,
      [&](const Tensor& t) -> const StateChunk* {
        if (sharded()) {
          for (StateChunk& c : pieces) {
            if (t.name() == absl::StrCat(c.name, "[", c.runs[0].first, ":", c.runs[0].second, "]")) {
              c.write = owner[c.name];  // a tied weight's state: the stage that counts it
              return &c;
            }
          }
          return nullptr;
        }
        for (size_t i = 0; i < params; ++i) {
          if (out[i].local.SameAs(t)) return &out[i];
        }
        return nullptr;
      },
      create, write_step);
  out.insert(out.end(), opt.begin(), opt.end());
  return out;
}

std::vector<std::pair<std::string, int64_t>> StageOptimizer::Peaks() const {
  int64_t params = 0;
  for (auto& [n, p] : own_) params += int64_t(p.nbytes());
  if (zero_stage_ >= 2 && sharded()) {
    // The shard lasts the step; the full gradients only one micro-batch's backward.
    return {{"parameters", int64_t(flat_.nbytes())},
            {"gradients", int64_t(grad_shard_.nbytes())},
            {"optimizer state", optimizer_state_bytes_},
            {"transient", params}};
  }
  const int64_t grads = sharded() ? params + int64_t(grad_shard_.nbytes()) : params;
  return {{"parameters", sharded() ? int64_t(flat_.nbytes()) : params},
          {"gradients", grads},
          {"optimizer state", optimizer_state_bytes_}};
}

}  // namespace braid::pipeline
