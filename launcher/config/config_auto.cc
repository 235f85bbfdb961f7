// "auto" in JSON configs, as Hugging Face's DeepSpeed integration writes them: the reader
// removes each "auto" (recording its path in TrainConfig.auto_fields), validation fills the
// field in like an absent one except where Hugging Face's value differs from Braid's default
// (ResolveAutoValues), and ConfigNotes says what each became and why.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/config/config.h"
#include "launcher/config/config_internal.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace braid::config {
namespace internal {
namespace {

namespace pb = google::protobuf;

constexpr char kAuto[] = "auto";

// The field `key` of `d` by its proto or JSON name; null if none.
const pb::FieldDescriptor* FieldByKey(const pb::Descriptor* d, const std::string& key) {
  if (d == nullptr) return nullptr;
  const pb::FieldDescriptor* f = d->FindFieldByName(key);
  for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
    if (d->field(i)->json_name() == key) f = d->field(i);
  }
  return f;
}

// Removes the "auto" values of non-string fields from `object` (a JSON object read as message
// type `d`), appending their paths. A string field keeps "auto": there it is a name.
void StripAuto(pb::Struct* object, const pb::Descriptor* d, const std::string& prefix,
               std::vector<std::string>* paths) {
  std::vector<std::string> strip;
  for (auto& [key, value] : *object->mutable_fields()) {
    const pb::FieldDescriptor* f = FieldByKey(d, key);
    const std::string path = absl::StrCat(prefix, f != nullptr ? f->name() : key);
    if (value.kind_case() == pb::Value::kStringValue && value.string_value() == kAuto) {
      if (f != nullptr && f->type() != pb::FieldDescriptor::TYPE_STRING) strip.push_back(key);
    } else if (value.kind_case() == pb::Value::kStructValue && f != nullptr &&
               f->message_type() != nullptr && !f->is_map()) {
      StripAuto(value.mutable_struct_value(), f->message_type(), path + ".", paths);
    }
  }
  for (const std::string& key : strip) {
    paths->push_back(absl::StrCat(prefix, FieldByKey(d, key)->name()));
    object->mutable_fields()->erase(key);
  }
}

// The path's field and the message holding it in `cfg`; false if a part is not a field.
bool Resolve(const pb::Message& cfg, const std::string& path, const pb::Message** holder,
             const pb::FieldDescriptor** field) {
  const pb::Message* m = &cfg;
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    if (f == nullptr) return false;
    if (i + 1 == parts.size()) {
      *holder = m;
      *field = f;
      return true;
    }
    if (f->message_type() == nullptr || f->is_repeated()) return false;
    m = &m->GetReflection()->GetMessage(*m, f);
  }
  return false;
}

std::string ValueOf(const pb::Message& m, const pb::FieldDescriptor* f) {
  const pb::Reflection* r = m.GetReflection();
  if (f->is_repeated()) {
    std::vector<std::string> items;
    for (int i = 0; i < r->FieldSize(m, f); ++i) {
      std::string v;
      pb::TextFormat::PrintFieldValueToString(m, f, i, &v);
      items.push_back(v);
    }
    return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
  }
  if (!r->HasField(m, f)) return "";
  std::string v;
  pb::TextFormat::PrintFieldValueToString(m, f, -1, &v);
  return v;
}

// Where an "auto" field's value came from (after validation).
std::string SourceOf(const TrainConfig& cfg, const std::string& path) {
  const auto contains = [&](const std::string& p) {
    for (const std::string& a : cfg.auto_fields()) {
      if (a == p) return true;
    }
    return false;
  };
  if (path == "train_batch_size") {
    return "train_micro_batch_size_per_gpu × gradient_accumulation_steps × data-parallel size";
  }
  if (path == "train_micro_batch_size_per_gpu") {
    return contains("train_batch_size") ? "Braid's default micro-batch"
                                        : "train_batch_size / (gradient_accumulation_steps × "
                                          "data-parallel size)";
  }
  if (path == "gradient_accumulation_steps") {
    return contains("train_batch_size") || !contains("train_micro_batch_size_per_gpu")
               ? "train_batch_size / (train_micro_batch_size_per_gpu × data-parallel size), or 1"
               : "1, Braid's default";
  }
  if (path == "optimizer.params.lr") {
    return cfg.scheduler().params().has_warmup_max_lr() && !contains("scheduler.params.warmup_max_lr")
               ? "scheduler.params.warmup_max_lr"
               : "Braid's default rate";
  }
  if (path == "optimizer.params.betas" || path == "optimizer.params.eps" ||
      path == "optimizer.params.weight_decay" || path == "optimizer.params.adam_w_mode") {
    return absl::StrCat(cfg.optimizer().type(), "'s default");
  }
  if (path == "scheduler.params.warmup_max_lr") return "optimizer.params.lr";
  if (path == "scheduler.params.warmup_min_lr") return "0, Hugging Face's";
  if (path == "scheduler.params.warmup_num_steps") {
    return "0 as Hugging Face's default warmup_ratio gives (DeepSpeed's warm-ups count it as 2); "
           "Braid has no warm-up flag: write the number to warm up longer";
  }
  if (path == "scheduler.params.total_num_steps") return "steps";
  if (path == "gradient_clipping") return "1.0, Hugging Face's max_grad_norm default";
  if (path == "fp16.enabled" || path == "bf16.enabled") {
    // Hugging Face's rule (ResolveAutoValues), from the device's backend.
    const std::string device = cfg.device().empty() ? "cpu" : cfg.device();
    const bool is_bf16 = path == "bf16.enabled";
    if (cfg.bf16().enabled()) {
      return is_bf16 ? absl::StrCat(device, " computes in bf16 (its backend's answer), preferred "
                                            "as in Hugging Face's integration")
                     : "off: bf16 is on";
    }
    if (cfg.fp16().enabled()) {
      return is_bf16 ? absl::StrCat("off: fp16 is on")
                     : absl::StrCat(device, " computes in fp16 but not bf16 (its backend's "
                                            "answer), as Hugging Face's integration on such a GPU");
    }
    if (cfg.has_parallel() && cfg.parallel().tensor() > 1) {
      return "off: Braid's tensor parallelism runs in full precision";
    }
    if (absl::StartsWith(device, "cpu")) {
      return "off on the CPU, as in Hugging Face's integration (half precision only on a GPU)";
    }
    return absl::StrCat("off: ", device, "'s backend reports neither bf16 nor fp16 (or could not "
                                         "be asked: the device is checked again before training)");
  }
  return "Braid's default";
}

}  // namespace

std::string StripAutoValues(const std::string& json, std::vector<std::string>* paths) {
  if (json.find(absl::StrCat("\"", kAuto, "\"")) == std::string::npos) return json;
  pb::Value root;
  if (!pb::util::JsonStringToMessage(json, &root).ok() ||
      root.kind_case() != pb::Value::kStructValue) {
    return json;  // the reader reports what is wrong with it
  }
  std::vector<std::string> found;
  StripAuto(root.mutable_struct_value(), TrainConfig::descriptor(), "", &found);
  if (found.empty()) return json;
  // Sorted, so that notes come in one order whatever the JSON object's.
  std::sort(found.begin(), found.end());
  std::string out;
  if (!pb::util::MessageToJsonString(root, &out).ok()) return json;
  paths->insert(paths->end(), found.begin(), found.end());
  return out;
}

void ResolveAutoValues(TrainConfig* cfg,
                       const std::function<HalfSupport(const std::string&)>& half_support) {
  bool auto_fp16 = false, auto_bf16 = false;
  for (const std::string& path : cfg->auto_fields()) {
    if (path == "gradient_clipping") cfg->set_gradient_clipping(1.0);
    if (path == "scheduler.params.warmup_num_steps") {
      cfg->mutable_scheduler()->mutable_params()->set_warmup_num_steps(0);
    }
    if (path == "scheduler.params.warmup_min_lr") {
      cfg->mutable_scheduler()->mutable_params()->set_warmup_min_lr(0.0);
    }
    auto_fp16 |= path == "fp16.enabled";
    auto_bf16 |= path == "bf16.enabled";
  }
  if (!auto_fp16 && !auto_bf16) return;
  // Hugging Face's rule, from what the device's backend says it computes in: bf16 where it can,
  // else fp16 where it can (a GPU before Ampere), else full precision (the CPU). A section given
  // explicitly keeps its value and the "auto" one yields to it (both cannot be on).
  // Tensor parallelism has no mixed precision in Braid (validation refuses it): "auto" is off.
  const std::string device = cfg->device().empty() ? "cpu" : cfg->device();
  const bool tensor_parallel = cfg->has_parallel() && cfg->parallel().tensor() > 1;
  const HalfSupport support =
      half_support && !tensor_parallel ? half_support(device) : HalfSupport{};
  const bool bf16 = auto_bf16 ? support.bf16 && !(!auto_fp16 && cfg->fp16().enabled())
                              : cfg->bf16().enabled();
  if (auto_bf16) cfg->mutable_bf16()->set_enabled(bf16);
  if (auto_fp16) cfg->mutable_fp16()->set_enabled(!bf16 && support.fp16);
}

}  // namespace internal

std::vector<std::string> ConfigNotes(const TrainConfig& cfg) {
  std::vector<std::string> notes;
  for (const std::string& path : cfg.auto_fields()) {
    const google::protobuf::Message* holder = nullptr;
    const google::protobuf::FieldDescriptor* field = nullptr;
    std::string value;
    if (internal::Resolve(cfg, path, &holder, &field)) value = internal::ValueOf(*holder, field);
    // fp16/bf16's enabled have no presence: false is a value here, not "unset".
    if (path == "fp16.enabled") value = cfg.fp16().enabled() ? "true" : "false";
    if (path == "bf16.enabled") value = cfg.bf16().enabled() ? "true" : "false";
    if (value.empty() || value == "[]") {
      notes.push_back(absl::StrCat(path, ": \"auto\" left unset (not used with this config)"));
    } else {
      notes.push_back(absl::StrCat(path, " = ", value, " (\"auto\": ",
                                   internal::SourceOf(cfg, path), ")"));
    }
  }
  for (const std::string& entry : cfg.ignored_fields()) {
    notes.push_back(internal::IgnoredFieldNote(entry));
  }
  return notes;
}

}  // namespace braid::config
