// Strategy: how a model is trained across ranks and devices (single, DDP, ZeRO, pipeline, ...).
// A strategy owns one training step: gradient synchronisation, the optimizer step and where
// parameters live. It attaches to the model only through Module's and autograd's hook points,
// so models never know which strategy trains them. docs/WRITING_A_STRATEGY.md walks through it.
#ifndef BRAID_CORE_STRATEGY_H_
#define BRAID_CORE_STRATEGY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/batch.h"
#include "core/check.h"
#include "core/communicator.h"
#include "core/mesh.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/state_chunks.h"
#include "core/tensor.h"

namespace braid {

namespace config {
class Sections;  // core/config/sections.proto
}  // namespace config

// Computes the mean loss of `batch` under `model` (forward + loss), as a scalar.
using LossFn = std::function<Tensor(Module& model, const Batch& batch)>;
// The criterion alone: the model's output and the batch to the mean loss (a scalar). Strategies
// that run the model in pieces (pipeline: the loss on the last stage) need it apart from the
// forward; LossFn(model, batch) is criterion(model(batch.inputs), batch).
using CriterionFn = std::function<Tensor(const Tensor& output, const Batch& batch)>;
// Builds the optimizer over the parameters the strategy decided to step (named, so the factory
// can group them, e.g. no weight decay for biases).
using OptimizerFactory =
    std::function<std::unique_ptr<Optimizer>(const std::vector<std::pair<std::string, Tensor>>&)>;
// Builds a fresh instance of the model being trained, on `device`: same architecture and
// parameter names (the values do not matter, the strategy overwrites them). Strategies that hold
// several copies of the model in one process (single-process data parallel) need it because a
// Module cannot be cloned generically.
using ModuleFactory = std::function<std::unique_ptr<Module>(Device device)>;

struct StrategyContext {
  // The group of ranks this layer works over, handed by the composer (launcher/compose.h): the
  // group of the mesh axes the layer serves (DeviceMesh::GroupOf): a data-axis strategy's
  // data-parallel ranks, a pipeline's stages of this replica, a tensor-parallel layer's tensor
  // group; the world for a stack of one layer. Size 1 for single-process runs.
  Communicator* comm = nullptr;
  // The groups of the layers below this one, nearest first (empty for the innermost):
  // WrappingStrategy::ContextBelow hands the first to the layer below as its `comm`.
  std::vector<Communicator*> groups_below;
  // The groups of the layers above, nearest first (ContextBelow adds the handing layer's), for
  // a decision every rank of the model must share: the pipeline's cut by measured time is stage
  // 0's of replica 0, broadcast over its stages, its replicas and the tensor group above.
  std::vector<Communicator*> groups_above;
  Device device = Device::CPU();
  // Free-form options from the config's strategy section ("bucket_cap_mb" -> "25").
  std::map<std::string, std::string> options;
  // Clip the global gradient L2 norm to this before each optimizer step (0: no clipping). The
  // strategy applies it because only it knows when gradients are complete (after reduction).
  float max_grad_norm = 0;
  // How to build another copy of the model; null when the program cannot (strategies that need
  // replicas then fail Setup saying so).
  ModuleFactory make_replica;
  // The loss from the model's output (set by the training program; null in tests that give none).
  CriterionFn criterion;
  // The validated training config's sections a plugin reads (core/config/sections.proto: model,
  // optimizer, data, eval, parallel, zero_optimization, communication_data_type), for the ones a
  // strategy implements (the features it declares in StrategyTraits). Null when the caller has
  // none (tests). A plugin reads it through //core/config:sections_headers, never by linking
  // the config library.
  const config::Sections* config = nullptr;
  // The tensor × pipeline × data layout (core/mesh.h) when the config has a `parallel` section;
  // null otherwise. For what a layer reports (this rank's place in the world); the groups a
  // layer works over are `comm` and `groups_below`, never looked up here.
  const DeviceMesh* mesh = nullptr;
  // What the layers above add to the step's scalars before the strategy's one read
  // (ReadStepScalarsAndClip), on this rank's device, where NCCL moves them (all-reduces, no host
  // read): `squared_norm`, this rank's squared gradient norm (one-element f32, after the
  // strategy's own sum over `comm`), becomes the sum over the ranks holding the other parts of
  // this rank's model replica (a pipeline's stages, a tensor-parallel group); `loss`, the
  // strategy's mean loss on the device (stats.device_loss, possibly undefined), becomes the loss
  // every such rank reports (a pipeline's last stage computes it; others are handed it). A
  // strategy calls it on both, in place, before the read. Null: nothing to add.
  std::function<void(Tensor& squared_norm, Tensor& loss)> model_parallel_sum_on_device;
  // One micro-batch shaped as training's (its values do not matter), for a strategy that times
  // the model at Setup (the pipeline's cut by measured time); null when the caller has none.
  std::function<Batch()> sample_batch;
};

// Hands `ctx` the groups of a stack of layers serving `layer_axes` on `mesh`, outermost first
// (DeviceMesh::GroupOf each): the first in `comm`, the rest in `groups_below`. What the composer
// does for a run; tests and programs that stack layers by hand call it too.
inline absl::Status HandMeshGroups(const DeviceMesh& mesh,
                                   const std::vector<std::vector<std::string>>& layer_axes,
                                   StrategyContext* ctx) {
  BRAID_CHECK(!layer_axes.empty()) << "HandMeshGroups: no layers";
  std::vector<Communicator*> groups;
  for (const std::vector<std::string>& axes : layer_axes) {
    absl::StatusOr<Communicator*> g = mesh.GroupOf(axes);
    if (!g.ok()) return g.status();
    groups.push_back(*g);
  }
  ctx->comm = groups.front();
  ctx->groups_below.assign(groups.begin() + 1, groups.end());
  ctx->groups_above.clear();
  return absl::OkStatus();
}

struct StepStats {
  float loss = 0;           // mean over micro-batches (this rank)
  // The same mean, still on the device (RunMicroBatches): a strategy reads it with the step's
  // other scalars, once (core/micro_batches.h). Undefined when the strategy does not set it.
  Tensor device_loss;
  double forward_s = 0;     // time in forward + loss
  double backward_s = 0;    // time in backward (including overlapped communication)
  double comm_exposed_s = 0;  // communication the step waited for after backward
  double optimizer_s = 0;
  // Global L2 norm of the gradient the optimizer step used (after reduction, before clipping),
  // measured on every step whether or not clipping is on. A rank that never sees the reduced
  // gradient (a parameter-server worker) reports the norm of its own, as it does its own loss.
  float grad_norm = 0;
  // Bytes communicated this step (gradients, for the strategies that reduce them; comm_what
  // says), and how much of that was reduced while backward was still running (each piece weighted by the share of its reduction time that overlapped).
  int64_t comm_bytes = 0;
  int64_t comm_bytes_overlapped = 0;
  // What comm_bytes counts, for the summary ("gradients all-reduced", "gradients
  // reduce-scattered", ...); empty: "data communicated".
  std::string comm_what;
};

// A strategy decides three things, and has them required: its name, Setup (placement, groups,
// the optimizer) and TrainStep. Everything else has a default that fits a strategy whose every
// data-parallel rank holds the whole model (single, DDP, Local SGD, most strategies a user
// writes first): such a strategy ends Setup with Adopt(model, optimizer, data group), and the
// defaults answer from what it adopted. A strategy that shards or partitions the model (ZeRO,
// the pipeline, tensor parallelism) overrides what it holds differently.
// docs/WRITING_A_STRATEGY.md section 2.
class Strategy {
 public:
  virtual ~Strategy() = default;

  // --- Required.
  virtual std::string name() const = 0;
  // Called once before training. The strategy may move, shard or wrap parameters, and builds
  // its optimizer with `make_optimizer`.
  virtual absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                             const StrategyContext& ctx) = 0;
  // One optimisation step over the micro-batches of this rank (gradient accumulation when there
  // are several): the result equals one step on their concatenation.
  virtual absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                              const LossFn& loss) = 0;

  // --- With defaults: the whole model on every rank of the adopted data-parallel group.

  // The optimizer the trainer sets the learning rate through, on every rank after Setup.
  virtual Optimizer* optimizer() { return optimizer_.get(); }
  // The full model state (gathered if sharded), named as the model names it.
  virtual absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() {
    if (model_ == nullptr) return NotSetUp("FullStateDict");
    return model_->StateDict();  // every replica holds the same whole model
  }
  // Loads full (unsharded) weights named as the model names them (--init_from): a strategy that
  // shards parameters keeps this rank's part. Called after Setup. The default: every rank loads
  // the same values, no communication.
  virtual absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) {
    if (model_ == nullptr) return NotSetUp("LoadFullStateDict");
    return model_->LoadStateDict(state, /*strict=*/true);
  }

  // Which shard of the data this rank reads: its place in the data-parallel group (after
  // Setup). Every rank is a data-parallel replica under single, DDP and ZeRO; pipeline and
  // tensor parallelism make several ranks read the same data. The default: the adopted group
  // (none: one replica). A strategy that neither adopts nor overrides these has broken its
  // contract: asking fails fast, naming it.
  virtual int data_parallel_rank() const {
    BRAID_CHECK(model_ != nullptr) << Unanswered("data_parallel_rank");
    return data_ != nullptr ? data_->rank() : 0;
  }
  virtual int data_parallel_size() const {
    BRAID_CHECK(model_ != nullptr) << Unanswered("data_parallel_size");
    return data_ != nullptr ? data_->size() : 1;
  }

  // Runs `eval` (forwards only, under NoGradGuard) on the model as this strategy holds it: a
  // strategy that shards parameters gathers each layer's around its forward. Called on every
  // rank at the same point.
  virtual absl::Status Evaluate(const std::function<void(Module&)>& eval) {
    if (model_ == nullptr) return NotSetUp("Evaluate");
    autograd::NoGradGuard no_grad;
    eval(*model_);
    return absl::OkStatus();
  }

  // Held-out evaluation of a loss: the mean of `loss` over `batches`, forwards only, on the
  // model as this strategy holds it, through Evaluate. Every rank calls it at the same point
  // with the same batches and gets the same value. A strategy whose model output is not what
  // `loss` expects (tensor parallelism's vocabulary-split logits) substitutes its own criterion
  // here, as its TrainStep does.
  virtual absl::StatusOr<double> EvaluateLoss(const std::vector<Batch>& batches,
                                              const LossFn& loss) {
    double sum = 0;
    absl::Status st = Evaluate([&](Module& m) {
      for (const Batch& b : batches) sum += double(loss(m, b).item());
    });
    if (!st.ok()) return st;
    return batches.empty() ? 0.0 : sum / double(batches.size());
  }

  // True when the strategy wants the model built with deferred initialisation
  // (core/deferred_init.h): no parameter memory until the strategy materialises what this rank
  // holds (ZeRO-3 keeps only its shard, with the values a full initialisation would give).
  // Asked before the model is built, with the context Setup will get (its model-independent
  // fields: communicator, device, options, config).
  virtual bool wants_deferred_init(const StrategyContext& ctx) const { return false; }

  // Peak bytes this rank held for the model's state, by kind ("parameters", "gradients",
  // "optimizer state", "transient"), for the training summary; empty when not tracked.
  virtual std::vector<std::pair<std::string, int64_t>> ModelStatePeaks() const { return {}; }

  // Lines for the end-of-training summary (a pipeline's measured bubble, say); empty by default.
  virtual std::vector<std::string> SummaryLines() const { return {}; }

  // This rank's model and optimizer state as chunks of global tensors (core/state_chunks.h), for
  // sharded checkpoints: parameters and buffers under their state-dict names, the optimizer's
  // state under "optimizer/<name>/<slot>" and "optimizer/step". Local tensors alias the live
  // state, so a checkpointer reads them to save and writes them to load; after loading, call
  // AfterStateLoaded. `create`: make optimizer state that does not exist yet (to load before the
  // first step). Each element of every global tensor is written by exactly one rank (write set).
  // The default: the replicas are equal, rank 0 of the data-parallel group writes, every rank
  // reads.
  virtual absl::StatusOr<std::vector<StateChunk>> StateChunks(bool create) {
    if (model_ == nullptr) {
      return absl::UnimplementedError(name() + " cannot write sharded checkpoints yet");
    }
    return WholeModelChunks(*model_, *optimizer_, create, data_parallel_rank() == 0);
  }
  // After a checkpointer wrote into StateChunks' tensors: re-establish what derives from them
  // (the optimizer's step count from "optimizer/step"; replicas all-gathered, ...).
  virtual absl::Status AfterStateLoaded(const std::vector<StateChunk>& chunks) {
    if (optimizer_ != nullptr) RestoreOptimizerStep(*optimizer_, chunks);
    return absl::OkStatus();
  }

  // A strategy that works around another (tensor parallelism, which splits layers and leaves
  // data parallelism, ZeRO or the pipeline to the strategy it wraps) takes that one here,
  // before Setup. The default refuses: most strategies stand alone.
  virtual absl::Status Wrap(std::unique_ptr<Strategy> inner) {
    return absl::UnimplementedError(name() + " does not wrap another strategy");
  }

 protected:
  // Ends the Setup of a strategy whose every data-parallel rank holds the whole model: the model
  // it trains, the optimizer it built over the model's parameters, and the data-parallel group
  // (null or size 1: one replica). The defaults above answer from these.
  absl::Status Adopt(Module& model, std::unique_ptr<Optimizer> optimizer, Communicator* data) {
    if (optimizer == nullptr) {
      return absl::InvalidArgumentError("strategy '" + name() +
                                        "': the optimizer factory returned null");
    }
    model_ = &model;
    optimizer_ = std::move(optimizer);
    data_ = data;
    return absl::OkStatus();
  }
  // What Adopt took: the model (null before it), and the data-parallel group (null: one replica).
  Module* model() const { return model_; }
  Communicator* data_group() const { return data_; }
  // "strategy 'NAME': WHAT before Setup".
  absl::Status NotSetUp(const std::string& what) const {
    return absl::FailedPreconditionError("strategy '" + name() + "': " + what + " before Setup");
  }

 private:
  std::string Unanswered(const std::string& what) const {
    return "strategy '" + name() + "': " + what + " asked before Setup, or its Setup neither " +
           "called Adopt (the whole model on every data-parallel rank) nor does the strategy " +
           "override " + what;
  }

  Module* model_ = nullptr;
  std::unique_ptr<Optimizer> optimizer_;
  Communicator* data_ = nullptr;
};

using StrategyFactory = std::function<std::unique_ptr<Strategy>()>;

}  // namespace braid

#endif  // BRAID_CORE_STRATEGY_H_
