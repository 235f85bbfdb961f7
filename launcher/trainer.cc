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
#include "core/ops.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/store.h"
#include "core/strategy.h"
#include "core/weights_match.h"
#include "launcher/activation_checkpointing/activation_checkpointing.h"
#include "launcher/activation_checkpointing/kept_inputs.h"
#include "launcher/batch_sources.h"
#include "launcher/compose.h"
#include "launcher/config/config.h"
#include "launcher/device_binding.h"
#include "launcher/elastic_batch.h"
#include "launcher/evaluation.h"
#include "launcher/mixed_precision/mixed_precision.h"
#include "launcher/net.h"
#include "launcher/optimization.h"
#include "launcher/peak_flops.h"
#include "launcher/run_folder.h"
#include "launcher/run_report.h"
#include "launcher/trainer_run_internal.h"
#include "plugins/checkpoint/safetensors.h"
#include "plugins/checkpoint/sharded_safetensors.h"

namespace braid::launcher {

using config::TrainConfig;

namespace {

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

// DeepSpeed's partition_activations and cpu_checkpointing (kept_inputs.h): where checkpoints on
// `device` keep their inputs; null where neither applies (validation noted why).
std::shared_ptr<KeptInputs> KeptInputsFor(const config::TrainConfig& cfg, Device device,
                                          const DeviceMesh* mesh) {
  const config::ActivationCheckpointingConfig& a = cfg.activation_checkpointing();
  KeptInputs::Options o;
  // Under sequence parallelism a block's input is this rank's part of the sequence already, not
  // the same on every rank of the tensor group: nothing to partition.
  if (a.partition_activations() && mesh != nullptr && mesh->shape().tensor > 1 &&
      !cfg.parallel().sequence_parallel()) {
    o.partition_group = &mesh->tensor();
  }
  o.to_host = a.cpu_checkpointing() && device.type != DeviceType::kCPU;
  if (o.partition_group == nullptr && !o.to_host) return nullptr;
  return std::make_shared<KeptInputs>(o);
}

}  // namespace

// The phases before the first step (trainer_loop.cc has the steps and the end).
namespace internal {

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
  BRAID_RETURN_IF_ERROR(HandGroups(stack_, mesh_.get(), *group_[0], &ctx_));
  ctx_.device = device_;
  for (auto& [k, v] : cfg_.strategy().options()) ctx_.options[k] = v;
  ctx_.max_grad_norm = float(cfg_.gradient_clipping());
  sections_ = config::SectionsOf(cfg_);
  ctx_.config = &sections_;  // the sections the strategy implements (zero_optimization, ...)
  ctx_.criterion = ModelLoss(cfg_);
  // Strategies that keep several copies of the model (dp) build them with the same config.
  ctx_.make_replica = [&cfg = cfg_](Device d) -> std::unique_ptr<Module> {
    auto m = BuildModel(cfg, d);
    if (!m.ok()) return nullptr;
    // A replica is trained like the model: checkpointed the same way (dp's devices).
    if (cfg.has_activation_checkpointing()) {
      auto policy = CheckpointPolicyFromConfig(cfg.activation_checkpointing());
      if (!policy.ok()) return nullptr;
      policy->kept_inputs = KeptInputsFor(cfg, d, nullptr);  // cpu_checkpointing on its device
      if (!EnableActivationCheckpointing(**m, *policy).ok()) return nullptr;
    }
    return std::move(*m);
  };
  return absl::OkStatus();
}

// The model, built whole, or without parameter memory when the strategy materialises only what
// this rank keeps (ZeRO-3): every rank then never holds the whole model. Then mixed precision
// (launcher/mixed_precision/mixed_precision.h), for the strategies that declare fp16/bf16: half parameters before
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
  // never diverge. The check value is summed on the model's device, where NCCL moves it, and read
  // with the step's other scalars. Masters in host memory (ZeRO-Offload) hand a host value: it
  // travels through the device.
  Communicator* world = group_[0].get();
  mp_->device = device_;
  if (world->size() > 1) {
    mp_->sum_over_ranks = [world, device = device_](Tensor& check) {
      Tensor t = check.device() == device ? check : check.To(device);
      absl::Status s = world->AllReduce(t, ReduceOp::kSum)->Wait();
      BRAID_CHECK(s.ok()) << "agreeing on gradient overflow across ranks: " << s.ToString();
      if (!(t.device() == check.device())) check.CopyFrom(t);
    };
  }
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
  model_parameters_ = model_->NumParameters();
  BRAID_RETURN_IF_ERROR(strategy_->Setup(*model_, make_optimizer_, ctx_));
  // Activation checkpointing (launcher/activation_checkpointing/activation_checkpointing.h), under every strategy. Here,
  // after Setup: the model is in its final form (tensor parallelism has split it, the pipeline
  // has cut it), and the strategy's hooks are installed, so they fire again when a recompute
  // runs a block in backward (ZeRO-3 gathers its parameters there).
  if (cfg_.has_activation_checkpointing()) {
    BRAID_ASSIGN_OR_RETURN(CheckpointPolicy policy,
                           CheckpointPolicyFromConfig(cfg_.activation_checkpointing()));
    policy.kept_inputs = KeptInputsFor(cfg_, device_, mesh_.get());
    BRAID_ASSIGN_OR_RETURN(CheckpointingSummary ckpt, EnableActivationCheckpointing(*model_, policy));
    const std::string kept = policy.kept_inputs ? policy.kept_inputs->ToString(device_) : "";
    rep_->Line(absl::StrCat("braid: activation checkpointing: ", ckpt.ToString(),
                            kept.empty() ? "" : "; kept inputs: " + kept));
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
      // Fewer than the whole model's when a layer split it (whichever layer, by what it did).
      model_->NumParameters() != model_parameters_ ? " on this rank" : "", cfg_.data().dataset(),
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

}  // namespace internal

using internal::Run;

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
