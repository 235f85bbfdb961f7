// The keys of a JSON config checked before protobuf reads it, so that one run reports every
// unknown key at once (protobuf's reader stops at the first), each with its position and the
// nearest known name; and DeepSpeed's keys without a Braid field (deepspeed_keys.h): noted
// (TrainConfig.ignored_fields), refused naming the feature, or mapped onto Braid's fields
// (steps_per_print, cpu_offload, bfloat16, ...).
#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>
#include <cstring>
#include <utility>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/edit_distance.h"
#include "launcher/config/config_internal.h"
#include "launcher/config/deepspeed_keys.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace braid::config::internal {
namespace {

using ::braid::config::DeepSpeedKey;
using ::braid::config::DeepSpeedKeyKind;

namespace pb = google::protobuf;

// Whether `v` is a value `k` (a kRefused key) accepts: kNever none; kSwitchedOff what switches
// DeepSpeed's feature off: false, null, a number of at most 1 (ZeRO++'s and MiCS's partition
// sizes: 1 is no partitioning, -1 DeepSpeed's "off"), an empty section, or a section whose
// "enabled" is false (or absent where DeepSpeed's default is off); otherwise its literal.
std::string Literal(const pb::Value& v);
bool Accepted(const DeepSpeedKey& k, const pb::Value& v) {
  if (k.accepted == nullptr) return true;
  if (k.accepted == std::string(kNever)) return false;
  if (k.accepted != std::string(kSwitchedOff)) return Literal(v) == k.accepted;
  switch (v.kind_case()) {
    case pb::Value::kNullValue:
      return true;
    case pb::Value::kBoolValue:
      return !v.bool_value();
    case pb::Value::kNumberValue:
      return v.number_value() <= 1;
    case pb::Value::kStructValue: {
      if (v.struct_value().fields().empty()) return true;
      auto it = v.struct_value().fields().find("enabled");
      if (it == v.struct_value().fields().end()) return k.off_unless_enabled;
      return it->second.kind_case() == pb::Value::kBoolValue && !it->second.bool_value();
    }
    default:
      return false;
  }
}

bool IsNetworkMonitor(const std::string& path) { return path == "wandb" || path == "comet"; }

const pb::FieldDescriptor* FieldByKey(const pb::Descriptor* d, const std::string& key) {
  const pb::FieldDescriptor* f = d->FindFieldByName(key);
  for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
    if (d->field(i)->json_name() == key) f = d->field(i);
  }
  return f;
}

// The names known under `prefix`: `d`'s fields (when `d` is a message) and DeepSpeed's keys.
std::vector<std::string> KnownNames(const pb::Descriptor* d, const std::string& prefix) {
  std::vector<std::string> names;
  for (int i = 0; d != nullptr && i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  for (const DeepSpeedKey& k : DeepSpeedKeys()) {
    const std::string path = k.path;
    if (path.compare(0, prefix.size(), prefix) == 0 &&
        path.find('.', prefix.size()) == std::string::npos) {
      names.push_back(path.substr(prefix.size()));
    }
  }
  if (!prefix.empty()) {  // a DeepSpeed section Braid has no message for
    for (std::string& n : DeepSpeedSectionKeys(prefix.substr(0, prefix.size() - 1))) {
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
    }
  }
  return names;
}

// The name in `names` nearest to `key`, if it is close (a third of the name's letters or fewer
// changed).
std::string Nearest(const std::vector<std::string>& names, const std::string& key) {
  std::string best;
  size_t best_distance = key.size() / 3 + 1;
  for (const std::string& n : names) {
    const size_t distance = EditDistance(key, n, /*ignore_case=*/true, best_distance);
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
    case pb::Value::kNumberValue:
      return Num(v.number_value());
    case pb::Value::kStringValue:
      return Quoted(v.string_value());
    default:
      return "";
  }
}

// A value protobuf's JSON reader would stop at for field `f`: what the field takes, else "".
// Only what the reader refuses for certain; the rest (numbers written as strings, ...) is the
// reader's to judge.
std::string WrongType(const pb::FieldDescriptor* f, const pb::Value& v) {
  using F = pb::FieldDescriptor;
  const pb::Value::KindCase kind = v.kind_case();
  if (kind == pb::Value::kNullValue) return "";
  if (f->is_map()) return kind == pb::Value::kStructValue ? "" : "an object";
  if (f->is_repeated()) return kind == pb::Value::kListValue ? "" : "a list";
  if (f->cpp_type() == F::CPPTYPE_MESSAGE) return kind == pb::Value::kStructValue ? "" : "an object";
  const bool compound = kind == pb::Value::kStructValue || kind == pb::Value::kListValue;
  switch (f->cpp_type()) {
    case F::CPPTYPE_STRING:
      return kind == pb::Value::kStringValue ? "" : "a string";
    case F::CPPTYPE_BOOL:
      return compound || kind == pb::Value::kNumberValue ? "true or false" : "";
    case F::CPPTYPE_ENUM:
      return compound || kind == pb::Value::kBoolValue ? "a name" : "";
    case F::CPPTYPE_FLOAT:
    case F::CPPTYPE_DOUBLE:
      return compound || kind == pb::Value::kBoolValue ? "a number" : "";
    default: {  // the integers
      const bool is32 = f->cpp_type() == F::CPPTYPE_INT32 || f->cpp_type() == F::CPPTYPE_UINT32;
      const bool is_unsigned =
          f->cpp_type() == F::CPPTYPE_UINT32 || f->cpp_type() == F::CPPTYPE_UINT64;
      const std::string want = is_unsigned ? "a non-negative integer"
                               : is32      ? "a 32-bit integer"
                                           : "an integer";
      if (compound || kind == pb::Value::kBoolValue) return want;
      if (kind != pb::Value::kNumberValue) return "";
      const double d = v.number_value();
      const double hi = is32 ? (is_unsigned ? 4294967295.0 : 2147483647.0) : 9.2e18;
      const double lo = is_unsigned ? 0 : is32 ? -2147483648.0 : -9.2e18;
      return d == std::floor(d) && d >= lo && d <= hi ? "" : want;
    }
  }
}

std::string Describe(const pb::Value& v) {
  if (v.kind_case() == pb::Value::kStructValue) return "an object";
  if (v.kind_case() == pb::Value::kListValue) return "a list";
  return Literal(v);
}

struct Walk {
  const std::string& text;
  const std::string& origin;
  JsonKeys* out;
  // ":line:column" by the path as written.
  std::map<std::string, std::string> written_positions = JsonKeyPositions(text);
  bool changed = false;

  // `written` is the key's path as the file spells it; `key` the key alone, looked up alone
  // where the path is not found (it is unique in the file, or gets no position).
  std::string Where(const std::string& written, const std::string& key) const {
    auto it = written_positions.find(written);
    return absl::StrCat(origin,
                        it != written_positions.end() ? it->second : KeyPosition(text, key), ": ");
  }

  // `candidates` for "did you mean", `known` listed (Braid's fields, not every DeepSpeed key).
  void Unknown(const std::string& key, const std::string& prefix, const std::string& written,
               const std::vector<std::string>& candidates, const std::vector<std::string>& known) {
    const std::string near = Nearest(candidates, key);
    out->problems.push_back(absl::StrCat(
        Where(written, key), "unknown field \"", prefix, key, "\"",
        near.empty() ? "" : absl::StrCat(" (did you mean \"", prefix, near, "\"?)"),
        "; known fields", prefix.empty() ? "" : " of " + prefix.substr(0, prefix.size() - 1),
        ": ", absl::StrJoin(known, ", ")));
  }

  // `written`: `prefix` as the file spells it.
  void Object(pb::Struct* object, const pb::Descriptor* d, const std::string& prefix,
              const std::string& written) {
    std::vector<std::string> remove;
    std::vector<std::string> drop;  // unknown or mistyped: out of the JSON, so the rest reads
    for (auto& [key, value] : *object->mutable_fields()) {
      const pb::FieldDescriptor* f = FieldByKey(d, key);
      const std::string path = absl::StrCat(prefix, f != nullptr ? f->name() : key);
      const std::string spelled = written + key;
      auto at = written_positions.find(spelled);
      if (at != written_positions.end()) out->positions.emplace(path, origin + at->second);
      if (f != nullptr) {
        if (const std::string want = WrongType(f, value); !want.empty()) {
          out->problems.push_back(absl::StrCat(Where(spelled, key), "field \"", path,
                                               "\": invalid value ", Describe(value),
                                               " (expected ", want, ")"));
          drop.push_back(key);
        } else if (value.kind_case() == pb::Value::kStructValue && f->message_type() != nullptr &&
                   !f->is_map()) {
          Object(value.mutable_struct_value(), f->message_type(), path + ".", spelled + ".");
        }
        continue;
      }
      if (const DeepSpeedKey* k = FindDeepSpeedKey(path)) {
        DeepSpeed(*k, key, spelled, value);
        remove.push_back(key);  // kMapped ones are read by Map() below first
        continue;
      }
      std::vector<std::string> fields;
      for (int i = 0; i < d->field_count(); ++i) fields.push_back(d->field(i)->name());
      Unknown(key, prefix, spelled, KnownNames(d, prefix), fields);
      drop.push_back(key);
    }
    Map(object, prefix, written);
    for (const std::string& key : remove) object->mutable_fields()->erase(key);
    for (const std::string& key : drop) object->mutable_fields()->erase(key);
    changed |= !drop.empty();
    changed |= !remove.empty();
    // DeepSpeed's checkpoint section holds only DeepSpeed's keys (tag_validation, ...): with
    // those gone it asks for no Braid checkpointing (which would need a dir).
    if (prefix.empty()) {
      auto it = object->mutable_fields()->find("checkpoint");
      if (it != object->mutable_fields()->end() &&
          it->second.kind_case() == pb::Value::kStructValue &&
          it->second.struct_value().fields().empty() &&
          std::any_of(out->ignored_fields.begin(), out->ignored_fields.end(),
                      [](const std::string& e) { return absl::StartsWith(e, "checkpoint."); })) {
        object->mutable_fields()->erase(it);
        out->ignored_fields.push_back("checkpoint (DeepSpeed's keys only)");
        changed = true;
      }
    }
  }

  // A key of DeepSpeed's table: noted, refused or left for Map().
  void DeepSpeed(const DeepSpeedKey& k, const std::string& key, const std::string& spelled,
                 const pb::Value& value) {
    const std::string path = k.path;
    switch (k.kind) {
      case DeepSpeedKeyKind::kMapped:
        break;
      case DeepSpeedKeyKind::kNoted:
        if (!Accepted(k, value)) {
          out->problems.push_back(
              absl::StrCat(Where(spelled, key), path, " is accepted only as ", k.accepted, ": ", k.note));
        } else {
          out->ignored_fields.push_back(path);
        }
        break;
      case DeepSpeedKeyKind::kRefused:
        if (Accepted(k, value)) {
          out->ignored_fields.push_back(path + " (disabled)");
        } else if (IsNetworkMonitor(path)) {
          out->problems.push_back(absl::StrCat(
              Where(spelled, key), path, ": Braid does not log to ", k.note,
              " (it sends the metrics over the network, which Braid's runs do not use); set "
              "\"enabled\": false, or use ",
              k.nearest));
        } else {
          const bool never = k.accepted == std::string(kNever);
          const bool literal = !never && k.accepted != std::string(kSwitchedOff);
          out->problems.push_back(absl::StrCat(
              Where(spelled, key), path, ": a DeepSpeed feature Braid does not have (", k.note,
              "); nearest in Braid: ", k.nearest,
              never     ? "; remove it"
              : literal ? absl::StrCat("; remove it or set it to ", k.accepted)
                        : "; remove it or switch it off"));
        }
        break;
    }
    if (value.kind_case() == pb::Value::kStructValue) {
      Section(path, spelled, value.struct_value());
    }
  }

  // The keys inside a DeepSpeed section Braid has no message for, where the table lists them.
  void Section(const std::string& path, const std::string& spelled, const pb::Struct& section) {
    const std::vector<std::string> known = DeepSpeedSectionKeys(path);
    if (known.empty()) return;
    for (const auto& [key, value] : section.fields()) {
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        Unknown(key, path + ".", absl::StrCat(spelled, ".", key), known, known);
      } else if (value.kind_case() == pb::Value::kStructValue) {
        Section(absl::StrCat(path, ".", key), absl::StrCat(spelled, ".", key),
                value.struct_value());
      }
    }
  }

  // DeepSpeed keys with a Braid field of the same meaning under another name.
  void Map(pb::Struct* object, const std::string& prefix, const std::string& written) {
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
        // Validation's problems with log.print_every are about this key.
        auto at = written_positions.find("steps_per_print");
        if (at != written_positions.end()) {
          out->positions.emplace("log.print_every", origin + at->second);
        }
      } else {
        out->ignored_fields.push_back("steps_per_print (log.print_every given)");
      }
    }
    // data_types.grad_accum_dtype: kept for validation, which checks it against the dtype the
    // gradients are accumulated in (the parameters'), known only once bf16/fp16 and the batch
    // sizes are resolved.
    if (prefix.empty() && fields.count("data_types") &&
        fields["data_types"].kind_case() == pb::Value::kStructValue) {
      const auto& types = fields["data_types"].struct_value().fields();
      auto it = types.find("grad_accum_dtype");
      if (it != types.end()) {
        const std::string spelled = written + "data_types.grad_accum_dtype";
        if (it->second.kind_case() != pb::Value::kStringValue) {
          out->problems.push_back(absl::StrCat(
              Where(spelled, "grad_accum_dtype"), "field \"data_types.grad_accum_dtype\": invalid value ",
              Describe(it->second), " (expected a string: \"fp32\", \"bf16\" or \"fp16\")"));
        } else {
          out->ignored_fields.push_back(
              absl::StrCat(kGradAccumDtypeEntry, " (", it->second.string_value(), ")"));
          auto at = written_positions.find(spelled);
          if (at != written_positions.end()) {
            out->positions.emplace(kGradAccumDtypeEntry, origin + at->second);
          }
        }
      }
    }
    // bfloat16: bf16's old spelling.
    if (prefix.empty() && fields.count("bfloat16")) {
      if (fields.count("bf16")) {
        out->problems.push_back(absl::StrCat(Where("bfloat16", "bfloat16"),
                                             "bfloat16 and bf16 are one section (bfloat16 is its "
                                             "old spelling); keep bf16"));
      } else {
        fields["bf16"] = fields["bfloat16"];
        out->ignored_fields.push_back("bfloat16");
      }
    }
    if (prefix != "zero_optimization.") return;
    // DeepSpeed's legacy spellings of the offload sections: cpu_offload (the optimizer's),
    // cpu_offload_param and cpu_offload_use_pin_memory.
    OffloadAlias(fields, "cpu_offload", "offload_optimizer", written);
    OffloadAlias(fields, "cpu_offload_param", "offload_param", written);
    if (fields.count("cpu_offload_use_pin_memory")) {
      const pb::Value v = fields["cpu_offload_use_pin_memory"];
      if (v.kind_case() != pb::Value::kBoolValue) {
        out->problems.push_back(absl::StrCat(Where(written + "cpu_offload_use_pin_memory",
                                                   "cpu_offload_use_pin_memory"),
                                             "zero_optimization.cpu_offload_use_pin_memory must "
                                             "be true or false"));
        return;
      }
      for (const char* section : {"offload_optimizer", "offload_param"}) {
        auto it = fields.find(section);
        if (it == fields.end() || it->second.kind_case() != pb::Value::kStructValue) continue;
        auto& sub = *it->second.mutable_struct_value()->mutable_fields();
        if (!sub.count("pin_memory") && !sub.count("pinMemory")) sub["pin_memory"] = v;
      }
      out->ignored_fields.push_back("zero_optimization.cpu_offload_use_pin_memory");
    }
  }

  // `alias`: true is `section`.device "cpu"; refused beside `section` itself.
  void OffloadAlias(google::protobuf::Map<std::string, pb::Value>& fields, const char* alias,
                    const char* section, const std::string& written) {
    if (!fields.count(alias)) return;
    const pb::Value v = fields[alias];
    const std::string path = absl::StrCat("zero_optimization.", alias);
    if (v.kind_case() != pb::Value::kBoolValue) {
      out->problems.push_back(absl::StrCat(Where(written + alias, alias), path, " must be true or false"));
    } else if (!v.bool_value()) {
      out->ignored_fields.push_back(path + " (false)");
    } else if (fields.count(section) > 0) {
      out->problems.push_back(absl::StrCat(Where(written + alias, alias), path, " and zero_optimization.",
                                           section, " are one setting (", alias,
                                           " is its old spelling); keep ", section));
    } else {
      (*fields[section].mutable_struct_value()->mutable_fields())["device"].set_string_value(
          "cpu");
      auto at = written_positions.find(written + alias);
      if (at != written_positions.end()) {
        out->positions.emplace(absl::StrCat("zero_optimization.", section), origin + at->second);
      }
      out->ignored_fields.push_back(path);
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
  walk.Object(root.mutable_struct_value(), TrainConfig::descriptor(), "", "");
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
  // "data_types.grad_accum_dtype (fp32)", or after validation "(fp32: why it is what Braid does)".
  if (absl::StartsWith(entry, absl::StrCat(kGradAccumDtypeEntry, " ("))) {
    const std::string inner = entry.substr(std::strlen(kGradAccumDtypeEntry) + 2,
                                           entry.size() - std::strlen(kGradAccumDtypeEntry) - 3);
    const size_t colon = inner.find(": ");
    return colon == std::string::npos
               ? absl::StrCat(kGradAccumDtypeEntry, ": \"", inner, "\" (checked by validation)")
               : absl::StrCat(kGradAccumDtypeEntry, ": \"", inner.substr(0, colon), "\", ",
                              inner.substr(colon + 2));
  }
  if (absl::StartsWith(entry, "scheduler.params.cycle_momentum (")) {
    const std::string type = entry.substr(33, entry.size() - 34);
    return absl::StrCat("scheduler.params.cycle_momentum: off, as in DeepSpeed: OneCycle cycles "
                        "the momentum of optimizers with betas (Adam, AdamW) only, and ",
                        type, " has none; the learning rate still cycles");
  }
  if (absl::EndsWith(entry, " (disabled)")) {  // wandb, comet, DeepSpeed's features Braid lacks
    return absl::StrCat(entry.substr(0, entry.find(' ')), ": not enabled, nothing to do");
  }
  if (absl::EndsWith(entry, " (false)")) {  // a legacy offload spelling set false
    return absl::StrCat(entry.substr(0, entry.find(' ')), ": false, nothing to do");
  }
  if (entry == "checkpoint (DeepSpeed's keys only)") {
    return "checkpoint: DeepSpeed's checkpoint options only, so no Braid checkpointing (give "
           "checkpoint.dir to save checkpoints)";
  }
  if (entry == "zero_optimization.offload_param (without offload_optimizer)") {
    return "zero_optimization.offload_param: the optimizer steps the offloaded shards on the "
           "host, so its state lives there too (as with offload_optimizer \"cpu\")";
  }
  if (entry == "activation_checkpointing.partition_activations") {
    return "activation_checkpointing.partition_activations: no effect without tensor parallelism "
           "(there is no tensor-parallel group to split the kept inputs over)";
  }
  if (entry == "activation_checkpointing.partition_activations (sequence_parallel)") {
    return "activation_checkpointing.partition_activations: no effect under "
           "parallel.sequence_parallel (each rank keeps its part of the sequence already)";
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
    if (k->kind == DeepSpeedKeyKind::kMapped) return absl::StrCat(entry, ": ", k->note);
    if (k->accepted != nullptr) return absl::StrCat(entry, ": ", k->accepted, ", Braid's behaviour");
    return absl::StrCat(entry, ": accepted, no effect in Braid (", k->note, ")");
  }
  return absl::StrCat(entry, ": accepted, no effect in Braid");
}

}  // namespace braid::config::internal
