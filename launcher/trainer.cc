#include "launcher/trainer.h"

#include <csignal>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "backends/cuda/device_check.h"
#include "backends/store/tcp_store.h"
#include "core/activation_checkpointing.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/autograd.h"
#include "core/in_process_communicator.h"
#include "core/ops.h"
#include "core/mixed_precision.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/safetensors.h"
#include "core/store.h"
#include "launcher/batch_sources.h"
#include "launcher/compose.h"
#include "launcher/optimization.h"
#include "launcher/net.h"
#include "launcher/run_report.h"
#include "core/checkpointer.h"
#include "core/deferred_init.h"
#include "core/mesh.h"
#include "core/strategy.h"
#include "models/data/distributed_sampler.h"
#include "models/data/find_data.h"
#include "models/data/mnist.h"
#include "models/data/token_data.h"
#include "models/gpt/gpt.h"
#include "models/mlp/mlp.h"

namespace braid::launcher {

namespace {

using config::TrainConfig;

// The model's library registered it (models/gpt, models/mlp); validation has checked the model
// section against it and filled in its defaults.
absl::StatusOr<std::unique_ptr<Module>> BuildModel(const TrainConfig& cfg, Device device) {
  return Registry::Get().MakeModel(cfg.model().name(), cfg.model(), cfg.seed(), device);
}

}  // namespace

absl::StatusOr<TrainResult> Train(const TrainConfig& cfg, const TrainerEnv& env) {
  BRAID_ASSIGN_OR_RETURN(Device device, Device::Parse(cfg.device()));
  if (device.type == DeviceType::kCUDA) {
    // One GPU per worker: worker LOCAL_RANK r of a node trains on cuda:N+r (NCCL refuses two
    // ranks on one GPU). The backend says whether the device is usable: "no CUDA backend" in
    // the default build, CUDA's own reason (no driver, no GPU) under --config=cuda.
    int local_rank = 0;
    if (const char* lr = std::getenv("LOCAL_RANK")) (void)absl::SimpleAtoi(lr, &local_rank);
    device.index += local_rank;
    BRAID_RETURN_IF_ERROR(cuda::PrepareCudaDevice(device));
  }
  // A file-size limit (ulimit -f) makes a too-large write fail with EFBIG, reported like a full
  // disk, instead of killing the process with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  Reporter rep(env);
  if (!rep.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write train.log / metrics.jsonl in '", env.log_dir, "'"));
  }

  if (!env.plugin_origin.empty()) rep.Note(absl::StrCat("braid: plugins ", env.plugin_origin));
  // Read (and checked) before any communication, so a bad file fails at once on every rank.
  std::map<std::string, Tensor> init_weights;
  if (!cfg.init_from().empty()) {
    BRAID_ASSIGN_OR_RETURN(init_weights, LoadSafetensors(cfg.init_from()));
    // PyTorch's nanoGPT state dict also carries the tied head under its own name.
    auto head = init_weights.find("lm_head.weight");
    if (head != init_weights.end() && init_weights.count("wte.weight")) init_weights.erase(head);
  }

  // The strategy: a plugin found by name on the search path, or an explicit .so.
  const std::string& sname = cfg.strategy().name();
  if (!cfg.strategy().path().empty()) {
    BRAID_RETURN_IF_ERROR(LoadPlugin(cfg.strategy().path(), env.plugin_search_path));
  }
  BRAID_RETURN_IF_ERROR(EnsureStrategy(sname, PluginSearchPath(env.plugin_search_path)));

  // The world group: a communicator plugin over the launcher's store for several processes, the
  // in-process communicator for one.
  std::unique_ptr<Store> store, world_store;
  std::vector<std::unique_ptr<Communicator>> group;
  if (env.world_size > 1) {
    BRAID_ASSIGN_OR_RETURN(store, ConnectStoreFromEnv(absl::Seconds(cfg.collective_timeout_s())));
    // A restarted worker group must not read the previous attempt's rendezvous keys.
    const char* attempt = std::getenv("BRAID_RESTART_COUNT");
    world_store = std::make_unique<PrefixStore>(
        absl::StrCat("braid/attempt", attempt ? attempt : "0", "/world"), store.get());
    BRAID_RETURN_IF_ERROR(
        EnsureCommunicator(cfg.communicator(), PluginSearchPath(env.plugin_search_path)));
    CommunicatorOptions co;
    co.rank = env.rank;
    co.size = env.world_size;
    co.store = world_store.get();
    co.device = device;
    co.timeout = absl::Seconds(cfg.collective_timeout_s());
    if (cfg.communicator() == "gloo") {
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
                           Registry::Get().MakeCommunicator(cfg.communicator(), co));
    group.push_back(std::move(world));
  } else {
    group = MakeInProcessGroup(1);
  }
  // The tensor x pipeline x data layout, every group built once (core/mesh.h).
  std::unique_ptr<DeviceMesh> mesh;
  if (cfg.has_parallel()) {
    const auto& p = cfg.parallel();
    BRAID_ASSIGN_OR_RETURN(mesh, DeviceMesh::Create(*group[0], {p.tensor(), p.pipeline(), p.data()}));
  }
  // The stack of layers, one per mesh axis, chosen by their declared axes (launcher/compose.h).
  // Made after the communicators, so it goes before them: its own groups come from the world.
  const MeshShape shape = mesh ? mesh->shape() : MeshShape{1, 1, env.world_size};
  BRAID_ASSIGN_OR_RETURN(
      const Stack stack,
      ComposeStack(shape.tensor, shape.pipeline, shape.data, sname,
                   PluginLayerCatalog(PluginSearchPath(env.plugin_search_path), cfg.strategy().path())));
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<Strategy> strategy, BuildStack(stack));
  StrategyContext ctx;
  ctx.mesh = mesh.get();
  ctx.comm = group[0].get();
  ctx.device = device;
  for (auto& [k, v] : cfg.strategy().options()) ctx.options[k] = v;
  ctx.max_grad_norm = float(cfg.gradient_clipping());
  ctx.config = &cfg;  // the sections the strategy implements (zero_optimization, ...)
  ctx.criterion = [](const Tensor& logits, const Batch& b) {
    return ops::CrossEntropy(logits, b.targets);
  };
  // Strategies that keep several copies of the model (dp) build them with the same config.
  ctx.make_replica = [&cfg](Device d) -> std::unique_ptr<Module> {
    auto m = BuildModel(cfg, d);
    if (!m.ok()) return nullptr;
    // A replica is trained like the model: checkpointed the same way (dp's devices).
    if (cfg.has_activation_checkpointing()) {
      auto policy = CheckpointPolicyFromConfig(cfg.activation_checkpointing());
      if (!policy.ok() || !EnableActivationCheckpointing(**m, *policy).ok()) return nullptr;
    }
    return std::move(*m);
  };
  // The model, built whole, or without parameter memory when the strategy materialises only
  // what this rank keeps (ZeRO-3): every rank then never holds the whole model.
  std::unique_ptr<Module> model;
  if (strategy->wants_deferred_init(ctx)) {
    DeferredInitScope deferred;
    BRAID_ASSIGN_OR_RETURN(model, BuildModel(cfg, device));
  } else {
    BRAID_ASSIGN_OR_RETURN(model, BuildModel(cfg, device));
  }
  // A batch of the training data's shape, for strategies that time the model (pipeline
  // partition "time"); read from the data as rank 0 of one would, only when asked.
  ctx.sample_batch = [&cfg, &model, device]() -> Batch {
    absl::StatusOr<std::unique_ptr<BatchSource>> s = BuildData(cfg, *model, 0, 1, device);
    BRAID_CHECK(s.ok()) << s.status().ToString();
    return (*s)->Next();
  };
  // ---- Mixed precision (core/mixed_precision.h), for the strategies that declare fp16/bf16 ----
  // Half parameters before Setup, so the strategy lays out (buckets, flattens, shards) half
  // tensors; f32 masters in the optimizer it builds; the loss scaled for backward only.
  std::unique_ptr<MixedPrecision> mp;
  OptimizerFactory make_optimizer = MakeOptimizerFactory(cfg);
  if (cfg.bf16().enabled() || cfg.fp16().enabled()) {
    mp = std::make_unique<MixedPrecision>();
    if (cfg.fp16().enabled()) {
      const auto& f = cfg.fp16();
      mp->dtype = DType::kF16;
      LossScalerOptions so;
      so.dynamic = f.loss_scale() == 0;
      so.initial_scale = so.dynamic ? std::ldexp(1.0f, f.initial_scale_power()) : float(f.loss_scale());
      so.window = f.loss_scale_window();
      so.hysteresis = f.hysteresis();
      so.consecutive_hysteresis = f.consecutive_hysteresis();
      so.min_scale = float(f.min_loss_scale());
      mp->scaler = LossScaler(so);
    } else {
      mp->dtype = DType::kBF16;  // bf16 has f32's exponent range: no loss scaling
    }
    // Every rank skips a step any rank found inf/NaN in (ZeRO's shards differ), so the
    // replicas never diverge.
    Communicator* world = group[0].get();
    mp->any_rank = [world](bool local) {
      if (world->size() == 1) return local;
      Tensor t = Tensor::Full({1}, local ? 1.0f : 0.0f);
      absl::Status s = world->AllReduce(t, ReduceOp::kMax)->Wait();
      BRAID_CHECK(s.ok()) << "agreeing on gradient overflow across ranks: " << s.ToString();
      return t.item() > 0;
    };
    CastParameters(*model, mp->dtype);
    make_optimizer = MixedPrecisionOptimizerFactory(std::move(make_optimizer), mp.get());
    ctx.criterion = [mpp = mp.get()](const Tensor& logits, const Batch& b) {
      return ScaledLoss(ops::CrossEntropy(logits, b.targets), *mpp);
    };
    rep.Line(absl::StrFormat("braid: mixed precision: %s parameters, activations and gradients, "
                             "f32 master weights; gradients reduced in %s; %s",
                             DTypeName(mp->dtype),
                             cfg.communication_data_type() == "fp32" ? "f32" : DTypeName(mp->dtype),
                             cfg.fp16().enabled()
                                 ? (mp->scaler.options().dynamic
                                        ? absl::StrFormat("dynamic loss scale from %g", mp->scaler.scale())
                                        : absl::StrFormat("static loss scale %g", mp->scaler.scale()))
                                 : std::string("no loss scaling")));
  }
  BRAID_RETURN_IF_ERROR(strategy->Setup(*model, make_optimizer, ctx));
  // ---- Activation checkpointing (core/activation_checkpointing.h), under every strategy ----
  // Here, after Setup: the model is in its final form (tensor parallelism has split it, the
  // pipeline has cut it), and the strategy's hooks are installed, so they fire again when a
  // recompute runs a block in backward (ZeRO-3 gathers its parameters there).
  if (cfg.has_activation_checkpointing()) {
    BRAID_ASSIGN_OR_RETURN(CheckpointPolicy policy,
                           CheckpointPolicyFromConfig(cfg.activation_checkpointing()));
    BRAID_ASSIGN_OR_RETURN(CheckpointingSummary ckpt, EnableActivationCheckpointing(*model, policy));
    rep.Line("braid: activation checkpointing: " + ckpt.ToString());
  }
  // ---- end of activation checkpointing ----
  // Applied after Setup: a strategy that shards parameters keeps only this rank's part.
  if (!cfg.init_from().empty()) {
    absl::Status st = strategy->LoadFullStateDict(init_weights);
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat(cfg.init_from(), ": ", st.message()));
    if (mp != nullptr) ReloadMasterWeights(*strategy->optimizer());  // masters were made at Setup
  }

  // On CUDA the batches are made on the host and copied ahead (pinned, on the copy stream) while
  // the previous step runs; elsewhere they are made on the device.
  const Device data_device = device.type == DeviceType::kCUDA ? Device::CPU() : device;
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source, BuildData(cfg, *model, strategy->data_parallel_rank(),
                                   strategy->data_parallel_size(), data_device));
  std::unique_ptr<LrSchedule> schedule = MakeSchedule(cfg);
  LossFn loss_fn = [mpp = mp.get()](Module& m, const Batch& b) {
    Tensor loss = ops::CrossEntropy(m(b.inputs), b.targets);
    return mpp != nullptr ? ScaledLoss(loss, *mpp) : loss;
  };

  const int steps = cfg.steps();
  const int accum = cfg.gradient_accumulation_steps();
  const int print_every = std::max(1, cfg.log().print_every());
  const int64_t tokens_per_step =
      source->TokensPerBatch() * accum * strategy->data_parallel_size();
  const char* unit = cfg.data().dataset() == "mnist" ? "samples" : "tok";
  rep.Line(absl::StrFormat(
      "braid: training %s (%d parameters%s) on %s, strategy %s%s, %d step(s) of %d %s "
      "(micro-batch %d x %d accumulation x %d data-parallel rank(s)), %d thread(s)",
      cfg.model().name(), model->NumParameters(),
      mesh != nullptr && mesh->shape().tensor > 1 ? " on this rank" : "", cfg.data().dataset(),
      stack.layers.size() > 1 ? stack.Describe() : sname,
      mesh != nullptr ? absl::StrCat(", layout ", mesh->shape().ToString()) : "", steps,
      tokens_per_step, unit, cfg.train_micro_batch_size_per_gpu(), accum, strategy->data_parallel_size(),
      cfg.threads()));

  // Sharded checkpoints (plugins/checkpoint): resume from the newest complete one, if any.
  std::unique_ptr<Checkpointer> checkpointer;
  CheckpointOptions checkpoint_options;
  int first_step = 0;
  int64_t batches_drawn = 0;  // from the data source, for the resumed run to draw the same
  if (cfg.has_checkpoint()) {
    const auto& c = cfg.checkpoint();
    if (c.dir().empty()) return absl::InvalidArgumentError("checkpoint.dir is empty; name a folder");
    BRAID_RETURN_IF_ERROR(LoadPlugin("checkpoint", PluginSearchPath(env.plugin_search_path)));
    CheckpointOptions co;
    co.dir = c.dir();
    // Relative to the workspace under `bazel run` (as runs/ is), not to the runfiles tree.
    const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    if (co.dir[0] != '/' && ws != nullptr && *ws) co.dir = absl::StrCat(ws, "/", co.dir);
    co.keep_last = c.has_keep_last() ? c.keep_last() : 2;
    co.async = c.async();
    checkpoint_options = co;
    BRAID_ASSIGN_OR_RETURN(checkpointer, Registry::Get().MakeCheckpointer("safetensors", co));
    // Refused at start, not at the first save, by a strategy that cannot describe its state.
    if (absl::StatusOr<std::vector<StateChunk>> probe = strategy->StateChunks(false); !probe.ok()) {
      return absl::Status(probe.status().code(),
                          absl::StrCat("checkpoint: ", probe.status().message(),
                                       "; remove the checkpoint section or choose another strategy"));
    }
    if (!c.has_resume() || c.resume()) {
      const absl::Time load_start = absl::Now();
      BRAID_ASSIGN_OR_RETURN(std::optional<int64_t> latest, checkpointer->Latest(*group[0]));
      if (latest.has_value()) {
        absl::StatusOr<std::vector<StateChunk>> chunks = strategy->StateChunks(/*create=*/true);
        if (!chunks.ok()) {
          return absl::Status(chunks.status().code(),
                              absl::StrCat("cannot resume from ", c.dir(), ": ", chunks.status().message()));
        }
        BRAID_ASSIGN_OR_RETURN(auto extra, checkpointer->Load(*latest, *chunks, *group[0]));
        BRAID_RETURN_IF_ERROR(strategy->AfterStateLoaded(*chunks));
        if (mp != nullptr) BRAID_RETURN_IF_ERROR(mp->scaler.RestoreFrom(extra));
        first_step = int(*latest);
        // The data where it was: every rank draws `accum` batches a step, so after k steps each
        // rank's stream is k * accum batches in, whatever the layout that wrote the checkpoint
        // (and the sequential loader's global position is the same). Drawn again and dropped.
        const int64_t drawn = int64_t(first_step) * accum;
        for (; batches_drawn < drawn; ++batches_drawn) (void)source->Next();
        int64_t loaded = 0;
        for (const StateChunk& chunk : *chunks) loaded += int64_t(chunk.local.nbytes());
        rep.Line(absl::StrFormat(
            "braid: resumed from %s/step_%d (step %d of %d); checked and loaded %.1f MiB in %.2f s",
            co.dir, *latest, first_step, steps, double(loaded) / (1 << 20),
            absl::ToDoubleSeconds(absl::Now() - load_start)));
      }
    }
  }
  auto save_checkpoint = [&](int done_steps) -> absl::Status {
    BRAID_ASSIGN_OR_RETURN(std::vector<StateChunk> chunks, strategy->StateChunks(/*create=*/false));
    std::map<std::string, std::string> extra = {{"batches_drawn", absl::StrCat(batches_drawn)},
                                                {"step", absl::StrCat(done_steps)}};
    if (mp != nullptr) mp->scaler.SaveTo(&extra);
    return checkpointer->Save(done_steps, chunks, extra, *group[0]);
  };
  int checkpoints_saved = 0;
  const std::string checkpoint_dir = checkpointer != nullptr ? checkpoint_options.dir : "";
  double checkpoint_blocked_s = 0;

  TrainResult result;
  StepTotals totals;  // for the summary
  // Peaks from here on: the training steps, not model construction.
  GetAllocator(device)->ResetPeak();
  for (auto& [d, m] : AllMemoryStats()) GetAllocator(d)->ResetPeak();
  absl::Time start = absl::Now();
  // A test hook (tests/distributed/checkpoint_test.sh): BRAID_FAULT=kill_at_step:N makes the
  // last rank kill itself at the start of step N in the group's first attempt, as a crash would.
  int kill_at_step = -1;
  if (const char* fault = std::getenv("BRAID_FAULT"); fault != nullptr) {
    const char* attempt = std::getenv("BRAID_RESTART_COUNT");
    absl::string_view f(fault);
    if (absl::ConsumePrefix(&f, "kill_at_step:") && (attempt == nullptr || std::string(attempt) == "0") &&
        env.rank == env.world_size - 1) {
      (void)absl::SimpleAtoi(f, &kill_at_step);
    }
  }
  // Made after a resume's fast-forward, which draws from the source directly.
  std::function<Batch()> next_batch = [&source]() { return source->Next(); };
  if (device.type == DeviceType::kCUDA) {
    BRAID_ASSIGN_OR_RETURN(next_batch, cuda::PrefetchBatches(device, next_batch));
  }
  for (int step = first_step; step < steps; ++step) {
    if (step == kill_at_step) std::raise(SIGKILL);
    std::vector<Batch> micro;
    for (int i = 0; i < accum; ++i) {
      Batch b = next_batch();
      micro.push_back(mp != nullptr ? CastInputs(b, mp->dtype) : b);
    }
    batches_drawn += accum;
    float lr = schedule->At(step);
    strategy->optimizer()->SetLearningRate(lr);
    absl::Time t0 = absl::Now();
    BRAID_ASSIGN_OR_RETURN(StepStats st, strategy->TrainStep(micro, loss_fn));
    double dt = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!std::isfinite(st.loss)) {
      return absl::InternalError(absl::StrCat("loss became ", st.loss, " at step ", step,
                                              ": lower the learning rate or check the data"));
    }
    totals.Add(dt, st);
    if (step == first_step) result.first_loss = st.loss;
    result.final_loss = st.loss;
    double tps = double(tokens_per_step) / dt;
    double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
    double eta = elapsed / (step + 1) * (steps - step - 1);
    rep.Metric(StepMetricJson(step, st, lr, dt, tps, GetMemoryStats(device).peak_bytes, mp.get()));
    bool keep = step % print_every == 0 || step == steps - 1;
    rep.Progress(absl::StrFormat("step %*d/%d | loss %.4f | %s %s/s | lr %.2e | ETA %s",
                                 int(std::to_string(steps).size()), step + 1, steps, st.loss,
                                 absl::StrFormat("%.0f", tps), unit, lr, FormatDuration(eta)),
                 keep);
    if (checkpointer != nullptr) {
      BRAID_RETURN_IF_ERROR(checkpointer->Poll(*group[0]));  // commits a finished async save
      const int every = cfg.checkpoint().every_steps();
      if ((every > 0 && (step + 1) % every == 0) || step == steps - 1) {
        BRAID_RETURN_IF_ERROR(save_checkpoint(step + 1));
        ++checkpoints_saved;
        checkpoint_blocked_s += checkpointer->last_save().blocked_s;
      }
    }
  }
  if (checkpointer != nullptr) BRAID_RETURN_IF_ERROR(checkpointer->Wait());
  result.steps = steps;
  RunSummaryInputs summary;
  summary.steps = steps;
  summary.first_step = first_step;
  summary.tokens_per_step = tokens_per_step;
  summary.unit = unit;
  summary.device = device;
  summary.start = start;
  summary.strategy = strategy.get();
  summary.mp = mp.get();
  summary.checkpointer = checkpointer.get();
  summary.checkpoints_saved = checkpoints_saved;
  summary.checkpoint_dir = checkpoint_dir;
  summary.checkpoint_blocked_s = checkpoint_blocked_s;
  summary.checkpoint_async = cfg.checkpoint().async();
  const RunEnd end = ReportRunSummary(rep, summary, totals, result);
  std::string eval;
  if (source->has_evaluation()) {
    BRAID_RETURN_IF_ERROR(strategy->Evaluate([&](Module& m) { eval = source->Evaluate(m); }));
  }
  if (!eval.empty()) rep.Line("braid: " + eval);
  rep.Metric(SummaryMetricJson(eval, steps, result, end, mp.get()));

  if (!cfg.save_to().empty()) {
    // Collective for sharded strategies: every rank gathers, rank 0 writes.
    BRAID_ASSIGN_OR_RETURN(auto state, strategy->FullStateDict());
    if (env.rank == 0) {
      BRAID_RETURN_IF_ERROR(SaveSafetensors(cfg.save_to(), state, {{"format", "pt"}}));
      rep.Line(absl::StrCat("braid: wrote weights to ", cfg.save_to()));
    }
  }
  if (!env.log_dir.empty()) {
    result.metrics_path = MetricsPath(env);
    result.log_path = LogPath(env);
    rep.Line(absl::StrCat("braid: metrics in ", result.metrics_path, ", log in ", result.log_path));
  }
  return result;
}

}  // namespace braid::launcher
