// DeepSpeed's keys without a Braid field (deepspeed_keys.h). Written from DeepSpeed's config
// reference (docs/_pages/config-json.md) and the keys its runtime reads (runtime/constants.py,
// runtime/zero/config.py and offload_config.py, the monitor, profiler, comms, nebula, aio,
// elasticity and autotuning configs, lr_schedules.py, the optimizers' constructors).
#include "launcher/config/deepspeed_keys.h"

#include "absl/strings/str_split.h"

namespace braid::config {
namespace {

using K = DeepSpeedKeyKind;

constexpr char kAverage[] =
    "Braid averages gradients in one reduction; where the division happens changes nothing in "
    "exact arithmetic";
constexpr char kNvmeOnly[] =
    "it tunes DeepSpeed's NVMe swapping; Braid offloads to host memory only (device \"nvme\" is "
    "refused)";
constexpr char kTorchSwitch[] =
    "it picks among PyTorch's implementations of one update; Braid has one, with the same "
    "arithmetic";
constexpr char kOneBit[] =
    "DeepSpeed's 1-bit optimizers' compressed communication (OneBitAdam, ZeroOneAdam, "
    "OneBitLamb; their parameter)";
constexpr char kOneBitNearest[] =
    "optimizer.type \"Adam\" or \"Lamb\"; communication_data_type \"bf16\" halves what is "
    "reduced";
constexpr char kTorchOnly[] =
    "a parameter of a torch.optim optimizer Braid does not have (Adagrad, RMSprop, Adadelta, "
    "NAdam, RAdam)";
constexpr char kTorchOnlyNearest[] = "optimizer.type \"Adam\", \"AdamW\" or \"SGD\"";
constexpr char kZeroWhole[] = "zero_optimization.stage 3 over all data-parallel ranks";

const std::vector<DeepSpeedKey>& Table() {
  static const std::vector<DeepSpeedKey> table = {
      // ---- Batch, logging and communication (top level) ---------------------------------------
      {"steps_per_print", K::kMapped, nullptr, "read as log.print_every", nullptr},
      {"dump_state", K::kNoted, nullptr, "Braid prints no engine state", nullptr},
      {"memory_breakdown", K::kNoted, nullptr, "Braid's summary reports the peak memory", nullptr},
      {"prescale_gradients", K::kNoted, nullptr, kAverage, nullptr},
      {"gradient_predivide_factor", K::kNoted, nullptr, kAverage, nullptr},
      {"disable_allgather", K::kNoted, nullptr,
       "it switches DeepSpeed's stage-1/2 parameter all-gather to broadcasts; Braid's ZeRO "
       "gathers the updated shards one way, same values",
       nullptr},
      {"seq_parallel_comm_data_type", K::kNoted, nullptr,
       "it is the dtype of DeepSpeed's Ulysses all-to-alls (sequence_parallel_size, refused); "
       "Braid's sequence parallelism reduces in the activations' dtype",
       nullptr},
      {"sparse_gradients", K::kRefused, "false", "sparse embedding gradients",
       "dense gradients (the default)"},
      {"zero_allow_untested_optimizer", K::kNoted, nullptr,
       "Braid's ZeRO steps any registered optimizer", nullptr},
      {"zero_force_ds_cpu_optimizer", K::kNoted, nullptr,
       "with offload_optimizer \"cpu\" Braid always steps its own optimizer on the host", nullptr},
      {"dataloader_drop_last", K::kNoted, nullptr,
       "Braid's samplers always draw whole micro-batches", nullptr},
      {"use_data_before_expert_parallelism", K::kNoted, nullptr,
       "it orders DeepSpeed's mixture-of-experts groups; Braid has no expert parallelism",
       nullptr},
      {"vocabulary_size", K::kNoted, nullptr,
       "DeepSpeed reads it for its own kernels; model.vocab_size is Braid's", nullptr},
      {"graph_harvesting", K::kRefused, "false", "CUDA-graph capture of DeepSpeed's kernels",
       "no equivalent; Braid launches its kernels directly"},
      {"bfloat16", K::kMapped, nullptr, "read as bf16 (its old spelling)", nullptr},
      {"timers", K::kNoted, nullptr,
       "it configures DeepSpeed's throughput timer; Braid's progress line and summary always "
       "report tokens/s",
       nullptr, false, "throughput"},
      {"timers.throughput", K::kNoted, nullptr, "part of timers", nullptr, false,
       "enabled synchronized"},
      {"data_types", K::kNoted, nullptr,
       "Braid accumulates micro-batch gradients in the parameters' own dtype (f32, or bf16/f16 "
       "under mixed precision) and up-casts them into the f32 masters once per step; "
       "grad_accum_dtype is accepted where it names that (or \"fp32\" over one micro-batch) and "
       "refused otherwise",
       nullptr, false, "grad_accum_dtype"},

      // ---- optimizer ------------------------------------------------------------------------
      {"optimizer.legacy_fusion", K::kNoted, nullptr,
       "it picks DeepSpeed's old fused fp16 optimizer; Braid has one mixed-precision path",
       nullptr},
      {"optimizer.params.set_grad_none", K::kNoted, nullptr,
       "Braid's strategies zero the gradients after each step either way", nullptr},
      {"optimizer.params.fp32_optimizer_states", K::kNoted, "true",
       "Braid's optimizer state is f32 (8-bit with Adam8bit)", nullptr},
      {"optimizer.params.foreach", K::kNoted, nullptr, kTorchSwitch, nullptr},
      {"optimizer.params.fused", K::kNoted, nullptr, kTorchSwitch, nullptr},
      {"optimizer.params.capturable", K::kNoted, nullptr, kTorchSwitch, nullptr},
      {"optimizer.params.differentiable", K::kNoted, "false",
       "Braid's optimizer steps are not differentiated", nullptr},
      {"optimizer.params.maximize", K::kRefused, "false", "gradient ascent (maximize)",
       "minimise the negated loss"},
      {"optimizer.params.freeze_step", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.cuda_aware", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.comm_backend_name", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.var_freeze_step", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.var_update_scaler", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.local_step_scaler", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.local_step_clipper", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.coeff_beta", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.factor_max", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.factor_min", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.factor_threshold", K::kRefused, kNever, kOneBit, kOneBitNearest},
      {"optimizer.params.lr_decay", K::kRefused, kNever, kTorchOnly, kTorchOnlyNearest},
      {"optimizer.params.initial_accumulator_value", K::kRefused, kNever, kTorchOnly,
       kTorchOnlyNearest},
      {"optimizer.params.alpha", K::kRefused, kNever, kTorchOnly, kTorchOnlyNearest},
      {"optimizer.params.centered", K::kRefused, kNever, kTorchOnly, kTorchOnlyNearest},
      {"optimizer.params.rho", K::kRefused, kNever, kTorchOnly, kTorchOnlyNearest},
      {"optimizer.params.momentum_decay", K::kRefused, kNever, kTorchOnly, kTorchOnlyNearest},
      {"optimizer.params.decoupled_weight_decay", K::kRefused, kNever, kTorchOnly,
       kTorchOnlyNearest},

      // ---- scheduler ------------------------------------------------------------------------
      {"scheduler.params.last_batch_iteration", K::kNoted, "-1",
       "Braid's schedules start at step 0 and a resumed run takes its step from the checkpoint",
       nullptr},
      {"scheduler.params.edge_value", K::kNoted, nullptr,
       "DeepSpeed's autotuner reads it; Braid's schedules do not", nullptr},
      {"scheduler.params.mid_value", K::kNoted, nullptr,
       "DeepSpeed's autotuner reads it; Braid's schedules do not", nullptr},

      // ---- fp16 / bf16 ----------------------------------------------------------------------
      {"fp16.fp16_master_weights_and_grads", K::kNoted, "false",
       "Braid keeps f32 master weights and gradients in the optimizer; remove it or set false",
       nullptr},
      {"fp16.auto_cast", K::kNoted, "false",
       "Braid casts the model's inputs itself under fp16; remove it or set false", nullptr},
      {"bf16.immediate_grad_update", K::kNoted, nullptr,
       "it schedules when DeepSpeed's bf16 optimizer copies gradients into f32; Braid up-casts "
       "them once at the step",
       nullptr},

      // ---- zero_optimization ----------------------------------------------------------------
      {"zero_optimization.cpu_offload", K::kMapped, nullptr,
       "read as zero_optimization.offload_optimizer.device \"cpu\" (its current spelling)",
       nullptr},
      {"zero_optimization.cpu_offload_param", K::kMapped, nullptr,
       "read as zero_optimization.offload_param.device \"cpu\" (its current spelling)", nullptr},
      {"zero_optimization.cpu_offload_use_pin_memory", K::kMapped, nullptr,
       "read as pin_memory of the offload sections (its current spelling)", nullptr},
      {"zero_optimization.sub_group_size", K::kNoted, nullptr,
       "it sizes DeepSpeed's groups of optimizer steps; Braid steps each shard at once", nullptr},
      {"zero_optimization.stage3_max_live_parameters", K::kNoted, nullptr,
       "it caps DeepSpeed's gathered parameters; Braid's stage 3 gathers per unit with "
       "stage3_prefetch_bucket_size",
       nullptr},
      {"zero_optimization.stage3_max_reuse_distance", K::kNoted, nullptr,
       "it tunes DeepSpeed's parameter cache; Braid releases a unit's parameters after use",
       nullptr},
      {"zero_optimization.stage3_model_persistence_threshold", K::kNoted, nullptr,
       "it caps DeepSpeed's persistent parameters over the model; Braid's persistence is per "
       "layer (stage3_param_persistence_threshold)",
       nullptr},
      {"zero_optimization.stage3_module_granularity_threshold", K::kNoted, nullptr,
       "it merges DeepSpeed's small modules into one fetch; Braid's stage 3 fetches per unit "
       "(block) already",
       nullptr},
      {"zero_optimization.stage3_use_all_reduce_for_fetch_params", K::kNoted, nullptr,
       "it picks the collective of DeepSpeed's parameter fetch; Braid all-gathers, same values",
       nullptr},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", K::kNoted, nullptr,
       "save_to writes the full (gathered) weights under every stage", nullptr},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save", K::kNoted, nullptr,
       "save_to writes the full (gathered) weights under every stage", nullptr},
      {"zero_optimization.use_multi_rank_bucket_allreduce", K::kNoted, nullptr,
       "it picks DeepSpeed's bucket collective; no effect on the result", nullptr},
      {"zero_optimization.round_robin_gradients", K::kNoted, nullptr,
       "it orders DeepSpeed's offloaded gradient copies; no effect on the result", nullptr},
      {"zero_optimization.ignore_unused_parameters", K::kNoted, nullptr,
       "Braid's models use all their parameters", nullptr},
      {"zero_optimization.elastic_checkpoint", K::kNoted, nullptr,
       "Braid's checkpoints are resharded on load whatever the world size", nullptr},
      {"zero_optimization.load_from_fp32_weights", K::kNoted, nullptr,
       "Braid's checkpoints always hold the f32 master weights", nullptr},
      {"zero_optimization.legacy_stage1", K::kNoted, nullptr,
       "it picks DeepSpeed's old stage-1 code; Braid has one", nullptr},
      {"zero_optimization.memory_efficient_linear", K::kNoted, nullptr,
       "it swaps DeepSpeed's linear layer under stage 3; Braid's layers are its own", nullptr},
      {"zero_optimization.pipeline_loading_checkpoint", K::kNoted, nullptr,
       "it tunes DeepSpeed's checkpoint loading under its pipeline engine", nullptr},
      {"zero_optimization.override_module_apply", K::kNoted, nullptr,
       "it patches PyTorch's Module.apply under DeepSpeed's stage 3", nullptr},
      {"zero_optimization.log_trace_cache_warnings", K::kNoted, nullptr,
       "DeepSpeed's stage-3 trace cache; Braid's stage 3 has none", nullptr},
      {"zero_optimization.grad_hooks", K::kNoted, nullptr,
       "Braid's ZeRO always reduces gradients as backward produces them", nullptr},
      {"zero_optimization.zero_quantized_weights", K::kRefused, kSwitchedOff,
       "ZeRO++'s quantized weight all-gather",
       "communication_data_type \"bf16\" halves what ZeRO communicates"},
      {"zero_optimization.zero_quantized_nontrainable_weights", K::kRefused, kSwitchedOff,
       "ZeRO++'s quantized frozen weights", "no equivalent; fp16 or bf16"},
      {"zero_optimization.zero_quantized_gradients", K::kRefused, kSwitchedOff,
       "ZeRO++'s quantized gradient reduce-scatter",
       "communication_data_type \"bf16\" halves what ZeRO communicates"},
      {"zero_optimization.zeropp_loco_param", K::kRefused, "null",
       "ZeRO++'s LoCo error-feedback quantization", "no equivalent"},
      {"zero_optimization.zero_hpz_partition_size", K::kRefused, kSwitchedOff,
       "ZeRO++'s hierarchical partitioning", kZeroWhole},
      {"zero_optimization.mics_shard_size", K::kRefused, kSwitchedOff, "MiCS sharding groups",
       kZeroWhole},
      {"zero_optimization.mics_hierarchical_params_gather", K::kRefused, kSwitchedOff,
       "MiCS's hierarchical all-gather", kZeroWhole},
      {"zero_optimization.offload_param.nvme_path", K::kNoted, nullptr, kNvmeOnly, nullptr},
      {"zero_optimization.offload_param.buffer_count", K::kNoted, nullptr, kNvmeOnly, nullptr},
      {"zero_optimization.offload_param.buffer_size", K::kNoted, nullptr, kNvmeOnly, nullptr},
      {"zero_optimization.offload_param.max_in_cpu", K::kNoted, nullptr, kNvmeOnly, nullptr},
      {"zero_optimization.offload_optimizer.nvme_path", K::kNoted, nullptr, kNvmeOnly, nullptr},
      {"zero_optimization.offload_optimizer.buffer_count", K::kNoted, nullptr, kNvmeOnly,
       nullptr},
      {"zero_optimization.offload_optimizer.pipeline_read", K::kNoted, nullptr, kNvmeOnly,
       nullptr},
      {"zero_optimization.offload_optimizer.pipeline_write", K::kNoted, nullptr, kNvmeOnly,
       nullptr},
      {"zero_optimization.offload_optimizer.fast_init", K::kNoted, nullptr, kNvmeOnly, nullptr},
      {"zero_optimization.offload_optimizer.ratio", K::kRefused, "1",
       "partial optimizer offload (ZeRO-Offload++'s Twin-Flow ratio)",
       "offload_optimizer device \"cpu\" offloads all of it, or \"none\""},

      // ---- checkpoint (DeepSpeed's keys inside Braid's checkpoint section) --------------------
      {"checkpoint.tag_validation", K::kNoted, nullptr,
       "Braid's checkpoints are named by step (step_<N>) and a checkpoint counts only once "
       "every rank has written it, so there is no tag to compare",
       nullptr},
      {"checkpoint.load_universal", K::kNoted, nullptr,
       "Braid's checkpoints are resharded on load whatever the world size; nothing to convert",
       nullptr},
      {"checkpoint.use_node_local_storage", K::kRefused, "false",
       "checkpoints on each node's local storage", "checkpoint.dir on storage all nodes share"},
      {"checkpoint.parallel_write", K::kNoted, nullptr,
       "every Braid rank writes its own shards in parallel already", nullptr, false,
       "pipeline_stage"},

      // ---- Sections of features Braid does not have ----------------------------------------
      {"sparse_attention", K::kRefused, kSwitchedOff, "block-sparse attention kernels",
       "Braid's attention is dense; a shorter model.block_size saves its memory", false,
       "mode block different_layout_per_head num_local_blocks num_global_blocks attention "
       "horizontal_global_attention num_different_global_patterns num_random_blocks "
       "local_window_blocks global_block_indices global_block_end_indices "
       "num_sliding_window_blocks"},
      {"flops_profiler", K::kRefused, kSwitchedOff, "the FLOPs profiler",
       "the progress line and the summary show the MFU from the model's FLOPs formula", true,
       "enabled recompute_fwd_factor profile_step module_depth top_modules detailed "
       "output_file"},
      {"autotuning", K::kRefused, kSwitchedOff, "the autotuner",
       "set the micro-batch and ZeRO stage yourself; tools/bench measures throughput", true,
       "enabled fast results_dir exps_dir overwrite metric metric_path start_profile_step "
       "end_profile_step tuner_type tuner_early_stopping tuner_num_trials arg_mappings "
       "max_train_batch_size min_train_batch_size max_train_micro_batch_size_per_gpu "
       "min_train_micro_batch_size_per_gpu num_tuning_micro_batch_sizes mp_size model_info "
       "model_info_path"},
      {"elasticity", K::kRefused, kSwitchedOff,
       "elastic training (batch sizes recomputed for a changing world size)",
       "the launcher's --nnodes=MIN:MAX and --max_restarts restart a group from its last "
       "checkpoint",
       true,
       "enabled max_train_batch_size micro_batch_sizes min_gpus max_gpus min_time version "
       "prefer_larger_batch ignore_non_elastic_batch_info num_gpus_per_node "
       "model_parallel_size"},
      {"compression_training", K::kRefused, kSwitchedOff,
       "model compression (quantization-aware training, pruning, layer reduction)",
       "no equivalent; fp16 or bf16 halve the parameters' memory"},
      {"data_efficiency", K::kRefused, kSwitchedOff,
       "data efficiency (curriculum sampling, random layer-token drop)",
       "data.sampler chooses how batches are drawn", true},
      {"curriculum_learning", K::kRefused, kSwitchedOff, "curriculum learning",
       "data.sampler chooses how batches are drawn", true,
       "enabled curriculum_type min_difficulty max_difficulty schedule_type schedule_config"},
      {"progressive_layer_drop", K::kRefused, kSwitchedOff, "progressive layer dropping",
       "no equivalent; activation_checkpointing trades compute for memory instead", true,
       "enabled theta gamma"},
      {"amp", K::kRefused, kSwitchedOff, "NVIDIA Apex AMP",
       "fp16 or bf16 (Braid's own mixed precision)", true},
      {"aio", K::kNoted, nullptr, kNvmeOnly, nullptr, false,
       "block_size queue_depth intra_op_parallelism thread_count single_submit overlap_events "
       "use_gds"},
      {"comms_logger", K::kRefused, kSwitchedOff, "the communication logger",
       "wall_clock_breakdown, and the summary's overlap line", true,
       "enabled verbose prof_all debug prof_ops"},
      {"pipeline", K::kRefused, kSwitchedOff, "the pipeline engine's section",
       "parallel { pipeline: N } with strategy \"pipeline\" (docs/CONFIG.md)", false,
       "stages partition seed_layers activation_checkpoint_interval pipe_partitioned "
       "grad_partitioned use_reentrant"},
      {"quantize_training", K::kRefused, kSwitchedOff, "quantization-aware training (MoQ)",
       "no equivalent; fp16 or bf16", true},
      {"eigenvalue", K::kRefused, kSwitchedOff, "the eigenvalue estimate of MoQ",
       "no equivalent", true,
       "enabled verbose max_iter tol stability gas_boundary_resolution layer_name layer_num"},
      {"nebula", K::kRefused, kSwitchedOff, "Nebula checkpointing",
       "checkpoint { async: true } writes in the background", true,
       "enabled persistent_storage_path persistent_time_interval num_of_version_in_retention "
       "enable_nebula_load load_path nebula_load_path"},
      {"hybrid_engine", K::kRefused, kSwitchedOff, "DeepSpeed-Chat's hybrid engine",
       "no equivalent", true,
       "enabled max_out_tokens inference_tp_size release_inference_cache pin_parameters "
       "tp_gather_partition_size"},
      {"weight_quantization", K::kRefused, kSwitchedOff, "weight quantization",
       "no equivalent; fp16 or bf16"},
      {"sequence_parallel_size", K::kRefused, kSwitchedOff, "Ulysses sequence parallelism",
       "parallel { tensor: N sequence_parallel: true } (Megatron's sequence parallelism)"},
      // DeepSpeed's monitors that send the metrics to a web service (tensorboard and csv_monitor
      // are Braid's fields): refused when enabled, as nothing here reaches the network.
      {"wandb", K::kRefused, kSwitchedOff, "Weights & Biases (wandb)",
       "csv_monitor or tensorboard, which write files", true, "enabled group team project"},
      {"comet", K::kRefused, kSwitchedOff, "Comet (comet)",
       "csv_monitor or tensorboard, which write files", true,
       "enabled samples_log_interval project workspace api_key experiment_name experiment_key "
       "online mode"},
      {"tensor_parallel", K::kRefused, kSwitchedOff, "AutoTP training (automatic tensor slicing)",
       "parallel { tensor: N } with the model's tensor-parallel plan"},
  };
  return table;
}

}  // namespace

const std::vector<DeepSpeedKey>& DeepSpeedKeys() { return Table(); }

const DeepSpeedKey* FindDeepSpeedKey(const std::string& path) {
  for (const DeepSpeedKey& k : Table()) {
    if (path == k.path) return &k;
  }
  return nullptr;
}

std::vector<std::string> DeepSpeedSectionKeys(const std::string& path) {
  const DeepSpeedKey* k = FindDeepSpeedKey(path);
  if (k == nullptr || k->children == nullptr) return {};
  return absl::StrSplit(k->children, ' ', absl::SkipEmpty());
}

}  // namespace braid::config
