// Every key of DeepSpeed's config reference is known: a Braid field of the same name
// (implemented), or an entry of deepspeed_keys.h, noted or refused by name; never an "unknown
// field". The reference list below is written independently of the table, from DeepSpeed's
// docs/_pages/config-json.md and the keys its runtime reads, so a key the table forgets fails
// here. Then the table itself is walked: each entry behaves as its kind says.
#include "launcher/config/deepspeed_keys.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/config/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::config {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

// DeepSpeed's keys, each with a value as DeepSpeed's docs show it.
const std::vector<std::pair<std::string, std::string>>& Reference() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      // Batch size
      {"train_batch_size", "32"},
      {"train_micro_batch_size_per_gpu", "8"},
      {"gradient_accumulation_steps", "4"},
      // Optimizer: DeepSpeed's Adam/AdamW/Lamb/1-bit and the torch.optim fallbacks' params
      {"optimizer.type", "\"Adam\""},
      {"optimizer.legacy_fusion", "false"},
      {"optimizer.params.lr", "0.001"},
      {"optimizer.params.betas", "[0.8, 0.999]"},
      {"optimizer.params.eps", "1e-8"},
      {"optimizer.params.weight_decay", "3e-7"},
      {"optimizer.params.bias_correction", "true"},
      {"optimizer.params.adam_w_mode", "true"},
      {"optimizer.params.torch_adam", "false"},
      {"optimizer.params.amsgrad", "false"},
      {"optimizer.params.set_grad_none", "true"},
      {"optimizer.params.fp32_optimizer_states", "true"},
      {"optimizer.params.max_coeff", "0.3"},
      {"optimizer.params.min_coeff", "0.01"},
      {"optimizer.params.eps_inside_sqrt", "false"},
      {"optimizer.params.max_grad_norm", "0"},
      {"optimizer.params.momentum", "0.9"},
      {"optimizer.params.dampening", "0"},
      {"optimizer.params.nesterov", "false"},
      {"optimizer.params.maximize", "false"},
      {"optimizer.params.foreach", "false"},
      {"optimizer.params.fused", "false"},
      {"optimizer.params.capturable", "false"},
      {"optimizer.params.differentiable", "false"},
      {"optimizer.params.freeze_step", "400"},
      {"optimizer.params.cuda_aware", "false"},
      {"optimizer.params.comm_backend_name", "\"nccl\""},
      {"optimizer.params.var_freeze_step", "1000"},
      {"optimizer.params.var_update_scaler", "16"},
      {"optimizer.params.local_step_scaler", "1000"},
      {"optimizer.params.local_step_clipper", "16"},
      {"optimizer.params.coeff_beta", "0.9"},
      {"optimizer.params.factor_max", "4.0"},
      {"optimizer.params.factor_min", "0.5"},
      {"optimizer.params.factor_threshold", "0.1"},
      {"optimizer.params.lr_decay", "0"},
      {"optimizer.params.initial_accumulator_value", "0"},
      {"optimizer.params.alpha", "0.99"},
      {"optimizer.params.centered", "false"},
      {"optimizer.params.rho", "0.9"},
      {"optimizer.params.momentum_decay", "0.004"},
      {"optimizer.params.decoupled_weight_decay", "false"},
      // Scheduler: the params of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest
      {"scheduler.type", "\"WarmupLR\""},
      {"scheduler.params.warmup_min_lr", "0"},
      {"scheduler.params.warmup_max_lr", "0.001"},
      {"scheduler.params.warmup_num_steps", "1000"},
      {"scheduler.params.warmup_type", "\"log\""},
      {"scheduler.params.total_num_steps", "10000"},
      {"scheduler.params.warmup_min_ratio", "0"},
      {"scheduler.params.cos_min_ratio", "0.0001"},
      {"scheduler.params.last_batch_iteration", "-1"},
      {"scheduler.params.cycle_min_lr", "0.0001"},
      {"scheduler.params.cycle_max_lr", "0.001"},
      {"scheduler.params.decay_lr_rate", "0"},
      {"scheduler.params.cycle_first_step_size", "2000"},
      {"scheduler.params.cycle_second_step_size", "2000"},
      {"scheduler.params.cycle_first_stair_count", "0"},
      {"scheduler.params.cycle_second_stair_count", "0"},
      {"scheduler.params.decay_step_size", "0"},
      {"scheduler.params.cycle_momentum", "true"},
      {"scheduler.params.cycle_min_mom", "0.8"},
      {"scheduler.params.cycle_max_mom", "0.9"},
      {"scheduler.params.decay_mom_rate", "0"},
      {"scheduler.params.lr_range_test_min_lr", "0.001"},
      {"scheduler.params.lr_range_test_step_size", "2000"},
      {"scheduler.params.lr_range_test_step_rate", "1.0"},
      {"scheduler.params.lr_range_test_staircase", "false"},
      {"scheduler.params.edge_value", "0.5"},
      {"scheduler.params.mid_value", "0.5"},
      // Communication
      {"communication_data_type", "\"fp32\""},
      {"seq_parallel_comm_data_type", "\"fp32\""},
      {"prescale_gradients", "false"},
      {"gradient_predivide_factor", "1.0"},
      {"sparse_gradients", "false"},
      {"disable_allgather", "false"},
      // fp16, bf16, amp
      {"fp16.enabled", "true"},
      {"fp16.auto_cast", "false"},
      {"fp16.loss_scale", "0"},
      {"fp16.initial_scale_power", "16"},
      {"fp16.loss_scale_window", "1000"},
      {"fp16.hysteresis", "2"},
      {"fp16.consecutive_hysteresis", "false"},
      {"fp16.min_loss_scale", "1"},
      {"fp16.fp16_master_weights_and_grads", "false"},
      {"bf16.enabled", "true"},
      {"bf16.immediate_grad_update", "false"},
      {"bfloat16.enabled", "true"},
      {"amp.enabled", "false"},
      {"amp.opt_level", "\"O1\""},
      {"gradient_clipping", "1.0"},
      // ZeRO
      {"zero_optimization.stage", "2"},
      {"zero_optimization.allgather_partitions", "true"},
      {"zero_optimization.allgather_bucket_size", "5e8"},
      {"zero_optimization.overlap_comm", "false"},
      {"zero_optimization.reduce_scatter", "true"},
      {"zero_optimization.reduce_bucket_size", "5e8"},
      {"zero_optimization.contiguous_gradients", "true"},
      {"zero_optimization.load_from_fp32_weights", "true"},
      {"zero_optimization.grad_hooks", "true"},
      {"zero_optimization.round_robin_gradients", "false"},
      {"zero_optimization.offload_param.device", "\"cpu\""},
      {"zero_optimization.offload_param.nvme_path", "\"/local_nvme\""},
      {"zero_optimization.offload_param.pin_memory", "true"},
      {"zero_optimization.offload_param.buffer_count", "5"},
      {"zero_optimization.offload_param.buffer_size", "1e8"},
      {"zero_optimization.offload_param.max_in_cpu", "1e9"},
      {"zero_optimization.offload_optimizer.device", "\"cpu\""},
      {"zero_optimization.offload_optimizer.nvme_path", "\"/local_nvme\""},
      {"zero_optimization.offload_optimizer.pin_memory", "true"},
      {"zero_optimization.offload_optimizer.ratio", "1.0"},
      {"zero_optimization.offload_optimizer.buffer_count", "4"},
      {"zero_optimization.offload_optimizer.fast_init", "false"},
      {"zero_optimization.offload_optimizer.pipeline_read", "false"},
      {"zero_optimization.offload_optimizer.pipeline_write", "false"},
      {"zero_optimization.stage3_max_live_parameters", "1e9"},
      {"zero_optimization.stage3_max_reuse_distance", "1e9"},
      {"zero_optimization.stage3_prefetch_bucket_size", "5e8"},
      {"zero_optimization.stage3_param_persistence_threshold", "1e6"},
      {"zero_optimization.stage3_model_persistence_threshold", "1e9"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", "true"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save", "true"},
      {"zero_optimization.stage3_module_granularity_threshold", "0"},
      {"zero_optimization.stage3_use_all_reduce_for_fetch_params", "false"},
      {"zero_optimization.sub_group_size", "1e12"},
      {"zero_optimization.elastic_checkpoint", "false"},
      {"zero_optimization.ignore_unused_parameters", "true"},
      {"zero_optimization.legacy_stage1", "false"},
      {"zero_optimization.use_multi_rank_bucket_allreduce", "true"},
      {"zero_optimization.zero_hpz_partition_size", "1"},
      {"zero_optimization.zero_quantized_weights", "false"},
      {"zero_optimization.zero_quantized_nontrainable_weights", "false"},
      {"zero_optimization.zero_quantized_gradients", "false"},
      {"zero_optimization.zeropp_loco_param", "null"},
      {"zero_optimization.mics_shard_size", "-1"},
      {"zero_optimization.mics_hierarchical_params_gather", "false"},
      {"zero_optimization.memory_efficient_linear", "true"},
      {"zero_optimization.pipeline_loading_checkpoint", "false"},
      {"zero_optimization.override_module_apply", "true"},
      {"zero_optimization.log_trace_cache_warnings", "false"},
      {"zero_optimization.cpu_offload", "true"},
      {"zero_optimization.cpu_offload_param", "true"},
      {"zero_optimization.cpu_offload_use_pin_memory", "true"},
      {"zero_allow_untested_optimizer", "true"},
      {"zero_force_ds_cpu_optimizer", "false"},
      // Asynchronous I/O
      {"aio.block_size", "1048576"},
      {"aio.queue_depth", "8"},
      {"aio.thread_count", "1"},
      {"aio.intra_op_parallelism", "1"},
      {"aio.single_submit", "false"},
      {"aio.overlap_events", "true"},
      {"aio.use_gds", "false"},
      // Logging
      {"steps_per_print", "10"},
      {"wall_clock_breakdown", "false"},
      {"dump_state", "false"},
      {"memory_breakdown", "false"},
      {"timers.throughput.enabled", "true"},
      {"timers.throughput.synchronized", "true"},
      // Autotuning (off unless enabled)
      {"autotuning.enabled", "false"},
      {"autotuning.results_dir", "\"autotuning_results\""},
      {"autotuning.exps_dir", "\"autotuning_exps\""},
      {"autotuning.overwrite", "false"},
      {"autotuning.metric", "\"throughput\""},
      {"autotuning.start_profile_step", "3"},
      {"autotuning.end_profile_step", "5"},
      {"autotuning.fast", "true"},
      {"autotuning.max_train_batch_size", "null"},
      {"autotuning.mp_size", "1"},
      {"autotuning.num_tuning_micro_batch_sizes", "3"},
      {"autotuning.tuner_type", "\"model_based\""},
      {"autotuning.tuner_early_stopping", "5"},
      {"autotuning.tuner_num_trials", "50"},
      {"autotuning.arg_mappings", "null"},
      // Flops profiler
      {"flops_profiler.enabled", "false"},
      {"flops_profiler.recompute_fwd_factor", "0.0"},
      {"flops_profiler.profile_step", "1"},
      {"flops_profiler.module_depth", "-1"},
      {"flops_profiler.top_modules", "1"},
      {"flops_profiler.detailed", "true"},
      {"flops_profiler.output_file", "null"},
      // Activation checkpointing
      {"activation_checkpointing.partition_activations", "false"},
      {"activation_checkpointing.cpu_checkpointing", "false"},
      {"activation_checkpointing.contiguous_memory_optimization", "false"},
      {"activation_checkpointing.number_checkpoints", "4"},
      {"activation_checkpointing.synchronize_checkpoint_boundary", "false"},
      {"activation_checkpointing.profile", "false"},
      // Sparse attention (refused: the section is named)
      {"sparse_attention.mode", "\"fixed\""},
      {"sparse_attention.block", "16"},
      {"sparse_attention.different_layout_per_head", "true"},
      {"sparse_attention.num_local_blocks", "4"},
      {"sparse_attention.num_global_blocks", "1"},
      {"sparse_attention.attention", "\"bidirectional\""},
      {"sparse_attention.horizontal_global_attention", "false"},
      {"sparse_attention.num_different_global_patterns", "4"},
      {"sparse_attention.num_random_blocks", "0"},
      {"sparse_attention.local_window_blocks", "[4]"},
      {"sparse_attention.global_block_indices", "[0]"},
      {"sparse_attention.global_block_end_indices", "null"},
      {"sparse_attention.num_sliding_window_blocks", "3"},
      // Data efficiency and curriculum learning
      {"data_efficiency.enabled", "true"},
      {"data_efficiency.seed", "1234"},
      {"data_efficiency.data_routing.random_ltd.enabled", "true"},
      {"data_efficiency.data_sampling.curriculum_learning.enabled", "true"},
      {"curriculum_learning.enabled", "false"},
      {"curriculum_learning.curriculum_type", "\"seqlen\""},
      {"curriculum_learning.min_difficulty", "8"},
      {"curriculum_learning.max_difficulty", "1024"},
      {"curriculum_learning.schedule_type", "\"fixed_linear\""},
      {"curriculum_learning.schedule_config", "{\"total_curriculum_step\": 40000}"},
      // Monitors
      {"tensorboard.enabled", "true"},
      {"tensorboard.output_path", "\"output/ds_logs/\""},
      {"tensorboard.job_name", "\"train_bert\""},
      {"csv_monitor.enabled", "true"},
      {"csv_monitor.output_path", "\"output/ds_logs/\""},
      {"csv_monitor.job_name", "\"train_bert\""},
      {"wandb.enabled", "true"},
      {"wandb.group", "\"my_group\""},
      {"wandb.team", "\"my_team\""},
      {"wandb.project", "\"my_project\""},
      {"comet.enabled", "true"},
      {"comet.workspace", "\"my_workspace\""},
      {"comet.project", "\"my_project\""},
      {"comet.samples_log_interval", "50"},
      {"comet.experiment_name", "\"llama-fine-tuning\""},
      {"comet.experiment_key", "\"0c4a1c4a\""},
      {"comet.online", "false"},
      {"comet.mode", "\"get\""},
      {"comet.api_key", "\"k\""},
      // Elasticity
      {"elasticity.enabled", "true"},
      {"elasticity.max_train_batch_size", "2000"},
      {"elasticity.micro_batch_sizes", "[2, 4, 6]"},
      {"elasticity.min_gpus", "1"},
      {"elasticity.max_gpus", "10000"},
      {"elasticity.min_time", "20"},
      {"elasticity.version", "0.2"},
      {"elasticity.prefer_larger_batch", "true"},
      {"elasticity.ignore_non_elastic_batch_info", "false"},
      {"elasticity.num_gpus_per_node", "8"},
      {"elasticity.model_parallel_size", "1"},
      // Communication logging
      {"comms_logger.enabled", "true"},
      {"comms_logger.verbose", "false"},
      {"comms_logger.prof_all", "true"},
      {"comms_logger.debug", "false"},
      {"comms_logger.prof_ops", "[\"all_reduce\"]"},
      // Compression
      {"compression_training.weight_quantization.shared_parameters.enabled", "true"},
      {"compression_training.sparse_pruning.shared_parameters.enabled", "true"},
      {"compression_training.layer_reduction.enabled", "true"},
      // Checkpoint
      {"checkpoint.tag_validation", "\"Warn\""},
      {"checkpoint.load_universal", "false"},
      {"checkpoint.use_node_local_storage", "false"},
      {"checkpoint.parallel_write.pipeline_stage", "false"},
      // Data types
      {"data_types.grad_accum_dtype", "\"fp32\""},
      // Others DeepSpeed's runtime reads
      {"dataloader_drop_last", "false"},
      {"use_data_before_expert_parallelism", "false"},
      {"graph_harvesting", "false"},
      {"seed", "1234"},
      {"progressive_layer_drop.enabled", "true"},
      {"progressive_layer_drop.theta", "0.5"},
      {"progressive_layer_drop.gamma", "0.001"},
      {"eigenvalue.enabled", "true"},
      {"eigenvalue.verbose", "false"},
      {"eigenvalue.max_iter", "100"},
      {"eigenvalue.tol", "0.01"},
      {"eigenvalue.stability", "1e-6"},
      {"eigenvalue.gas_boundary_resolution", "1"},
      {"eigenvalue.layer_name", "\"bert.encoder.layer\""},
      {"eigenvalue.layer_num", "0"},
      {"quantize_training.enabled", "true"},
      {"pipeline.stages", "\"auto\""},
      {"pipeline.partition", "\"best\""},
      {"pipeline.seed_layers", "false"},
      {"pipeline.activation_checkpoint_interval", "0"},
      {"pipeline.pipe_partitioned", "true"},
      {"pipeline.grad_partitioned", "true"},
      {"nebula.enabled", "true"},
      {"nebula.persistent_storage_path", "\"/p\""},
      {"nebula.persistent_time_interval", "100"},
      {"nebula.num_of_version_in_retention", "2"},
      {"nebula.enable_nebula_load", "true"},
      {"nebula.load_path", "\"/p\""},
      {"hybrid_engine.enabled", "true"},
      {"hybrid_engine.max_out_tokens", "512"},
      {"hybrid_engine.inference_tp_size", "1"},
      {"hybrid_engine.release_inference_cache", "false"},
      {"hybrid_engine.pin_parameters", "true"},
      {"hybrid_engine.tp_gather_partition_size", "8"},
      {"weight_quantization.quantized_initialization", "{}"},
      {"sequence_parallel_size", "2"},
      {"tensor_parallel.autotp_size", "2"},
  };
  return keys;
}

// {"a": {"b": value}} for path "a.b".
std::string Nest(const std::string& path, const std::string& value) {
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  std::string json = value;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    json = absl::StrCat("{\"", *it, "\": ", json, "}");
  }
  return json;
}

// Whether `path` names a TrainConfig field, through its messages.
bool IsBraidField(const std::string& path) {
  const google::protobuf::Descriptor* d = TrainConfig::descriptor();
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (d == nullptr) return false;
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(std::string(part));
    if (f == nullptr) return false;
    d = f->message_type();
  }
  return true;
}

// The table entry the reader meets first on the way to `path` (the key itself, or the DeepSpeed
// section holding it), or null.
const DeepSpeedKey* EntryFor(const std::string& path) {
  for (size_t dot = path.find('.'); ; dot = path.find('.', dot + 1)) {
    if (const DeepSpeedKey* k = FindDeepSpeedKey(path.substr(0, dot))) return k;
    if (dot == std::string::npos) return nullptr;
  }
}

TEST(DeepSpeedReference, EveryKeyIsAFieldOrInTheTableAndNeverUnknown) {
  ASSERT_GT(Reference().size(), 250u);
  int fields = 0, noted = 0, refused = 0;  // noted: accepted without a field (noted or off)
  for (const auto& [path, value] : Reference()) {
    SCOPED_TRACE(path);
    const DeepSpeedKey* entry = EntryFor(path);
    EXPECT_TRUE(IsBraidField(path) || entry != nullptr) << "neither a field nor in the table";
    absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(Nest(path, value), "ds.json");
    if (cfg.ok()) {
      (IsBraidField(path) ? fields : noted)++;
      if (entry != nullptr) {
        // Accepted: noted once, under its own path or its section's.
        EXPECT_THAT(ConfigNotes(*cfg), Contains(HasSubstr(absl::StrCat(entry->path, ":"))));
      }
      continue;
    }
    ++refused;
    const std::string message(cfg.status().message());
    EXPECT_THAT(message, Not(HasSubstr("unknown field")));
    ASSERT_NE(entry, nullptr) << message;
    // Refused by name: the key (or its section), the feature, and what Braid has instead.
    EXPECT_THAT(message, AllOf(HasSubstr(absl::StrCat("ds.json:1:")), HasSubstr(entry->path),
                               HasSubstr(entry->note)));
    if (entry->nearest != nullptr) {
      EXPECT_THAT(message, HasSubstr(entry->nearest));
    }
  }
  // Each kind occurs (the loop above cannot pass by skipping everything).
  EXPECT_GE(fields, 80);
  EXPECT_GE(noted, 150);
  EXPECT_GE(refused, 50);
}

bool HasEnabledKey(const DeepSpeedKey& k) {
  return k.children != nullptr && absl::StrContains(absl::StrCat(" ", k.children, " "), " enabled ");
}

// A value for `k` that it does not accept (its feature switched on).
std::string OnValue(const DeepSpeedKey& k) {
  if (k.accepted == std::string(kNever)) return "1";
  if (k.accepted == std::string(kSwitchedOff)) {
    if (HasEnabledKey(k)) return "{\"enabled\": true}";
    if (k.children != nullptr) return absl::StrCat("{\"", DeepSpeedSectionKeys(k.path)[0], "\": 2}");
    return "true";
  }
  if (std::string(k.accepted) == "false") return "true";
  return "7";  // for -1, 1, null
}

// A value for `k` that switches its feature off.
std::string OffValue(const DeepSpeedKey& k) {
  if (k.accepted != std::string(kSwitchedOff)) return k.accepted;
  if (HasEnabledKey(k)) return "{\"enabled\": false}";
  return k.children != nullptr ? "{}" : "false";
}

TEST(DeepSpeedTable, EachEntryBehavesAsItsKindSays) {
  ASSERT_GT(DeepSpeedKeys().size(), 100u);
  for (const DeepSpeedKey& k : DeepSpeedKeys()) {
    SCOPED_TRACE(k.path);
    EXPECT_FALSE(IsBraidField(k.path)) << "a Braid field needs no entry";
    ASSERT_NE(k.note, nullptr);
    const std::string path = k.path;
    if (k.kind == DeepSpeedKeyKind::kMapped) continue;  // each tested below
    // A section inside a DeepSpeed section (timers.throughput) only lists its keys: the
    // section test below covers it.
    if (path.find('.') != std::string::npos &&
        FindDeepSpeedKey(path.substr(0, path.rfind('.'))) != nullptr) {
      continue;
    }
    if (k.kind == DeepSpeedKeyKind::kNoted) {
      const std::string ok_value = k.accepted != nullptr   ? k.accepted
                                   : k.children != nullptr ? "{}"
                                                           : "1";
      absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(Nest(path, ok_value), "ds.json");
      ASSERT_TRUE(cfg.ok()) << cfg.status();
      EXPECT_THAT(ConfigNotes(*cfg), Contains(AllOf(HasSubstr(path + ": "))));
      if (k.accepted == nullptr) {
        EXPECT_THAT(ConfigNotes(*cfg),
                    Contains(absl::StrCat(path, ": accepted, no effect in Braid (", k.note, ")")));
      } else {
        absl::StatusOr<TrainConfig> other = ParseJsonConfig(Nest(path, "\"other\""), "ds.json");
        ASSERT_FALSE(other.ok());
        EXPECT_THAT(std::string(other.status().message()),
                    AllOf(HasSubstr(absl::StrCat(path, " is accepted only as ", k.accepted)),
                          HasSubstr(k.note)));
      }
      continue;
    }
    // Refused: switched on, named with the feature and the nearest; switched off, noted.
    ASSERT_NE(k.nearest, nullptr);
    absl::StatusOr<TrainConfig> on = ParseJsonConfig(Nest(path, OnValue(k)), "ds.json");
    ASSERT_FALSE(on.ok()) << OnValue(k);
    EXPECT_THAT(std::string(on.status().message()),
                AllOf(HasSubstr(path + ": "), HasSubstr(k.note), HasSubstr(k.nearest),
                      Not(HasSubstr("unknown field"))));
    if (k.accepted != std::string(kNever)) {
      absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(Nest(path, OffValue(k)), "ds.json");
      ASSERT_TRUE(cfg.ok()) << cfg.status();
      EXPECT_THAT(ConfigNotes(*cfg), Contains(path + ": not enabled, nothing to do"));
    }
  }
}

TEST(DeepSpeedTable, SectionKeysAreCheckedAndTyposGetDidYouMean) {
  int sections = 0;
  for (const DeepSpeedKey& k : DeepSpeedKeys()) {
    if (k.children == nullptr) continue;
    ++sections;
    SCOPED_TRACE(k.path);
    const std::vector<std::string> keys = DeepSpeedSectionKeys(k.path);
    ASSERT_FALSE(keys.empty());
    // Every listed key inside the section is known (a refused section switched off loads).
    std::vector<std::string> members;
    for (const std::string& key : keys) {
      if (key == "enabled") continue;
      // data_types.grad_accum_dtype is read (a dtype's name; validation checks it), not skipped.
      const bool dtype = absl::StrCat(k.path, ".", key) == "data_types.grad_accum_dtype";
      members.push_back(absl::StrCat("\"", key, "\": ",
                                     dtype ? "\"fp32\""
                                     : DeepSpeedSectionKeys(absl::StrCat(k.path, ".", key)).empty()
                                         ? "1"
                                         : "{}"));
    }
    if (HasEnabledKey(k)) members.push_back("\"enabled\": false");
    const std::string body = absl::StrCat("{", absl::StrJoin(members, ", "), "}");
    absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(Nest(k.path, body), "ds.json");
    if (k.kind == DeepSpeedKeyKind::kRefused && !HasEnabledKey(k)) {
      // A section without "enabled" (pipeline, sparse_attention) is on whenever it has content.
      ASSERT_FALSE(cfg.ok());
      EXPECT_THAT(std::string(cfg.status().message()), Not(HasSubstr("unknown field")));
    } else {
      ASSERT_TRUE(cfg.ok()) << cfg.status();
    }
    // A misspelt key of the section: unknown, with the right name suggested.
    const std::string typo = keys.back() + "x";
    absl::StatusOr<TrainConfig> bad =
        ParseJsonConfig(Nest(k.path, absl::StrCat("{\"", typo, "\": 1}")), "ds.json");
    ASSERT_FALSE(bad.ok());
    EXPECT_THAT(std::string(bad.status().message()),
                AllOf(HasSubstr(absl::StrCat("unknown field \"", k.path, ".", typo, "\"")),
                      HasSubstr(absl::StrCat("did you mean \"", k.path, ".", keys.back(), "\"?"))));
  }
  EXPECT_GT(sections, 15);
}

TEST(DeepSpeedTable, TyposOfDeepSpeedKeysGetDidYouMeanAndAllProblemsComeAtOnce) {
  absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(R"({
  "zero_optimization": {
    "stage3_max_live_parameter": 1e9
  },
  "checkpoint": {"tag_validaton": "Warn"},
  "optimizer": {"type": "Adam", "params": {"freez_step": 3, "maximize": true}},
  "scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 5}},
  "sparse_gradients": true
})",
                                                    "ds.json");
  ASSERT_FALSE(cfg.ok());
  const std::string message(cfg.status().message());
  EXPECT_THAT(
      message,
      AllOf(HasSubstr("6 problems in ds.json"),
            HasSubstr("ds.json:3:5: unknown field \"zero_optimization.stage3_max_live_parameter\" "
                      "(did you mean \"zero_optimization.stage3_max_live_parameters\"?)"),
            HasSubstr("ds.json:5:18: unknown field \"checkpoint.tag_validaton\" (did you mean "
                      "\"checkpoint.tag_validation\"?)"),
            HasSubstr("unknown field \"optimizer.params.freez_step\" (did you mean "
                      "\"optimizer.params.freeze_step\"?)"),
            HasSubstr("optimizer.params.maximize: a DeepSpeed feature Braid does not have "
                      "(gradient ascent (maximize)); nearest in Braid: minimise the negated "
                      "loss; remove it or set it to false"),
            HasSubstr("ds.json:7:48: scheduler.params.last_batch_iteration is accepted only as -1"),
            HasSubstr("ds.json:8:3: sparse_gradients: a DeepSpeed feature Braid does not have")));
}

TEST(DeepSpeedTable, LegacySpellingsAreReadAsBraidsFields) {
  absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(R"({
    "bfloat16": {"enabled": true},
    "zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true,
                          "cpu_offload_use_pin_memory": true}
  })",
                                                    "ds.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(cfg->bf16().enabled());
  EXPECT_EQ(cfg->zero_optimization().offload_optimizer().device(), "cpu");
  EXPECT_EQ(cfg->zero_optimization().offload_param().device(), "cpu");
  EXPECT_TRUE(cfg->zero_optimization().offload_optimizer().pin_memory());
  EXPECT_TRUE(cfg->zero_optimization().offload_param().pin_memory());
  EXPECT_THAT(ConfigNotes(*cfg),
              testing::IsSupersetOf({"bfloat16: read as bf16 (its old spelling)",
                                     "zero_optimization.cpu_offload_param: read as "
                                     "zero_optimization.offload_param.device \"cpu\" (its "
                                     "current spelling)"}));
  // Both spellings at once are one setting given twice.
  cfg = ParseJsonConfig(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})",
                        "ds.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()),
              HasSubstr("bfloat16 and bf16 are one section (bfloat16 is its old spelling); keep "
                        "bf16"));
}

TEST(DeepSpeedTable, DeepSpeedsCheckpointSectionAloneAsksForNoCheckpoints) {
  absl::StatusOr<TrainConfig> cfg = ParseJsonConfig(
      R"({"checkpoint": {"tag_validation": "Fail", "parallel_write": {"pipeline_stage": true}}})",
      "ds.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_FALSE(cfg->has_checkpoint());
  EXPECT_THAT(ConfigNotes(*cfg), Contains(HasSubstr("checkpoint: DeepSpeed's checkpoint options "
                                                    "only, so no Braid checkpointing")));
  // Beside Braid's own keys the section stays.
  cfg = ParseJsonConfig(R"({"checkpoint": {"dir": "runs/ckpt", "load_universal": true}})",
                        "ds.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->checkpoint().dir(), "runs/ckpt");
  EXPECT_THAT(ConfigNotes(*cfg), Contains(HasSubstr("checkpoint.load_universal: accepted")));
  // Node-local storage would need what Braid does not do.
  cfg = ParseJsonConfig(R"({"checkpoint": {"dir": "c", "use_node_local_storage": true}})",
                        "ds.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(std::string(cfg.status().message()),
              HasSubstr("checkpoint.use_node_local_storage: a DeepSpeed feature Braid does not "
                        "have (checkpoints on each node's local storage); nearest in Braid: "
                        "checkpoint.dir on storage all nodes share"));
}

}  // namespace
}  // namespace braid::config
