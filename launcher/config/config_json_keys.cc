// The keys of a JSON config checked before protobuf reads it, so that one run reports every
// unknown key at once (protobuf's reader stops at the first), each with its position and the
// nearest known name; and DeepSpeed's keys that only tune DeepSpeed's own implementation,
// accepted with a note (TrainConfig.ignored_fields), or mapped onto Braid's (cpu_offload,
// steps_per_print).
#include <algorithm>
#include <cstdio>
#include <utility>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launcher/config/config_internal.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace braid::config::internal {
namespace {

namespace pb = google::protobuf;

// A DeepSpeed key with no field here. `neutral`: the only value accepted (a JSON literal,
// "true"/"false"), or null for any value; `why`: the note, or for a value other than the
// neutral one, what Braid does instead (the refusal).
struct DeepSpeedKey {
  const char* path;
  const char* neutral;
  const char* why;
};
constexpr DeepSpeedKey kDeepSpeedKeys[] = {
    {"prescale_gradients", nullptr,
     "Braid averages gradients in one reduction; where the division happens changes nothing "
     "in exact arithmetic"},
    {"gradient_predivide_factor", nullptr,
     "Braid averages gradients in one reduction; where the division happens changes nothing "
     "in exact arithmetic"},
    {"zero_allow_untested_optimizer", nullptr, "Braid's ZeRO steps any registered optimizer"},
    {"dump_state", nullptr, "Braid prints no engine state"},
    {"memory_breakdown", nullptr, "Braid's summary reports the peak memory"},
    {"zero_optimization.reduce_bucket_size", nullptr,
     "it sizes DeepSpeed's reduction buckets; Braid's ZeRO reduce-scatters one layer (block) at "
     "a time, and DDP's buckets are its bucket_cap_mb option"},
    {"zero_optimization.allgather_bucket_size", nullptr,
     "it sizes DeepSpeed's all-gather buckets; Braid's ZeRO all-gathers one layer (block) at a "
     "time"},
    {"zero_optimization.sub_group_size", nullptr,
     "it sizes DeepSpeed's groups of optimizer steps; Braid steps each shard at once"},
    {"zero_optimization.stage3_max_live_parameters", nullptr,
     "it caps DeepSpeed's gathered parameters; Braid's stage 3 gathers per unit with "
     "stage3_prefetch_bucket_size"},
    {"zero_optimization.stage3_max_reuse_distance", nullptr,
     "it tunes DeepSpeed's parameter cache; Braid releases a unit's parameters after use"},
    {"zero_optimization.round_robin_gradients", nullptr,
     "it orders DeepSpeed's offloaded gradient copies; no effect on the result"},
    {"zero_optimization.ignore_unused_parameters", nullptr,
     "Braid's models use all their parameters"},
    {"zero_optimization.elastic_checkpoint", nullptr,
     "Braid's checkpoints are resharded on load whatever the world size"},
    {"zero_optimization.load_from_fp32_weights", nullptr,
     "Braid's checkpoints always hold the f32 master weights"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", nullptr,
     "save_to writes the full (gathered) weights under every stage"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", nullptr,
     "save_to writes the full (gathered) weights under every stage"},
    {"fp16.fp16_master_weights_and_grads", "false",
     "Braid keeps f32 master weights and gradients in the optimizer; remove it or set false"},
    {"fp16.auto_cast", "false",
     "Braid casts the model's inputs itself under fp16; remove it or set false"},
};

const DeepSpeedKey* FindDeepSpeedKey(const std::string& path) {
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    if (path == k.path) return &k;
  }
  return nullptr;
}

// DeepSpeed's monitors that need a web service: the service's name, or null.
const char* NetworkMonitor(const std::string& path) {
  if (path == "wandb") return "Weights & Biases (wandb)";
  if (path == "comet") return "Comet (comet)";
  return nullptr;
}

// DeepSpeed's sections for features Braid does not have: refused, naming the feature and the
// nearest thing Braid has, unless the section says "enabled": false (then noted: DeepSpeed's
// configs often carry them switched off).
struct MissingFeature {
  const char* path;
  const char* feature;
  const char* nearest;
  bool off_unless_enabled = false;  // its "enabled" defaults to false in DeepSpeed
};
constexpr MissingFeature kMissingFeatures[] = {
    {"sparse_attention", "block-sparse attention kernels",
     "Braid's attention is dense; a shorter model.block_size saves its memory"},
    {"flops_profiler", "the FLOPs profiler",
     "the progress line and the summary show the MFU from the model's FLOPs formula", true},
    {"autotuning", "the autotuner",
     "set the micro-batch and ZeRO stage yourself; tools/bench measures throughput", true},
    {"elasticity", "elastic training (batch sizes recomputed for a changing world size)",
     "the launcher's --max_restarts restarts a failed group from its last checkpoint", true},
    {"compression_training", "model compression (quantization-aware training, pruning)",
     "no equivalent; fp16 or bf16 halve the parameters' memory"},
    {"data_efficiency", "data efficiency (curriculum sampling, random layer-token drop)",
     "data.sampler chooses how batches are drawn"},
    {"curriculum_learning", "curriculum learning", "data.sampler chooses how batches are drawn", true},
    {"progressive_layer_drop", "progressive layer dropping",
     "no equivalent; activation_checkpointing trades compute for memory instead", true},
    {"amp", "NVIDIA Apex AMP", "fp16 or bf16 (Braid's own mixed precision)", true},
    {"aio", "asynchronous NVMe I/O (for NVMe offload)",
     "offload_optimizer / offload_param with device \"cpu\""},
    {"comms_logger", "the communication logger",
     "wall_clock_breakdown, and the summary's overlap line", true},
    {"pipeline", "the pipeline engine's section",
     "parallel { pipeline: N } with strategy \"pipeline\" (docs/CONFIG.md)"},
    {"quantize_training", "quantization-aware training (MoQ)", "no equivalent; fp16 or bf16", true},
    {"eigenvalue", "the eigenvalue estimate of MoQ", "no equivalent", true},
    {"nebula", "Nebula checkpointing", "checkpoint { async: true } writes in the background", true},
    {"hybrid_engine", "DeepSpeed-Chat's hybrid engine", "no equivalent", true},
    {"weight_quantization", "weight quantization", "no equivalent; fp16 or bf16"},
    {"sequence_parallel_size", "Ulysses sequence parallelism",
     "parallel { tensor: N } with the tensor_parallel strategy's sequence_parallel option"},
    {"zero_optimization.zero_quantized_weights", "ZeRO++'s quantized weight all-gather",
     "communication_data_type \"bf16\" halves what ZeRO communicates"},
    {"zero_optimization.zero_quantized_gradients", "ZeRO++'s quantized gradient reduce-scatter",
     "communication_data_type \"bf16\" halves what ZeRO communicates"},
    {"zero_optimization.zero_hpz_partition_size", "ZeRO++'s hierarchical partitioning",
     "zero_optimization.stage 3 over all data-parallel ranks"},
    {"zero_optimization.mics_shard_size", "MiCS sharding groups",
     "zero_optimization.stage 3 over all data-parallel ranks"},
};

const MissingFeature* FindMissingFeature(const std::string& path) {
  for (const MissingFeature& f : kMissingFeatures) {
    if (path == f.path) return &f;
  }
  return nullptr;
}

// Whether a DeepSpeed value switches its feature off: "enabled": false (or no "enabled" where
// DeepSpeed's default is off), false, or a size of at most 1 (ZeRO++'s and MiCS's partition
// sizes: 1 is no partitioning, -1 DeepSpeed's "off").
bool SwitchedOff(const MissingFeature& m, const google::protobuf::Value& v) {
  namespace pb = google::protobuf;
  switch (v.kind_case()) {
    case pb::Value::kBoolValue:
      return !v.bool_value();
    case pb::Value::kNumberValue:
      return v.number_value() <= 1;
    case pb::Value::kStructValue: {
      auto it = v.struct_value().fields().find("enabled");
      if (it == v.struct_value().fields().end()) return m.off_unless_enabled;
      return it->second.kind_case() == pb::Value::kBoolValue && !it->second.bool_value();
    }
    default:
      return false;
  }
}

const pb::FieldDescriptor* FieldByKey(const pb::Descriptor* d, const std::string& key) {
  const pb::FieldDescriptor* f = d->FindFieldByName(key);
  for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
    if (d->field(i)->json_name() == key) f = d->field(i);
  }
  return f;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (absl::ascii_tolower(a[i - 1]) ==
                                             absl::ascii_tolower(b[j - 1])
                                         ? 0
                                         : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The known name nearest to `key` among `d`'s fields and DeepSpeed's keys under `prefix`, if
// it is close (a third of the name's letters or fewer changed).
std::string Nearest(const pb::Descriptor* d, const std::string& prefix, const std::string& key) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    const std::string path = k.path;
    if (path.compare(0, prefix.size(), prefix) == 0 &&
        path.find('.', prefix.size()) == std::string::npos) {
      names.push_back(path.substr(prefix.size()));
    }
  }
  std::string best;
  size_t best_distance = key.size() / 3 + 1;
  for (const std::string& n : names) {
    const size_t distance = EditDistance(key, n);
    if (distance < best_distance) best = n, best_distance = distance;
  }
  return best;
}

std::string Literal(const pb::Value& v) {
  switch (v.kind_case()) {
    case pb::Value::kBoolValue:
      return v.bool_value() ? "true" : "false";
    case pb::Value::kNullValue:
      return "null";
    default:
      return "";
  }
}

struct Walk {
  const std::string& text;
  const std::string& origin;
  JsonKeys* out;
  bool changed = false;

  void Object(pb::Struct* object, const pb::Descriptor* d, const std::string& prefix) {
    std::vector<std::string> remove;
    for (auto& [key, value] : *object->mutable_fields()) {
      const pb::FieldDescriptor* f = FieldByKey(d, key);
      const std::string path = absl::StrCat(prefix, f != nullptr ? f->name() : key);
      if (f != nullptr) {
        if (value.kind_case() == pb::Value::kStructValue && f->message_type() != nullptr &&
            !f->is_map()) {
          Object(value.mutable_struct_value(), f->message_type(), path + ".");
        }
        continue;
      }
      const std::string where = absl::StrCat(origin, KeyPosition(text, key), ": ");
      if (const char* service = NetworkMonitor(path)) {
        // DeepSpeed's monitors that send the metrics to a web service: refused when enabled
        // (nothing here reaches the network), accepted when off, as DeepSpeed's own defaults are.
        const pb::Value* enabled = nullptr;
        if (value.kind_case() == pb::Value::kStructValue) {
          auto it = value.struct_value().fields().find("enabled");
          if (it != value.struct_value().fields().end()) enabled = &it->second;
        }
        if (value.kind_case() != pb::Value::kStructValue ||
            (enabled != nullptr && Literal(*enabled) != "false")) {
          out->problems.push_back(absl::StrCat(
              where, path, ": Braid does not log to ", service,
              " (it sends the metrics over the network, which Braid's runs do not use); set "
              "\"enabled\": false, or use csv_monitor or tensorboard, which write files"));
        } else {
          out->ignored_fields.push_back(path + " (disabled)");
        }
        remove.push_back(key);
        continue;
      }
      if (const MissingFeature* m = FindMissingFeature(path)) {
        if (SwitchedOff(*m, value)) {
          out->ignored_fields.push_back(path + " (disabled)");
        } else {
          out->problems.push_back(absl::StrCat(where, path, ": a DeepSpeed feature Braid does not have (",
                                               m->feature, "); nearest in Braid: ", m->nearest,
                                               "; remove it or switch it off"));
        }
        remove.push_back(key);
        continue;
      }
      if (const DeepSpeedKey* k = FindDeepSpeedKey(path)) {
        if (k->neutral != nullptr && Literal(value) != k->neutral) {
          out->problems.push_back(
              absl::StrCat(where, path, " is accepted only as ", k->neutral, ": ", k->why));
        } else {
          out->ignored_fields.push_back(path);
        }
        remove.push_back(key);
        continue;
      }
      if (path == "zero_optimization.cpu_offload" || path == "steps_per_print") {
        remove.push_back(key);  // mapped by Map() below
        continue;
      }
      const std::string near = Nearest(d, prefix, key);
      out->problems.push_back(absl::StrCat(
          where, "unknown field \"", path, "\"",
          near.empty() ? "" : absl::StrCat(" (did you mean \"", prefix, near, "\"?)"),
          "; known fields", prefix.empty() ? "" : " of " + prefix.substr(0, prefix.size() - 1),
          ": ", absl::StrJoin(FieldNames(d), ", ")));
    }
    Map(object, prefix);
    for (const std::string& key : remove) object->mutable_fields()->erase(key);
    changed |= !remove.empty();
  }

  static std::vector<std::string> FieldNames(const pb::Descriptor* d) {
    std::vector<std::string> names;
    for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
    return names;
  }

  // DeepSpeed keys with a Braid field of the same meaning under another name.
  void Map(pb::Struct* object, const std::string& prefix) {
    auto& fields = *object->mutable_fields();
    // steps_per_print: DeepSpeed's progress interval is log.print_every (unless that is given).
    if (prefix.empty() && fields.count("steps_per_print")) {
      const pb::Value v = fields["steps_per_print"];
      pb::Value& log = fields["log"];
      if (log.kind_case() != pb::Value::kStructValue) log.mutable_struct_value();
      auto& log_fields = *log.mutable_struct_value()->mutable_fields();
      if (!log_fields.count("print_every") && !log_fields.count("printEvery")) {
        log_fields["print_every"] = v;
        out->ignored_fields.push_back("steps_per_print");
      } else {
        out->ignored_fields.push_back("steps_per_print (log.print_every given)");
      }
    }
    // zero_optimization.cpu_offload (DeepSpeed's legacy spelling): true is
    // offload_optimizer.device "cpu".
    if (prefix == "zero_optimization." && fields.count("cpu_offload")) {
      const pb::Value v = fields["cpu_offload"];
      if (v.kind_case() != pb::Value::kBoolValue) {
        out->problems.push_back(absl::StrCat(origin, KeyPosition(text, "cpu_offload"),
                                             ": zero_optimization.cpu_offload must be true or "
                                             "false"));
      } else if (v.bool_value()) {
        const bool has_offload = fields.count("offload_optimizer") > 0;
        if (has_offload) {
          out->problems.push_back(absl::StrCat(
              origin, KeyPosition(text, "cpu_offload"),
              ": zero_optimization.cpu_offload and zero_optimization.offload_optimizer are one "
              "setting (cpu_offload is its old spelling); keep offload_optimizer"));
        } else {
          (*fields["offload_optimizer"].mutable_struct_value()->mutable_fields())["device"]
              .set_string_value("cpu");
          out->ignored_fields.push_back("zero_optimization.cpu_offload");
        }
      } else {
        out->ignored_fields.push_back("zero_optimization.cpu_offload (false)");
      }
    }
  }
};

}  // namespace

std::string CheckJsonKeys(const std::string& text, const std::string& json,
                          const std::string& origin, JsonKeys* out) {
  pb::Value root;
  if (!google::protobuf::util::JsonStringToMessage(json, &root).ok() ||
      root.kind_case() != pb::Value::kStructValue) {
    return json;  // the reader reports what is wrong with it
  }
  out->read = true;
  Walk walk{text, origin, out};
  walk.Object(root.mutable_struct_value(), TrainConfig::descriptor(), "");
  // In the file's order (the JSON object's keys come unordered), those without a position last.
  auto position = [&](const std::string& problem) {
    int line = 1 << 30, column = 0;
    if (problem.compare(0, origin.size() + 1, origin + ":") == 0) {
      std::sscanf(problem.c_str() + origin.size(), ":%d:%d", &line, &column);
    }
    return std::make_pair(line, column);
  };
  std::stable_sort(out->problems.begin(), out->problems.end(),
                   [&](const std::string& a, const std::string& b) {
                     return position(a) < position(b);
                   });
  if (!walk.changed) return json;
  std::string rewritten;
  if (!google::protobuf::util::MessageToJsonString(root, &rewritten).ok()) return json;
  return rewritten;
}

std::string IgnoredFieldNote(const std::string& entry) {
  if (entry == "steps_per_print") return "steps_per_print: read as log.print_every";
  if (absl::StartsWith(entry, "scheduler.params.cycle_momentum (")) {
    const std::string type = entry.substr(33, entry.size() - 34);
    return absl::StrCat("scheduler.params.cycle_momentum: off, as in DeepSpeed: OneCycle cycles "
                        "the momentum of optimizers with betas (Adam, AdamW) only, and ",
                        type, " has none; the learning rate still cycles");
  }
  if (absl::EndsWith(entry, " (disabled)")) {  // wandb, comet, DeepSpeed's features Braid lacks
    return absl::StrCat(entry.substr(0, entry.find(' ')), ": not enabled, nothing to do");
  }
  if (entry == "zero_optimization.cpu_offload") {
    return "zero_optimization.cpu_offload: read as zero_optimization.offload_optimizer.device "
           "\"cpu\" (its current spelling)";
  }
  if (entry == "zero_optimization.offload_param (without offload_optimizer)") {
    return "zero_optimization.offload_param: the optimizer steps the offloaded shards on the "
           "host, so its state lives there too (as with offload_optimizer \"cpu\")";
  }
  if (entry == "activation_checkpointing.partition_activations") {
    return "activation_checkpointing.partition_activations: no effect without tensor parallelism "
           "(there is no tensor-parallel group to split the kept inputs over)";
  }
  if (entry == "activation_checkpointing.cpu_checkpointing") {
    return "activation_checkpointing.cpu_checkpointing: no effect on a CPU run (the kept inputs "
           "are in host memory already)";
  }
  if (entry == "activation_checkpointing.contiguous_memory_optimization") {
    return "activation_checkpointing.contiguous_memory_optimization: accepted, no effect in Braid "
           "(it copies DeepSpeed's kept inputs into one buffer against fragmentation; Braid's "
           "allocator reuses blocks by size)";
  }
  if (absl::EndsWith(entry, ".pin_memory")) {
    return absl::StrCat(entry, ": no effect on a CPU run (page-locked memory only speeds copies "
                               "between the host and a GPU)");
  }
  if (const DeepSpeedKey* k = FindDeepSpeedKey(entry)) {
    if (k->neutral != nullptr) return absl::StrCat(entry, ": ", k->neutral, ", Braid's behaviour");
    return absl::StrCat(entry, ": accepted, no effect in Braid (", k->why, ")");
  }
  return absl::StrCat(entry, ": accepted, no effect in Braid");
}

}  // namespace braid::config::internal
