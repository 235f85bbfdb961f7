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
//            With offload_param (ZeRO-Infinity), the shards live in host memory: a unit's shard
//            is copied to the device for its all-gather (asynchronously, on the copy stream,
//            issued one unit ahead of the prefetched gather) and the copy given back once the
//            gather is done; the optimizer steps the host shards in place.
// The optimizer steps views of the shard, one per parameter piece, so each piece keeps its
// parameter's weight-decay attribute. The step equals one step of one process on the global batch.
#ifndef BRAID_PLUGINS_ZERO_ZERO_STRATEGY_H_
#define BRAID_PLUGINS_ZERO_ZERO_STRATEGY_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/async_copy.h"
#include "core/autograd.h"
#include "core/communicator.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/strategy.h"
#include "plugins/zero/zero_options.h"

namespace braid::zero {

// Current and peak bytes of one kind of model state on this rank.
struct Account {
  int64_t current = 0, peak = 0;
  void Add(int64_t bytes) {
    current += bytes;
    peak = std::max(peak, current);
  }
  void Sub(int64_t bytes) { current -= bytes; }
};

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
  // [shard]: this rank's parameters at stage 3 (the optimizer's); with offload_param the
  // device-side copy of host_shard, which has memory only while the unit is being gathered.
  Tensor param_shard;
  Tensor host_shard;  // [shard], offload_param: where this rank's parameters live (host memory)
  // offload_param: the copy of host_shard into param_shard on the device's copy stream, issued
  // ahead of the gather; kept until the optimizer's step checks it is done (it reads host_shard).
  std::shared_ptr<InFlightCopy> copy_in;
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
    for (auto& [m, id] : module_hooks_) m->RemoveHook(id);  // the model outlives us
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
  absl::StatusOr<std::vector<StateChunk>> StateChunks(bool create) override;
  absl::Status AfterStateLoaded(const std::vector<StateChunk>& chunks) override;
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
        {host_step() ? "optimizer state (host)" : "optimizer state", optim_.peak},
        {"transient", transient_.peak}};
    if (opts_.offload_param) {
      out.emplace_back("parameter shards (host)", host_params_.peak);
      out.emplace_back("gradient copies (host)", host_.peak);
    } else if (opts_.offload_optimizer) {
      out.emplace_back("host copies of shards", host_.peak);
    }
    return out;
  }

 private:
  int64_t Bytes(int64_t numel) const { return numel * int64_t(SizeOf(dtype_)); }
  // The optimizer steps host tensors: offload_optimizer's copies, or offload_param's shards.
  bool host_step() const { return opts_.offload_optimizer || opts_.offload_param; }
  // Where this rank's shard of a stage-3 unit is kept between uses.
  Tensor& ShardHome(Unit& u) { return opts_.offload_param ? u.host_shard : u.param_shard; }
  DType dtype_ = DType::kF32;  // of every flat buffer (the parameters')
  // This rank's range [begin, end) of a unit's real elements.
  std::pair<int64_t, int64_t> OwnRange(const Unit& u) const {
    int64_t b = std::min(u.numel, int64_t(rank_) * u.shard);
    return {b, std::min(u.numel, b + u.shard)};
  }
  absl::Status Wait(const std::shared_ptr<Work>& w, const char* what) {
    return Record(w->Wait(), what);
  }
  // For a collective whose result only device work reads (kernels, or copies on the compute
  // stream): on NCCL the compute stream waits for it and the host goes on (Work::WaitOnDevice).
  absl::Status WaitOnDevice(const std::shared_ptr<Work>& w, const char* what) {
    return Record(w->WaitOnDevice(), what);
  }
  absl::Status Record(absl::Status st, const char* what) {
    if (!st.ok() && comm_status_.ok()) {
      comm_status_ = Error(st.code(), absl::StrCat(what, ": ", st.message()));
    }
    return st;
  }

  void BuildUnits(Module& model);
  absl::Status Materialize(Unit& u);
  void InstallStage3Hooks();
  void Gather(Unit& u);
  void StageIn(Unit& u, bool ahead = false);
  void StageOut(Unit& u);
  std::shared_ptr<Work> StartGather(Unit& u);
  void Regather(Unit& u, const char* what);
  void ReleaseIfDone(Unit& u);
  void Prefetch(Unit& u);
  void PrefetchAfter(int unit, const std::vector<int>& order);
  void Record(int unit, std::vector<int>* order);
  void PrepareGrads(Unit& u);
  void CheckHostCopiesDone(const std::vector<std::unique_ptr<InFlightCopy>>& grad_copies);
  void SettleHostCopies();
  void LaunchReduceScatter(Unit& u);
  void FinishReduceScatter(Unit& u, StepStats* stats);
  void FinishMicroBatch(bool last, StepStats* stats);

  Options opts_;
  Module* model_ = nullptr;
  Communicator* comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  float max_grad_norm_ = 0;
  // The layers above's sums (the pipeline's stages, tensor parallelism's group), or null.
  std::function<void(Tensor&, Tensor&)> model_parallel_sum_on_device_;
  std::vector<Unit> units_;
  std::vector<Tensor> pieces_;  // views of this rank's shards, one per parameter piece
  // With offload_optimizer: host copies of the pieces (and of their gradients), which the
  // optimizer steps; the device pieces get the result copied back.
  // With offload_param they are views of the units' host shards instead (nothing to copy back).
  std::vector<Tensor> host_pieces_;
  Device host_device_ = Device::Host();  // pinned where asked and the backend has it
  Account host_, host_params_;
  // Stage 3: the order units are used in, recorded in the first step, for prefetching.
  std::vector<int> forward_order_, backward_order_;
  bool orders_known_ = false;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<std::pair<Module*, uint64_t>> module_hooks_;
  // offload_optimizer: the updated pieces' copies back to the device, enqueued on the compute
  // stream after the optimizer's step; the next step's one read finds them done.
  std::vector<std::unique_ptr<InFlightCopy>> param_copies_;
  absl::Status comm_status_;
  bool in_backward_ = false;
  std::vector<int> in_flight_;  // units whose reduce-scatter was launched, oldest first
  StepStats* step_stats_ = nullptr;
  Account params_, grads_, optim_, transient_;
};

}  // namespace braid::zero

#endif  // BRAID_PLUGINS_ZERO_ZERO_STRATEGY_H_
