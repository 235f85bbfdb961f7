// The "dp" strategy: single-process data parallelism over several devices, in the manner of
// PyTorch's nn.DataParallel.
//
// The model given to Setup is the master copy and lives on the first device; every other device
// holds a replica built by StrategyContext::make_replica (a Module cannot be cloned generically)
// whose values are overwritten from the master. A step splits each micro-batch by rows across
// the devices, runs the replicas' forward and backward passes on one thread per device, sums
// the replicas' gradients into the master's on the first device, steps the optimizer there
// (only the master has optimizer state) and copies the updated parameters back to the replicas.
// As with the single strategy, the master's .grad keeps the step's reduced (clipped) gradient
// until the next step starts.
//
// Two ways to compute the loss (option loss_mode):
//  - balanced (the default; PyTorch-Encoding's DataParallelModel + DataParallelCriterion): each
//    device runs the whole LossFn on its own shard; the shard losses meet only as scalars, as a
//    mean weighted by shard rows, and each shard's backward is seeded with its weight. No device
//    ever holds another device's outputs.
//  - gather (classic nn.DataParallel): the replicas compute only their outputs; these are
//    concatenated on the first device, the loss is computed there on the whole micro-batch, and
//    the gradient of the outputs is split back to the replicas for their backward passes. The
//    first device therefore holds every output and its gradient: the memory imbalance this mode
//    exists to reproduce and measure.
//
// Gather mode needs the model's outputs apart from the criterion, but a LossFn is one closure,
// model and criterion together. Rather than widen the Strategy interface with a separate
// criterion, gather mode relies on the shape every Braid loss has, criterion(model(inputs),
// targets): it calls the LossFn with a stand-in module whose forward returns the gathered
// outputs, so the LossFn's own criterion runs on them unchanged. The stand-in checks that it is
// called exactly once, on the micro-batch's inputs; any other LossFn is refused with an error
// pointing to balanced mode, which accepts every LossFn that returns its shard's mean loss.
//
// Balanced mode weights shards by rows, which is exact for criteria that average over rows (or
// over a fixed number of targets per row); a criterion that ignores some targets (negative
// ids) averages over a different count per shard, and the combination then differs slightly
// from the loss of the whole micro-batch. LossFn runs concurrently on the device threads in
// balanced mode, so it must not share mutable state between calls.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/strategy.h"

namespace braid::dp {
namespace {

constexpr char kName[] = "dp";
constexpr char kDefaultDevices[] = "cpu:0,cpu:1";

enum class LossMode { kGather, kBalanced };

double Seconds(absl::Time from) { return absl::ToDoubleSeconds(absl::Now() - from); }

std::string DeviceList(const std::vector<Device>& devices) {
  std::vector<std::string> names;
  for (const Device& d : devices) names.push_back(d.ToString());
  return absl::StrJoin(names, ",");
}

// Runs fn(i) for every i in [0, n): 0 on the calling thread, each other on a thread of its own,
// so that every device is driven by one thread (as PyTorch's parallel_apply). Returns the error
// of the lowest-numbered failing i.
absl::Status ParallelApply(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> status(size_t(std::max(n, 0)));
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) threads.emplace_back([&, i] { status[size_t(i)] = fn(i); });
  if (n > 0) status[0] = fn(0);
  for (std::thread& t : threads) t.join();
  for (absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Rows [begin, end) of a micro-batch that one device gets. With fewer rows than devices the
// last devices get none and sit the micro-batch out (they are left out of the list).
struct Shard {
  int64_t begin, end;
  int64_t rows() const { return end - begin; }
};
std::vector<Shard> SplitRows(int64_t rows, int num_devices) {
  const int64_t used = std::min<int64_t>(rows, num_devices);
  std::vector<Shard> shards;
  int64_t begin = 0;
  for (int64_t i = 0; i < used; ++i) {
    int64_t n = rows / used + (i < rows % used ? 1 : 0);
    shards.push_back(Shard{begin, begin + n});
    begin += n;
  }
  return shards;
}

// Stands in for the model when gather mode runs the LossFn on the gathered outputs (see the
// file comment): "calling the model" returns the outputs the replicas already computed.
class GatheredOutputs final : public Module {
 public:
  GatheredOutputs(Tensor outputs, Tensor inputs)
      : Module("dp.GatheredOutputs"), outputs_(std::move(outputs)), inputs_(std::move(inputs)) {}
  Tensor Forward(const Tensor& x) override {
    ++calls_;
    if (!x.SameAs(inputs_)) other_input_ = true;
    return outputs_;
  }
  int calls() const { return calls_; }
  bool other_input() const { return other_input_; }

 private:
  Tensor outputs_, inputs_;
  int calls_ = 0;
  bool other_input_ = false;
};

// Why `loss` cannot drive a backward pass, or "" when it can.
std::string BadLoss(const Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1) {
    return absl::StrCat("is ", loss.DescribeForError(),
                        "; the loss function must return a scalar computed from the model");
  }
  if (!loss.requires_grad()) {
    return absl::StrCat("is ", loss.DescribeForError(),
                        " and depends on no trainable parameter; the loss function must return a "
                        "scalar computed from the model's outputs");
  }
  return "";
}

class DataParallelStrategy final : public Strategy {
 public:
  std::string name() const override { return kName; }

  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override {
    if (master_ != nullptr) return Error("Setup called twice; make a new strategy instead");
    if (ctx.comm != nullptr && ctx.comm->size() != 1) {
      return Error(absl::StrCat(
          "is single-process data parallel but the world has ", ctx.comm->size(),
          " ranks; launch one process, or use strategy 'ddp' to train across processes"));
    }
    std::vector<std::string> unknown;
    for (const auto& [k, v] : ctx.options) {
      if (k != "devices" && k != "loss_mode") unknown.push_back(k);
    }
    if (!unknown.empty()) {
      return Error(absl::StrCat("has no option ", absl::StrJoin(unknown, ", "),
                                "; its options are devices (e.g. cpu:0,cpu:1) and loss_mode "
                                "(gather or balanced)"));
    }
    auto option = [&ctx](const std::string& key, const std::string& fallback) {
      auto it = ctx.options.find(key);
      return it == ctx.options.end() ? fallback : it->second;
    };
    absl::Status parsed = ParseDevices(option("devices", kDefaultDevices));
    if (!parsed.ok()) return parsed;
    const std::string mode = option("loss_mode", "balanced");
    if (mode == "gather") {
      mode_ = LossMode::kGather;
    } else if (mode == "balanced") {
      mode_ = LossMode::kBalanced;
    } else {
      return Error(absl::StrCat("loss_mode '", mode, "' is unknown; use gather or balanced"));
    }
    if (!make_optimizer) return Error("got no optimizer factory");
    if (devices_.size() > 1 && !ctx.make_replica) {
      return Error(absl::StrCat(
          "replicates the model on ", devices_.size(), " devices (", DeviceList(devices_),
          ") but StrategyContext::make_replica is not set; the program must pass a factory that "
          "builds the model on a given device"));
    }

    // The master copy on the first device.
    for (const auto& [n, p] : model.NamedParameters()) p.MoveTo(devices_[0]);
    for (const auto& [n, b] : model.NamedBuffers()) b.MoveTo(devices_[0]);
    params_.assign(devices_.size(), {});
    buffers_.assign(devices_.size(), {});
    for (const auto& [n, p] : model.NamedParameters()) params_[0].push_back(p);
    for (const auto& [n, b] : model.NamedBuffers()) buffers_[0].push_back(b);
    replicas_.assign(1, &model);
    owned_replicas_.clear();  // a retry after a failed Setup starts over

    for (size_t i = 1; i < devices_.size(); ++i) {
      std::unique_ptr<Module> replica = ctx.make_replica(devices_[i]);
      if (replica == nullptr) {
        return Error(absl::StrCat("make_replica returned null for ", devices_[i].ToString()));
      }
      absl::Status s = Align(model.NamedParameters(), replica->NamedParameters(), "parameter",
                             devices_[i], &params_[i]);
      if (s.ok()) {
        s = Align(model.NamedBuffers(), replica->NamedBuffers(), "buffer", devices_[i],
                  &buffers_[i]);
      }
      if (!s.ok()) return s;
      replicas_.push_back(replica.get());
      owned_replicas_.push_back(std::move(replica));
    }
    Broadcast();

    optimizer_ = make_optimizer(model.NamedParameters());
    if (optimizer_ == nullptr) return Error("the optimizer factory returned null");
    master_ = &model;
    max_grad_norm_ = ctx.max_grad_norm;
    return absl::OkStatus();
  }

  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override {
    if (master_ == nullptr) {
      return Error("TrainStep before Setup", absl::StatusCode::kFailedPrecondition);
    }
    if (micro_batches.empty()) return Error("TrainStep got no micro-batches");
    for (size_t m = 0; m < micro_batches.size(); ++m) {
      const Batch& b = micro_batches[m];
      if (!b.inputs.defined() || !b.targets.defined() || b.inputs.ndim() < 1 ||
          b.targets.ndim() < 1 || b.inputs.size(0) != b.targets.size(0) || b.inputs.size(0) < 1) {
        return Error(absl::StrCat(
            "micro-batch ", m, " has inputs ",
            b.inputs.defined() ? b.inputs.DescribeForError() : "(none)", " and targets ",
            b.targets.defined() ? b.targets.DescribeForError() : "(none)",
            "; it is split by rows across devices, so both need the same number of rows (>= 1)"));
      }
    }
    // Replicas follow the master's train/eval mode, which the program may have toggled.
    for (Module* r : replicas_) {
      if (r->is_training() != master_->is_training()) r->Train(master_->is_training());
    }

    StepStats stats;
    optimizer_->ZeroGrad();
    for (Module* r : replicas_) r->ZeroGrad();
    const float scale = 1.0f / float(micro_batches.size());
    double loss_sum = 0;
    for (size_t m = 0; m < micro_batches.size(); ++m) {
      absl::StatusOr<double> loss = mode_ == LossMode::kBalanced
                                        ? RunBalanced(micro_batches[m], m, scale, loss_fn, &stats)
                                        : RunGather(micro_batches[m], m, scale, loss_fn, &stats);
      if (!loss.ok()) {
        for (Module* r : replicas_) r->ZeroGrad();
        return loss.status();
      }
      loss_sum += *loss;
    }

    absl::Time start = absl::Now();
    ReduceGradients();
    stats.comm_exposed_s = Seconds(start);
    start = absl::Now();
    // Always measured (max_grad_norm_ <= 0 only measures); clipped when clipping is on.
    stats.grad_norm = ClipGradNorm(params_[0], max_grad_norm_);
    optimizer_->Step();
    stats.optimizer_s = Seconds(start);
    start = absl::Now();
    Broadcast();
    stats.comm_exposed_s += Seconds(start);
    stats.loss = float(loss_sum / double(micro_batches.size()));
    return stats;
  }

  Optimizer* optimizer() override { return optimizer_.get(); }

  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override {
    if (master_ == nullptr) {
      return Error("FullStateDict before Setup", absl::StatusCode::kFailedPrecondition);
    }
    return master_->StateDict();
  }
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override {
    if (master_ == nullptr) {
      return Error("LoadFullStateDict before Setup", absl::StatusCode::kFailedPrecondition);
    }
    BRAID_RETURN_IF_ERROR(master_->LoadStateDict(state, /*strict=*/true));
    Broadcast();  // the replicas follow the master
    return absl::OkStatus();
  }
  // One process: it reads all of the data (its devices split each micro-batch by rows).
  int data_parallel_rank() const override { return 0; }
  int data_parallel_size() const override { return 1; }
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    if (master_ == nullptr) return Error("Evaluate before Setup", absl::StatusCode::kFailedPrecondition);
    autograd::NoGradGuard no_grad;
    eval(*master_);
    return absl::OkStatus();
  }

 private:
  static absl::Status Error(const std::string& what,
                            absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    return absl::Status(code, absl::StrCat("strategy 'dp' ", what));
  }

  absl::Status ParseDevices(const std::string& list) {
    devices_.clear();
    std::set<std::string> seen;
    for (absl::string_view part : absl::StrSplit(list, ',')) {
      std::string entry(absl::StripAsciiWhitespace(part));
      absl::StatusOr<Device> d = Device::Parse(entry);
      if (!d.ok()) {
        return Error(absl::StrCat("option devices='", list, "': entry '", entry,
                                  "' is not a device (", d.status().message(),
                                  "); write a comma-separated list such as cpu:0,cpu:1"));
      }
      if (!seen.insert(d->ToString()).second) {
        return Error(absl::StrCat("option devices='", list, "' names ", d->ToString(),
                                  " twice; each device holds one replica"));
      }
      devices_.push_back(*d);
    }
    return absl::OkStatus();
  }

  // Puts replica tensors in the master's order (`out`), checks that names and shapes agree and
  // places them on `device`.
  static absl::Status Align(const Module::NamedTensors& master, const Module::NamedTensors& replica,
                            const char* kind, Device device, std::vector<Tensor>* out) {
    std::map<std::string, Tensor> by_name(replica.begin(), replica.end());
    std::vector<std::string> problems;
    for (const auto& [name, m] : master) {
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        problems.push_back(absl::StrCat("no ", kind, " '", name, "'"));
        continue;
      }
      const Tensor& r = it->second;
      if (r.shape() != m.shape() || r.dtype() != m.dtype()) {
        problems.push_back(absl::StrCat(kind, " '", name, "' is ", DTypeName(r.dtype()),
                                        ShapeToString(r.shape()), " where the model's is ",
                                        DTypeName(m.dtype()), ShapeToString(m.shape())));
      }
      r.MoveTo(device);
      out->push_back(r);
      by_name.erase(it);
    }
    for (const auto& [name, r] : by_name) {
      problems.push_back(absl::StrCat("an extra ", kind, " '", name, "'"));
    }
    if (problems.empty()) return absl::OkStatus();
    return Error(absl::StrCat("make_replica built, for ", device.ToString(),
                              ", a model unlike the one being trained: ",
                              absl::StrJoin(problems, "; "),
                              "; the factory must build the same architecture"));
  }

  // Balanced mode: forward, loss and backward of each shard on its own device.
  absl::StatusOr<double> RunBalanced(const Batch& batch, size_t index, float scale,
                                     const LossFn& loss_fn, StepStats* stats) {
    const int64_t rows = batch.inputs.size(0);
    const std::vector<Shard> shards = SplitRows(rows, int(devices_.size()));
    const size_t n = shards.size();
    std::vector<double> losses(n), fwd(n), bwd(n);
    absl::Status s = ParallelApply(int(n), [&](int i) -> absl::Status {
      const Shard& sh = shards[size_t(i)];
      const Device d = devices_[size_t(i)];
      absl::Time start = absl::Now();
      Batch shard{batch.inputs.Slice(sh.begin, sh.end).To(d),
                  batch.targets.Slice(sh.begin, sh.end).To(d)};
      Tensor loss = loss_fn(*replicas_[size_t(i)], shard);
      std::string bad = BadLoss(loss);
      if (!bad.empty()) {
        return Error(absl::StrCat("(loss_mode=balanced): the loss of micro-batch ", index,
                                  " on ", d.ToString(), " ", bad));
      }
      losses[size_t(i)] = loss.item();
      fwd[size_t(i)] = Seconds(start);
      start = absl::Now();
      // Seeding each shard's backward with its share of the micro-batch makes the summed
      // gradients those of the micro-batch's mean loss.
      const float weight = float(double(sh.rows()) / double(rows));
      ops::Scale(loss, scale * weight).Backward();
      bwd[size_t(i)] = Seconds(start);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    double loss = 0;
    for (size_t i = 0; i < n; ++i) loss += losses[i] * double(shards[i].rows()) / double(rows);
    // The devices run side by side: the step waited for the slowest.
    stats->forward_s += *std::max_element(fwd.begin(), fwd.end());
    stats->backward_s += *std::max_element(bwd.begin(), bwd.end());
    return loss;
  }

  // Gather mode: outputs on the replicas, the loss on the first device over all of them, then
  // the outputs' gradient back to the replicas for their backward passes.
  absl::StatusOr<double> RunGather(const Batch& batch, size_t index, float scale,
                                   const LossFn& loss_fn, StepStats* stats) {
    const int64_t rows = batch.inputs.size(0);
    const std::vector<Shard> shards = SplitRows(rows, int(devices_.size()));
    const size_t n = shards.size();
    const Device first = devices_[0];
    std::vector<Tensor> outputs(n);
    absl::Time start = absl::Now();
    absl::Status s = ParallelApply(int(n), [&](int i) -> absl::Status {
      const Shard& sh = shards[size_t(i)];
      const Device d = devices_[size_t(i)];
      Tensor out = (*replicas_[size_t(i)])(batch.inputs.Slice(sh.begin, sh.end).To(d));
      if (!out.defined() || out.ndim() < 1 || out.size(0) != sh.rows() || !out.requires_grad()) {
        return Error(absl::StrCat(
            "(loss_mode=gather): the model's output for rows [", sh.begin, ", ", sh.end,
            ") of micro-batch ", index, " on ", d.ToString(), " is ",
            out.defined() ? out.DescribeForError() : "undefined",
            "; gather mode needs outputs with one row per input row that depend on the "
            "parameters (use loss_mode=balanced otherwise)"));
      }
      outputs[size_t(i)] = out;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    Shape shape = outputs[0].shape();
    shape[0] = rows;
    for (size_t i = 1; i < n; ++i) {
      Shape si = outputs[i].shape();
      si[0] = rows;
      if (si != shape || outputs[i].dtype() != outputs[0].dtype()) {
        return Error(absl::StrCat("(loss_mode=gather): the outputs of micro-batch ", index,
                                  " cannot be concatenated: ", outputs[0].DescribeForError(),
                                  " and ", outputs[i].DescribeForError()));
      }
    }

    // Gather onto the first device. The concatenation is a leaf: its gradient is exactly what
    // goes back to the replicas, and the criterion's graph ends there.
    Tensor gathered = Tensor::Empty(shape, outputs[0].dtype(), first);
    for (size_t i = 0; i < n; ++i) {
      gathered.Slice(shards[i].begin, shards[i].end).CopyFrom(outputs[i].Detach());
    }
    gathered.set_requires_grad(true);
    Tensor grad;
    double loss_value = 0;
    {
      GatheredOutputs stand_in(gathered, batch.inputs);
      Tensor loss = loss_fn(stand_in, Batch{batch.inputs, batch.targets.To(first)});
      if (stand_in.calls() != 1 || stand_in.other_input()) {
        return Error(absl::StrCat(
            "(loss_mode=gather): the loss function called the model ", stand_in.calls(),
            " time(s)", stand_in.other_input() ? ", not on the micro-batch's inputs" : "",
            "; gather mode computes the outputs on the replicas and hands them to the loss "
            "function, so the loss must be criterion(model(batch.inputs), batch.targets). Use "
            "loss_mode=balanced for any other loss"));
      }
      std::string bad = BadLoss(loss);
      if (!bad.empty()) {
        return Error(absl::StrCat("(loss_mode=gather): the loss of micro-batch ", index, " ",
                                  bad));
      }
      loss_value = loss.item();
      stats->forward_s += Seconds(start);
      start = absl::Now();
      ops::Scale(loss, scale).Backward();
      grad = gathered.grad();
    }
    gathered = Tensor();
    if (!grad.defined()) {
      return Error(absl::StrCat("(loss_mode=gather): the loss of micro-batch ", index,
                                " does not depend on the model's outputs"));
    }

    // Scatter the outputs' gradient; each replica runs its own backward.
    s = ParallelApply(int(n), [&](int i) -> absl::Status {
      const Shard& sh = shards[size_t(i)];
      Tensor g = grad.Slice(sh.begin, sh.end).To(devices_[size_t(i)]);
      autograd::Backward({outputs[size_t(i)]}, {g});
      outputs[size_t(i)] = Tensor();
      return absl::OkStatus();
    });
    stats->backward_s += Seconds(start);
    if (!s.ok()) return s;
    return loss_value;
  }

  // Sums every replica's gradients into the master's, on the first device, in device order.
  void ReduceGradients() {
    for (size_t j = 0; j < params_[0].size(); ++j) {
      Tensor acc = params_[0][j].grad();
      for (size_t i = 1; i < params_.size(); ++i) {
        Tensor g = params_[i][j].grad();
        if (!g.defined()) continue;
        autograd::AccumulateInto(acc, g.To(devices_[0]));
        params_[i][j].ZeroGrad();
      }
      if (acc.defined()) params_[0][j].set_grad(acc);
    }
  }

  // Copies the master's parameters and buffers to every replica, each device's copies made by
  // its own thread.
  void Broadcast() {
    absl::Status ignored = ParallelApply(int(devices_.size()), [this](int i) {
      if (i == 0) return absl::OkStatus();
      for (size_t j = 0; j < params_[0].size(); ++j) params_[size_t(i)][j].CopyFrom(params_[0][j]);
      for (size_t j = 0; j < buffers_[0].size(); ++j) {
        buffers_[size_t(i)][j].CopyFrom(buffers_[0][j]);
      }
      return absl::OkStatus();
    });
    (void)ignored;
  }

  std::vector<Device> devices_;
  LossMode mode_ = LossMode::kBalanced;
  Module* master_ = nullptr;
  std::vector<Module*> replicas_;  // [0] is the master
  std::vector<std::unique_ptr<Module>> owned_replicas_;
  // [device][j]: parameter (buffer) j of the replica on devices_[device], in the master's order.
  std::vector<std::vector<Tensor>> params_, buffers_;
  std::unique_ptr<Optimizer> optimizer_;
  float max_grad_norm_ = 0;
};

}  // namespace
}  // namespace braid::dp

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy(
      braid::dp::kName, [] { return std::make_unique<braid::dp::DataParallelStrategy>(); },
      braid::StrategyTraits{{}, {braid::kAxisData},
                            "it keeps whole replicas of the model, one per device"});
  return s.ok() ? 0 : 1;
}
