#include "launcher/trainer.h"

#include <csignal>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "backends/cuda/device_check.h"
#include "backends/in_process/in_process_communicator.h"
#include "backends/store/tcp_store.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/checkpointer.h"
#include "core/deferred_init.h"
#include "core/mesh.h"
#include "core/mixed_precision.h"
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/safetensors.h"
#include "core/sharded_safetensors.h"
#include "core/store.h"
#include "core/strategy.h"
#include "core/weights_match.h"
#include "launcher/activation_checkpointing/activation_checkpointing.h"
#include "launcher/batch_sources.h"
#include "launcher/compose.h"
#include "launcher/config/config.h"
#include "launcher/device_binding.h"
#include "launcher/elastic_batch.h"
#include "launcher/evaluation.h"
#include "launcher/net.h"
#include "launcher/optimization.h"
#include "launcher/peak_flops.h"
#include "launcher/run_folder.h"
#include "launcher/run_report.h"

namespace braid::launcher {

namespace {

using config::TrainConfig;

// The model's training loss: its registration's (ModelSpec::loss), or cross-entropy.
CriterionFn ModelLoss(const TrainConfig& cfg) {
  absl::StatusOr<ModelSpec> spec = Registry::Get().GetModel(cfg.model().name());
  if (spec.ok() && spec->loss) return spec->loss;
  return [](const Tensor& output, const Batch& b) { return ops::CrossEntropy(output, b.targets); };
}

// The model's library registered it (models/gpt, models/mlp); validation has checked the model
// section against it and filled in its defaults.
absl::StatusOr<std::unique_ptr<Module>> BuildModel(const TrainConfig& cfg, Device device) {
  return Registry::Get().MakeModel(cfg.model().name(), cfg.model(), cfg.seed(), device);
}

// One training run, as a sequence of named phases (Train calls them in order). The members are
// declared in the order they are made, so they are destroyed in reverse: the strategy before the
// communicators its groups come from, the model before the strategy that hooks into it.
class Run {
 public:
  Run(const TrainConfig& cfg, const TrainerEnv& env) : cfg_(cfg), env_(env) {}

  absl::Status PrepareDevice();
  absl::Status OpenReport();
  absl::Status ConnectWorld();
  absl::Status Compose();
  absl::Status BuildModelAndPrecision();
  absl::Status SetUpStrategy();
  absl::Status PrepareData();
  absl::Status Resume();
  // The training steps: BeginLoop, then Step until done(), then EndLoop (Loop does all three).
  absl::Status Loop();
  absl::Status BeginLoop();
  absl::StatusOr<StepStats> Step();
  bool done() const { return step_ >= steps_; }
  absl::Status EndLoop();
  absl::StatusOr<TrainResult> Finish();
  // The whole model's weights to a safetensors file (collective; rank 0 writes).
  absl::Status SaveWeights(const std::string& path);

  int step() const { return step_; }
  int steps() const { return steps_; }
  Module& model() { return *model_; }
  Strategy& strategy() { return *strategy_; }

 private:
  absl::Status SaveCheckpoint(int done_steps);

  const TrainConfig& cfg_;
  const TrainerEnv& env_;
  Device device_ = Device::CPU();
  std::unique_ptr<Reporter> rep_;
  std::map<std::string, Tensor> init_weights_;
  std::unique_ptr<Store> store_, world_store_;
  std::vector<std::unique_ptr<Communicator>> group_;
  std::unique_ptr<DeviceMesh> mesh_;
  Stack stack_;
  std::unique_ptr<Strategy> strategy_;
  StrategyContext ctx_;
  std::unique_ptr<Module> model_;
  std::unique_ptr<MixedPrecision> mp_;
  OptimizerFactory make_optimizer_;
  std::unique_ptr<BatchSource> source_;
  std::unique_ptr<LrSchedule> schedule_;
  BetasSchedule betas_;
  LossFn loss_fn_;
  int steps_ = 0, accum_ = 1;
  int64_t tokens_per_step_ = 0;
  std::string unit_ = "tok";  // the dataset's (DatasetSpec::unit)
  // Sharded checkpoints (plugins/checkpoint), and where a resumed run starts.
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<ElasticCheckpoints> elastic_;  // an elastic job's regroups (elastic_batch.h)
  CheckpointOptions checkpoint_options_;
  int first_step_ = 0;
  int64_t batches_drawn_ = 0;  // from the data source, for the resumed run to draw the same
  int checkpoints_saved_ = 0;
  double checkpoint_blocked_s_ = 0;
  TrainResult result_;
  std::unique_ptr<Evaluation> eval_;  // the config's eval section; null without one
  StepTotals totals_;  // for the summary
  std::unique_ptr<monitor::Monitors> monitors_;  // tensorboard, csv_monitor (rank 0)
  IntervalTimes interval_;  // wall_clock_breakdown
  // The MFU's terms (rank 0; 0 = unknown): the model's training FLOPs per token, the device's
  // measured peak per process.
  double flops_per_token_ = 0, peak_flops_ = 0;
  std::string peak_basis_;  // a CUDA device's (empty on the CPU: the measured ceiling)
  absl::Time start_;
  // The loop's state between Steps.
  int step_ = 0;
  int kill_at_step_ = -1;
  int print_every_ = 1;
  std::function<Batch()> next_batch_;
};

absl::Status Run::PrepareDevice() {
  BRAID_ASSIGN_OR_RETURN(device_, Device::Parse(cfg_.device()));
  if (device_.type == DeviceType::kCUDA) {
    // One GPU per worker (NCCL refuses two ranks on one GPU): cuda:N+LOCAL_RANK when the
    // worker sees every GPU of its node, cuda:0 when a scheduler shows it its own alone
    // (launcher/device_binding.h). The backend says whether the device is usable: "no CUDA
    // backend" in the default build, CUDA's own reason (no driver, no GPU) under --config=cuda.
    BRAID_ASSIGN_OR_RETURN(device_.index, CudaDeviceIndexFromEnvironment(device_.index));
    BRAID_RETURN_IF_ERROR(cuda::PrepareCudaDevice(device_));
  }
  // A file-size limit (ulimit -f) makes a too-large write fail with EFBIG, reported like a full
  // disk, instead of killing the process with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  return absl::OkStatus();
}

absl::Status Run::OpenReport() {
  rep_ = std::make_unique<Reporter>(env_);
  if (!rep_->ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write train.log / metrics.jsonl in '", env_.log_dir, "'"));
  }
  if (!env_.plugin_origin.empty()) rep_->Note(absl::StrCat("braid: plugins ", env_.plugin_origin));
  // Read (and checked) before any communication, so a bad file fails at once on every rank.
  if (!cfg_.init_from().empty()) {
    // One file, or a Hugging Face checkpoint's shards (a folder or its index).
    BRAID_ASSIGN_OR_RETURN(init_weights_, LoadSafetensorsWeights(cfg_.init_from()));
    BRAID_ASSIGN_OR_RETURN(ModelSpec spec, Registry::Get().GetModel(cfg_.model().name()));
    if (spec.adapt_weights) spec.adapt_weights(cfg_.model(), &init_weights_);
  }
  return absl::OkStatus();
}

// The world group: a communicator plugin over the launcher's store for several processes, the
// in-process communicator for one; then the tensor x pipeline x data mesh, every group built once
// (core/mesh.h).
absl::Status Run::ConnectWorld() {
  if (env_.world_size > 1) {
    BRAID_ASSIGN_OR_RETURN(store_, ConnectStoreFromEnv(absl::Seconds(cfg_.collective_timeout_s())));
    // A restarted worker group must not read the previous attempt's rendezvous keys.
    const char* attempt = std::getenv("BRAID_RESTART_COUNT");
    world_store_ = std::make_unique<PrefixStore>(
        absl::StrCat("braid/attempt", attempt ? attempt : "0", "/world"), store_.get());
    BRAID_RETURN_IF_ERROR(
        EnsureCommunicator(cfg_.communicator(), PluginSearchPath(env_.plugin_search_path)));
    CommunicatorOptions co;
    co.rank = env_.rank;
    co.size = env_.world_size;
    co.store = world_store_.get();
    co.device = device_;
    co.timeout = absl::Seconds(cfg_.collective_timeout_s());
    if (cfg_.communicator() == "gloo") {
      // BRAID_GLOO_IFNAME picks an interface; otherwise the address that routes to the master.
      const char* iface = std::getenv("BRAID_GLOO_IFNAME");
      const char* master = std::getenv("MASTER_ADDR");
      if (iface && *iface) {
        co.options["iface"] = iface;
      } else {
        co.options["hostname"] = LocalAddressToward(master ? master : "127.0.0.1");
      }
      // Send/Recv between ranks of one host go through shared memory unless BRAID_GLOO_SHM=0
      // (for a /dev/shm too small to hold the rings, or to compare with TCP).
      if (const char* shm = std::getenv("BRAID_GLOO_SHM"); shm != nullptr && *shm) {
        co.options["shm"] = shm;
      }
      if (const char* spin = std::getenv("BRAID_GLOO_SHM_SPIN_US"); spin != nullptr && *spin) {
        co.options["shm_spin_us"] = spin;
      }
    }
    BRAID_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world,
                           Registry::Get().MakeCommunicator(cfg_.communicator(), co));
    group_.push_back(std::move(world));
  } else {
    group_ = MakeInProcessGroup(1);
  }
  if (cfg_.has_parallel()) {
    const auto& p = cfg_.parallel();
    BRAID_ASSIGN_OR_RETURN(mesh_, DeviceMesh::Create(*group_[0], {p.tensor(), p.pipeline(), p.data()}));
  }
  return absl::OkStatus();
}

// The stack of layers, one per mesh axis, chosen by their declared axes (launcher/compose.h),
// and the context every layer is set up with.
absl::Status Run::Compose() {
  const MeshShape shape = mesh_ ? mesh_->shape() : MeshShape{1, 1, env_.world_size};
  BRAID_ASSIGN_OR_RETURN(
      stack_, ComposeStack(shape.tensor, shape.pipeline, shape.data, cfg_.strategy().name(),
                           PluginLayerCatalog(PluginSearchPath(env_.plugin_search_path),
                                              cfg_.strategy().path()),
                           config::RequestedFeatures(cfg_)));
  BRAID_ASSIGN_OR_RETURN(strategy_, BuildStack(stack_));
  ctx_.mesh = mesh_.get();
  ctx_.comm = group_[0].get();
  ctx_.device = device_;
  for (auto& [k, v] : cfg_.strategy().options()) ctx_.options[k] = v;
  ctx_.max_grad_norm = float(cfg_.gradient_clipping());
  ctx_.config = &cfg_;  // the sections the strategy implements (zero_optimization, ...)
  ctx_.criterion = ModelLoss(cfg_);
  // Strategies that keep several copies of the model (dp) build them with the same config.
  ctx_.make_replica = [&cfg = cfg_](Device d) -> std::unique_ptr<Module> {
    auto m = BuildModel(cfg, d);
    if (!m.ok()) return nullptr;
    // A replica is trained like the model: checkpointed the same way (dp's devices).
    if (cfg.has_activation_checkpointing()) {
      auto policy = CheckpointPolicyFromConfig(cfg.activation_checkpointing());
      if (!policy.ok() || !EnableActivationCheckpointing(**m, *policy).ok()) return nullptr;
    }
    return std::move(*m);
  };
  return absl::OkStatus();
}

// The model, built whole, or without parameter memory when the strategy materialises only what
// this rank keeps (ZeRO-3): every rank then never holds the whole model. Then mixed precision
// (core/mixed_precision.h), for the strategies that declare fp16/bf16: half parameters before
// Setup, so the strategy lays out (buckets, flattens, shards) half tensors; f32 masters in the
// optimizer it builds; the loss scaled for backward only.
absl::Status Run::BuildModelAndPrecision() {
  if (strategy_->wants_deferred_init(ctx_)) {
    DeferredInitScope deferred;
    BRAID_ASSIGN_OR_RETURN(model_, BuildModel(cfg_, device_));
  } else {
    BRAID_ASSIGN_OR_RETURN(model_, BuildModel(cfg_, device_));
  }
  // A batch of the training data's shape, for strategies that time the model (pipeline
  // partition "time"); read from the data as rank 0 of one would, only when asked.
  ctx_.sample_batch = [this]() -> Batch {
    absl::StatusOr<std::unique_ptr<BatchSource>> s = BuildData(cfg_, *model_, 0, 1, device_);
    BRAID_CHECK(s.ok()) << s.status().ToString();
    return (*s)->Next();
  };
  make_optimizer_ = MakeOptimizerFactory(cfg_);
  if (!cfg_.bf16().enabled() && !cfg_.fp16().enabled()) return absl::OkStatus();
  mp_ = std::make_unique<MixedPrecision>();
  if (cfg_.fp16().enabled()) {
    const auto& f = cfg_.fp16();
    mp_->dtype = DType::kF16;
    LossScalerOptions so;
    so.dynamic = f.loss_scale() == 0;
    so.initial_scale = so.dynamic ? std::ldexp(1.0f, f.initial_scale_power()) : float(f.loss_scale());
    so.window = f.loss_scale_window();
    so.hysteresis = f.hysteresis();
    so.consecutive_hysteresis = f.consecutive_hysteresis();
    so.min_scale = float(f.min_loss_scale());
    mp_->scaler = LossScaler(so);
  } else {
    mp_->dtype = DType::kBF16;  // bf16 has f32's exponent range: no loss scaling
  }
  // Every rank skips a step any rank found inf/NaN in (ZeRO's shards differ), so the replicas
  // never diverge.
  Communicator* world = group_[0].get();
  mp_->any_rank = [world](bool local) {
    if (world->size() == 1) return local;
    Tensor t = Tensor::Full({1}, local ? 1.0f : 0.0f);
    absl::Status s = world->AllReduce(t, ReduceOp::kMax)->Wait();
    BRAID_CHECK(s.ok()) << "agreeing on gradient overflow across ranks: " << s.ToString();
    return t.item() > 0;
  };
  CastParameters(*model_, mp_->dtype);
  make_optimizer_ = MixedPrecisionOptimizerFactory(std::move(make_optimizer_), mp_.get());
  ctx_.criterion = [mpp = mp_.get(), loss = ModelLoss(cfg_)](const Tensor& logits, const Batch& b) {
    return ScaledLoss(loss(logits, b), *mpp);
  };
  rep_->Line(absl::StrFormat(
      "braid: mixed precision: %s parameters, activations and gradients, f32 master weights; "
      "gradients reduced in %s; %s",
      DTypeName(mp_->dtype), cfg_.communication_data_type() == "fp32" ? "f32" : DTypeName(mp_->dtype),
      cfg_.fp16().enabled()
          ? (mp_->scaler.options().dynamic
                 ? absl::StrFormat("dynamic loss scale from %g", mp_->scaler.scale())
                 : absl::StrFormat("static loss scale %g", mp_->scaler.scale()))
          : std::string("no loss scaling")));
  return absl::OkStatus();
}

absl::Status Run::SetUpStrategy() {
  if (!cfg_.init_from().empty()) {
    // Against the whole model, before a strategy splits it: every mismatch in one message.
    std::map<std::string, Shape> shapes;
    for (auto& [name, t] : model_->NamedParameters()) shapes[name] = t.shape();
    BRAID_RETURN_IF_ERROR(CheckWeightsMatch(shapes, init_weights_, cfg_.init_from()));
  }
  BRAID_RETURN_IF_ERROR(strategy_->Setup(*model_, make_optimizer_, ctx_));
  // Activation checkpointing (launcher/activation_checkpointing/activation_checkpointing.h), under every strategy. Here,
  // after Setup: the model is in its final form (tensor parallelism has split it, the pipeline
  // has cut it), and the strategy's hooks are installed, so they fire again when a recompute
  // runs a block in backward (ZeRO-3 gathers its parameters there).
  if (cfg_.has_activation_checkpointing()) {
    BRAID_ASSIGN_OR_RETURN(CheckpointPolicy policy,
                           CheckpointPolicyFromConfig(cfg_.activation_checkpointing()));
    BRAID_ASSIGN_OR_RETURN(CheckpointingSummary ckpt, EnableActivationCheckpointing(*model_, policy));
    rep_->Line("braid: activation checkpointing: " + ckpt.ToString());
  }
  // Applied after Setup: a strategy that shards parameters keeps only this rank's part.
  if (!cfg_.init_from().empty()) {
    absl::Status st = strategy_->LoadFullStateDict(init_weights_);
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat(cfg_.init_from(), ": ", st.message()));
    if (mp_ != nullptr) ReloadMasterWeights(*strategy_->optimizer());  // masters were made at Setup
  }
  return absl::OkStatus();
}

// The data this rank reads, the schedule and the loss; then the start-up line.
absl::Status Run::PrepareData() {
  // On CUDA the batches are made on the host and copied ahead (pinned, on the copy stream) while
  // the previous step runs; elsewhere they are made on the device.
  const Device data_device = device_.type == DeviceType::kCUDA ? Device::CPU() : device_;
  BRAID_ASSIGN_OR_RETURN(source_, BuildData(cfg_, *model_, strategy_->data_parallel_rank(),
                                            strategy_->data_parallel_size(), data_device));
  schedule_ = MakeSchedule(cfg_);
  betas_ = MakeBetasSchedule(cfg_);  // OneCycle's momentum, or null
  BRAID_ASSIGN_OR_RETURN(eval_, Evaluation::Create(cfg_, device_, mp_ != nullptr ? mp_->dtype : DType::kF32));
  loss_fn_ = [mpp = mp_.get(), criterion = ModelLoss(cfg_)](Module& m, const Batch& b) {
    Tensor loss = criterion(m(b.inputs), b);
    return mpp != nullptr ? ScaledLoss(loss, *mpp) : loss;
  };
  steps_ = cfg_.steps();
  accum_ = cfg_.gradient_accumulation_steps();
  tokens_per_step_ = source_->TokensPerBatch() * accum_ * strategy_->data_parallel_size();
  // The dataset's unit (DatasetSpec::unit); validation has checked its name.
  BRAID_ASSIGN_OR_RETURN(DatasetSpec dataset, Registry::Get().GetDataset(cfg_.data().dataset()));
  unit_ = dataset.unit;
  rep_->Line(absl::StrFormat(
      "braid: training %s (%d parameters%s) on %s, strategy %s%s, %d step(s) of %d %s "
      "(micro-batch %d x %d accumulation x %d data-parallel rank(s)), %d thread(s)",
      cfg_.model().name(), model_->NumParameters(),
      mesh_ != nullptr && mesh_->shape().tensor > 1 ? " on this rank" : "", cfg_.data().dataset(),
      stack_.layers.size() > 1 ? stack_.Describe() : cfg_.strategy().name(),
      mesh_ != nullptr ? absl::StrCat(", layout ", mesh_->shape().ToString()) : "", steps_,
      tokens_per_step_, unit_, cfg_.train_micro_batch_size_per_gpu(), accum_,
      strategy_->data_parallel_size(), cfg_.threads()));
  return absl::OkStatus();
}

// Sharded checkpoints (plugins/checkpoint): resume from the newest complete one, if any.
absl::Status Run::Resume() {
  if (!cfg_.has_checkpoint()) return absl::OkStatus();
  const auto& c = cfg_.checkpoint();
  if (c.dir().empty()) return absl::InvalidArgumentError("checkpoint.dir is empty; name a folder");
  BRAID_RETURN_IF_ERROR(LoadPlugin("checkpoint", PluginSearchPath(env_.plugin_search_path)));
  CheckpointOptions co;
  co.dir = c.dir();
  // Relative to the workspace under `bazel run` (as runs/ is), not to the runfiles tree.
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (co.dir[0] != '/' && ws != nullptr && *ws) co.dir = absl::StrCat(ws, "/", co.dir);
  co.keep_last = c.has_keep_last() ? c.keep_last() : 2;
  co.async = c.async();
  checkpoint_options_ = co;
  BRAID_ASSIGN_OR_RETURN(checkpointer_, Registry::Get().MakeCheckpointer("safetensors", co));
  BRAID_ASSIGN_OR_RETURN(elastic_, ElasticCheckpoints::FromEnv(env_.rank, absl::Seconds(cfg_.collective_timeout_s())));
  // Refused at start, not at the first save, by a strategy that cannot describe its state.
  if (absl::StatusOr<std::vector<StateChunk>> probe = strategy_->StateChunks(false); !probe.ok()) {
    return absl::Status(probe.status().code(),
                        absl::StrCat("checkpoint: ", probe.status().message(),
                                     "; remove the checkpoint section or choose another strategy"));
  }
  if (c.has_resume() && !c.resume()) return absl::OkStatus();
  const absl::Time load_start = absl::Now();
  BRAID_ASSIGN_OR_RETURN(std::optional<int64_t> latest, checkpointer_->Latest(*group_[0]));
  if (!latest.has_value()) return absl::OkStatus();
  absl::StatusOr<std::vector<StateChunk>> chunks = strategy_->StateChunks(/*create=*/true);
  if (!chunks.ok()) {
    return absl::Status(chunks.status().code(),
                        absl::StrCat("cannot resume from ", c.dir(), ": ", chunks.status().message()));
  }
  BRAID_ASSIGN_OR_RETURN(auto extra, checkpointer_->Load(*latest, *chunks, *group_[0]));
  BRAID_RETURN_IF_ERROR(strategy_->AfterStateLoaded(*chunks));
  if (mp_ != nullptr) BRAID_RETURN_IF_ERROR(mp_->scaler.RestoreFrom(extra));
  first_step_ = int(*latest);
  // The data where it was: every rank draws `accum` batches a step, so after k steps each rank's
  // stream is k * accum batches in, whatever the layout that wrote the checkpoint (and the
  // sequential loader's global position is the same). Drawn again and dropped.
  const int64_t drawn = int64_t(first_step_) * accum_;
  for (; batches_drawn_ < drawn; ++batches_drawn_) (void)source_->Next();
  int64_t loaded = 0;
  for (const StateChunk& chunk : *chunks) loaded += int64_t(chunk.local.nbytes());
  rep_->Line(absl::StrFormat(
      "braid: resumed from %s/step_%d (step %d of %d); checked and loaded %.1f MiB in %.2f s",
      co.dir, *latest, first_step_, steps_, double(loaded) / (1 << 20),
      absl::ToDoubleSeconds(absl::Now() - load_start)));
  return absl::OkStatus();
}

absl::Status Run::SaveCheckpoint(int done_steps) {
  BRAID_ASSIGN_OR_RETURN(std::vector<StateChunk> chunks, strategy_->StateChunks(/*create=*/false));
  std::map<std::string, std::string> extra = {{"batches_drawn", absl::StrCat(batches_drawn_)},
                                              {"step", absl::StrCat(done_steps)}};
  // The one shape field no tensor shows, for tools/sample to rebuild the model from the weights.
  if (cfg_.model().has_n_head()) extra["n_head"] = absl::StrCat(cfg_.model().n_head());
  if (mp_ != nullptr) mp_->scaler.SaveTo(&extra);
  return checkpointer_->Save(done_steps, chunks, extra, *group_[0]);
}

absl::Status Run::Loop() {
  BRAID_RETURN_IF_ERROR(BeginLoop());
  while (!done()) BRAID_RETURN_IF_ERROR(Step().status());
  return EndLoop();
}

// Before the first step: the metrics file, monitors, the MFU's terms, the data's prefetching.
absl::Status Run::BeginLoop() {
  // Appends to the metrics of an earlier attempt in this folder, minus the steps redone here.
  BRAID_RETURN_IF_ERROR(rep_->BeginMetrics(first_step_));
  BRAID_ASSIGN_OR_RETURN(monitors_, OpenMonitors(cfg_, env_, first_step_));
  if (monitors_ != nullptr) rep_->Line("braid: monitors: " + monitors_->Describe());
  // MFU, on rank 0 (whose console the launcher shows): measured while the other ranks wait for
  // the first step's collectives, so they do not share the cores with the measurement.
  if (env_.rank == 0) {
    BRAID_ASSIGN_OR_RETURN(ModelSpec spec, Registry::Get().GetModel(cfg_.model().name()));
    if (spec.train_flops_per_token) {
      flops_per_token_ = spec.train_flops_per_token(cfg_.model());
      // On CUDA the peak depends on the products' dtype (tensor cores for bf16/f16).
      std::string basis;
      peak_flops_ = MeasurePeakFlops(device_, mp_ != nullptr ? mp_->dtype : DType::kF32, &basis);
      if (device_.type == DeviceType::kCUDA) peak_basis_ = basis;
      rep_->Note(absl::StrFormat("braid: MFU's terms: %.6g FLOP per %s (the model's formula), "
                                 "peak %.4g FLOP/s per process (%s)",
                                 flops_per_token_, unit_, peak_flops_, basis));
    }
  }
  // Peaks from here on: the training steps, not model construction.
  GetAllocator(device_)->ResetPeak();
  for (auto& [d, m] : AllMemoryStats()) GetAllocator(d)->ResetPeak();
  start_ = absl::Now();
  // A test hook (tests/distributed/checkpoint_test.sh): BRAID_FAULT=kill_at_step:N makes the
  // last rank kill itself at the start of step N in the group's first attempt, as a crash would.
  if (const char* fault = std::getenv("BRAID_FAULT"); fault != nullptr) {
    const char* attempt = std::getenv("BRAID_RESTART_COUNT");
    absl::string_view f(fault);
    if (absl::ConsumePrefix(&f, "kill_at_step:") && (attempt == nullptr || std::string(attempt) == "0") &&
        env_.rank == env_.world_size - 1) {
      (void)absl::SimpleAtoi(f, &kill_at_step_);
    }
  }
  // Made after a resume's fast-forward, which draws from the source directly.
  next_batch_ = [this]() { return source_->Next(); };
  if (device_.type == DeviceType::kCUDA) {
    BRAID_ASSIGN_OR_RETURN(next_batch_, cuda::PrefetchBatches(device_, next_batch_));
  }
  print_every_ = std::max(1, cfg_.log().print_every());
  step_ = first_step_;
  return absl::OkStatus();
}

// One training step, reported as a progress line and a metrics line; then evaluation and a
// checkpoint when due.
absl::StatusOr<StepStats> Run::Step() {
  BRAID_CHECK(!done()) << "Step after the last step (" << steps_ << ")";
  const int step = step_++;
  {
    if (step == kill_at_step_) std::raise(SIGKILL);
    std::vector<Batch> micro;
    for (int i = 0; i < accum_; ++i) {
      Batch b = next_batch_();
      micro.push_back(mp_ != nullptr ? CastInputs(b, mp_->dtype) : b);
    }
    batches_drawn_ += accum_;
    float lr = schedule_->At(step);
    strategy_->optimizer()->SetLearningRate(lr);
    if (betas_) {
      const auto [beta1, beta2] = betas_(step);
      strategy_->optimizer()->SetBetas(beta1, beta2);
    }
    absl::Time t0 = absl::Now();
    BRAID_ASSIGN_OR_RETURN(StepStats st, strategy_->TrainStep(micro, loss_fn_));
    double dt = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!std::isfinite(st.loss)) {
      return absl::InternalError(absl::StrCat("loss became ", st.loss, " at step ", step,
                                              ": lower the learning rate or check the data"));
    }
    totals_.Add(dt, st);
    if (step == first_step_) result_.first_loss = st.loss;
    result_.final_loss = st.loss;
    double tps = double(tokens_per_step_) / dt;
    double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
    double eta = elapsed / (step + 1) * (steps_ - step - 1);
    const double mfu = Mfu(flops_per_token_, tps, env_.world_size, peak_flops_);
    rep_->Metric(StepMetricJson(step, st, lr, dt, tps, GetMemoryStats(device_).peak_bytes, mp_.get(),
                                peak_flops_ > 0 && flops_per_token_ > 0 ? mfu : -1));
    if (monitors_ != nullptr) {
      BRAID_RETURN_IF_ERROR(monitors_->Write(
          step, StepEvents(st, lr, mp_.get(), cfg_.wall_clock_breakdown()), absl::Now()));
    }
    interval_.Add(st);
    bool keep = step % print_every_ == 0 || step == steps_ - 1;
    rep_->Progress(absl::StrFormat("step %*d/%d | loss %.4f | %s %s/s%s | lr %.2e | ETA %s",
                                   int(std::to_string(steps_).size()), step + 1, steps_, st.loss,
                                   absl::StrFormat("%.0f", tps), unit_,
                                   mfu > 0 ? absl::StrFormat(" | MFU %.1f%%", 100 * mfu) : "",
                                   lr, FormatDuration(eta)),
                   keep);
    // DeepSpeed's timer line, every print interval (steps_per_print is log.print_every).
    if (keep && cfg_.wall_clock_breakdown()) {
      rep_->Line(interval_.TakeLine(env_.rank, step + 2 - interval_.steps, step + 1));
    }
    if (eval_ != nullptr && eval_->Due(step, steps_)) {
      BRAID_ASSIGN_OR_RETURN(EvalResult ev, eval_->Run(*strategy_, *model_));
      rep_->Metric(Evaluation::MetricJson(step, ev));
      rep_->Progress(Evaluation::Line(step, steps_, ev), /*keep=*/true);
      if (monitors_ != nullptr) {  // beside Train/Samples/train_loss, at the same x
        BRAID_RETURN_IF_ERROR(monitors_->Write(
            step, {{"Eval/Samples/val_loss", float(ev.loss)}, {"Eval/Samples/val_ppl", float(ev.perplexity)}},
            absl::Now()));
      }
    }
    if (checkpointer_ != nullptr) {
      BRAID_RETURN_IF_ERROR(checkpointer_->Poll(*group_[0]));  // commits a finished async save
      const int every = cfg_.checkpoint().every_steps();
      if ((every > 0 && (step + 1) % every == 0) || step == steps_ - 1) {
        BRAID_RETURN_IF_ERROR(SaveCheckpoint(step + 1));
        // The checkpoint names this run's folder, so that a new command resumed from it
        // continues these metrics (launcher/run_folder.h). Best effort: the save itself stands.
        if (env_.rank == 0 && !env_.log_dir.empty()) {
          if (absl::Status st = RecordRunFolder(checkpoint_options_.dir, env_.log_dir); !st.ok()) {
            rep_->Note(absl::StrCat("braid: could not name the run folder in the checkpoint: ",
                                    st.message()));
          }
        }
        ++checkpoints_saved_;
        checkpoint_blocked_s_ += checkpointer_->last_save().blocked_s;
        // An elastic job grows here when a node waits to join: every rank stops after this
        // checkpoint, and the next round resumes from it.
        if (elastic_ != nullptr && step + 1 < steps_) {
          BRAID_ASSIGN_OR_RETURN(std::optional<std::string> joiner, elastic_->AfterCheckpoint(step + 1));
          if (joiner) {
            BRAID_RETURN_IF_ERROR(checkpointer_->Wait());
            return RegroupStatus(step + 1, *joiner);
          }
        }
      }
    }
    return st;
  }
}

absl::Status Run::EndLoop() {
  if (checkpointer_ != nullptr) BRAID_RETURN_IF_ERROR(checkpointer_->Wait());
  return absl::OkStatus();
}

absl::Status Run::SaveWeights(const std::string& path) {
  // Collective for sharded strategies: every rank gathers, rank 0 writes.
  BRAID_ASSIGN_OR_RETURN(auto state, strategy_->FullStateDict());
  if (env_.rank == 0) {
    std::map<std::string, std::string> meta = {{"format", "pt"}};
    if (cfg_.model().has_n_head()) meta["n_head"] = absl::StrCat(cfg_.model().n_head());
    BRAID_RETURN_IF_ERROR(SaveSafetensors(path, state, meta));
    rep_->Line(absl::StrCat("braid: wrote weights to ", path));
  }
  return absl::OkStatus();
}

// The summary, the evaluation, the weights (save_to) and where the files are.
absl::StatusOr<TrainResult> Run::Finish() {
  result_.steps = steps_;
  RunSummaryInputs summary;
  summary.steps = steps_;
  summary.first_step = first_step_;
  summary.tokens_per_step = tokens_per_step_;
  summary.unit = unit_.c_str();  // lives as long as this run
  summary.device = device_;
  summary.start = start_;
  summary.strategy = strategy_.get();
  summary.mp = mp_.get();
  summary.checkpointer = checkpointer_.get();
  summary.checkpoints_saved = checkpoints_saved_;
  summary.checkpoint_dir = checkpointer_ != nullptr ? checkpoint_options_.dir : "";
  summary.checkpoint_blocked_s = checkpoint_blocked_s_;
  summary.checkpoint_async = cfg_.checkpoint().async();
  summary.flops_per_token = flops_per_token_;
  summary.peak_flops = peak_flops_;
  summary.peak_basis = peak_basis_;
  summary.processes = env_.world_size;
  summary.threads = cfg_.threads();
  // A run resumed at (or past) its last step trains nothing: it says so, and adds no summary
  // to the metrics (the finished run's stays).
  const bool trained = first_step_ < steps_;
  RunEnd end;
  if (trained) {
    end = ReportRunSummary(*rep_, summary, totals_, result_);
  } else {
    rep_->Line(absl::StrFormat(
        "braid: nothing to train: the checkpoint is at step %d and the run has %d step(s), so it "
        "was already complete (raise --steps to train on)",
        first_step_, steps_));
  }
  std::string eval;
  if (source_->has_evaluation()) {
    BRAID_RETURN_IF_ERROR(strategy_->Evaluate([&](Module& m) { eval = source_->Evaluate(m); }));
  }
  if (!eval.empty()) rep_->Line("braid: " + eval);
  if (trained) rep_->Metric(SummaryMetricJson(eval, steps_, result_, end, mp_.get()));

  if (!cfg_.save_to().empty()) BRAID_RETURN_IF_ERROR(SaveWeights(cfg_.save_to()));
  if (!env_.log_dir.empty()) {
    result_.metrics_path = MetricsPath(env_);
    result_.log_path = LogPath(env_);
    rep_->Line(absl::StrCat("braid: metrics in ", result_.metrics_path, ", log in ", result_.log_path));
  }
  return result_;
}

}  // namespace

// Everything before the first step, in order.
absl::Status Prepare(Run& run) {
  BRAID_RETURN_IF_ERROR(run.PrepareDevice());
  BRAID_RETURN_IF_ERROR(run.OpenReport());
  BRAID_RETURN_IF_ERROR(run.ConnectWorld());
  BRAID_RETURN_IF_ERROR(run.Compose());
  BRAID_RETURN_IF_ERROR(run.BuildModelAndPrecision());
  BRAID_RETURN_IF_ERROR(run.SetUpStrategy());
  BRAID_RETURN_IF_ERROR(run.PrepareData());
  return run.Resume();
}

absl::StatusOr<TrainResult> Train(const TrainConfig& cfg, const TrainerEnv& env) {
  Run run(cfg, env);
  BRAID_RETURN_IF_ERROR(Prepare(run));
  BRAID_RETURN_IF_ERROR(run.Loop());
  return run.Finish();
}

// The same run, driven by its caller: the config and environment are kept here, since Run
// refers to them.
struct TrainingRun::State {
  State(TrainConfig c, TrainerEnv e) : cfg(std::move(c)), env(std::move(e)), run(cfg, env) {}
  const TrainConfig cfg;
  const TrainerEnv env;
  Run run;
  bool finished = false;
};

TrainingRun::TrainingRun(std::unique_ptr<State> state) : state_(std::move(state)) {}
TrainingRun::~TrainingRun() = default;

absl::StatusOr<std::unique_ptr<TrainingRun>> TrainingRun::Start(TrainConfig cfg, TrainerEnv env) {
  auto state = std::make_unique<State>(std::move(cfg), std::move(env));
  BRAID_RETURN_IF_ERROR(Prepare(state->run));
  BRAID_RETURN_IF_ERROR(state->run.BeginLoop());
  return std::unique_ptr<TrainingRun>(new TrainingRun(std::move(state)));
}

absl::StatusOr<StepStats> TrainingRun::Step() {
  if (state_->run.done()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "all ", state_->run.steps(), " step(s) of the config are done; raise steps to train on"));
  }
  return state_->run.Step();
}

bool TrainingRun::done() const { return state_->run.done(); }
int TrainingRun::step() const { return state_->run.step(); }
int TrainingRun::steps() const { return state_->run.steps(); }
Module& TrainingRun::model() { return state_->run.model(); }
Strategy& TrainingRun::strategy() { return state_->run.strategy(); }
const TrainConfig& TrainingRun::config() const { return state_->cfg; }

absl::Status TrainingRun::SaveWeights(const std::string& path) { return state_->run.SaveWeights(path); }

absl::StatusOr<TrainResult> TrainingRun::Finish() {
  if (state_->finished) return absl::FailedPreconditionError("Finish was called already");
  state_->finished = true;
  BRAID_RETURN_IF_ERROR(state_->run.EndLoop());
  return state_->run.Finish();
}

}  // namespace braid::launcher
