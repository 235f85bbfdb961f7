#include "core/config/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/activation_checkpointing.h"
#include "core/check.h"
#include "core/registry.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace braid::config {
namespace {

namespace pb = google::protobuf;

// ---------------------------------------------------------------------------------------------
// Parsing

std::string KnownFields(const pb::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

// The text of line `line` (0-based) of `text`.
std::string LineOf(const std::string& text, int line) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  return line >= 0 && line < static_cast<int>(lines.size()) ? lines[line] : std::string();
}

// The protobuf tokenizer's columns advance a tab to the next multiple of 8; this maps one back
// to a byte offset in the line.
size_t ByteOffsetOfColumn(const std::string& line, int column) {
  int col = 0;
  size_t i = 0;
  for (; i < line.size() && col < column; ++i) col = line[i] == '\t' ? (col / 8 + 1) * 8 : col + 1;
  return i;
}

int ColumnOfByteOffset(const std::string& line, size_t offset) {
  int col = 0;
  for (size_t i = 0; i < offset && i < line.size(); ++i) {
    col = line[i] == '\t' ? (col / 8 + 1) * 8 : col + 1;
  }
  return col;
}

bool IsIdentChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The text parser reports a position but not the field it was parsing. The field is the
// identifier that ends at the position (unknown or repeated field name) or the one before the
// ':' preceding it (bad value); empty if neither.
std::string FieldNear(const std::string& line, size_t pos) {
  pos = std::min(pos, line.size());
  auto skip_space = [&] {
    while (pos > 0 && absl::ascii_isspace(static_cast<unsigned char>(line[pos - 1]))) --pos;
  };
  if (pos == 0 || !IsIdentChar(line[pos - 1])) {
    skip_space();
    if (pos == 0 || line[pos - 1] != ':') return "";
    --pos;
    skip_space();
  }
  size_t end = pos;
  while (pos > 0 && IsIdentChar(line[pos - 1])) --pos;
  return line.substr(pos, end - pos);
}

class TextErrorCollector : public pb::io::ErrorCollector {
 public:
  TextErrorCollector(const std::string& text, const std::string& origin)
      : text_(text), origin_(origin) {}

  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    const std::string line_text = LineOf(text_, line);
    const size_t offset = ByteOffsetOfColumn(line_text, column);
    // Protobuf names the unknown field and its message type; add what would have been valid.
    const std::string kPrefix = "Message type \"", kMiddle = "\" has no field named \"";
    size_t middle = message.find(kMiddle);
    if (absl::StartsWith(message, kPrefix) && middle != std::string::npos) {
      std::string type = message.substr(kPrefix.size(), middle - kPrefix.size());
      std::string field = message.substr(middle + kMiddle.size());
      field = field.substr(0, field.find('"'));
      // Protobuf points after the name (at the next token for a message field); editors want
      // the name's start.
      size_t end = offset;
      while (end > 0 && absl::ascii_isspace(static_cast<unsigned char>(line_text[end - 1]))) --end;
      if (end >= field.size() && line_text.compare(end - field.size(), field.size(), field) == 0) {
        column = ColumnOfByteOffset(line_text, end - field.size());
      }
      const std::string where = absl::StrCat(origin_, ":", line + 1, ":", column + 1, ": ");
      const pb::Descriptor* d = pb::DescriptorPool::generated_pool()->FindMessageTypeByName(type);
      errors_.push_back(absl::StrCat(where, "unknown field \"", field, "\" in ", type,
                                     d ? absl::StrCat(" (known fields: ", KnownFields(d), ")") : "",
                                     "; remove it or fix its spelling"));
      return;
    }
    const std::string where = absl::StrCat(origin_, ":", line + 1, ":", column + 1, ": ");
    const std::string field = FieldNear(line_text, offset);
    if (!field.empty() && message.find(absl::StrCat("\"", field, "\"")) == std::string::npos) {
      errors_.push_back(absl::StrCat(where, "field \"", field, "\": ", message));
    } else {
      errors_.push_back(absl::StrCat(where, message));
    }
  }

  void AddWarning(int line, pb::io::ColumnNumber column, const std::string& message) override {}

  std::string Errors() const { return absl::StrJoin(errors_, "; "); }

 private:
  const std::string& text_;
  const std::string& origin_;
  std::vector<std::string> errors_;
};

// Resolves a dotted path of field names ("optimizer.params") from TrainConfig; null if a part is
// not a message field.
const pb::Descriptor* DescriptorAt(const std::string& path) {
  const pb::Descriptor* d = TrainConfig::descriptor();
  if (path.empty()) return d;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(path, '.'))) {
    const pb::FieldDescriptor* f = d->FindFieldByName(part);
    for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
      if (d->field(i)->json_name() == part) f = d->field(i);
    }
    if (f == nullptr || f->message_type() == nullptr) return nullptr;
    d = f->message_type();
  }
  return d;
}

// " at line L, column C" if `"key":` occurs exactly once in `text` (protobuf's JSON errors carry
// no position; an ambiguous key gets none rather than a wrong one).
std::string JsonKeyPosition(const std::string& text, const std::vector<std::string>& keys) {
  int found = 0;
  size_t at = 0;
  for (const std::string& key : keys) {
    const std::string quoted = absl::StrCat("\"", key, "\"");
    for (size_t p = text.find(quoted); p != std::string::npos; p = text.find(quoted, p + 1)) {
      size_t q = p + quoted.size();
      while (q < text.size() && absl::ascii_isspace(static_cast<unsigned char>(text[q]))) ++q;
      if (q < text.size() && text[q] == ':') {
        ++found;
        at = p;
      }
    }
  }
  if (found != 1) return "";
  int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + at, '\n'));
  size_t line_start = text.rfind('\n', at);
  size_t column = at - (line_start == std::string::npos ? 0 : line_start + 1) + 1;
  return absl::StrCat(":", line, ":", column);
}

std::vector<std::string> NameAndJsonName(const std::string& path, const std::string& name) {
  std::vector<std::string> names = {name};
  if (const pb::Descriptor* d = DescriptorAt(path)) {
    if (const pb::FieldDescriptor* f = d->FindFieldByName(name)) {
      if (f->json_name() != name) names.push_back(f->json_name());
    }
  }
  return names;
}

// Rewrites protobuf's JSON errors, "(optimizer.params) bogus: Cannot find field." and
// "(optimizer.params.lr): invalid value \"x\" for type TYPE_DOUBLE", to name the file, the full
// field path, and where possible the position and the valid fields.
std::string DescribeJsonError(const std::string& text, const std::string& origin,
                              const std::string& message) {
  std::string path, rest = message;
  if (absl::StartsWith(rest, "(")) {
    size_t close = rest.find(')');
    if (close != std::string::npos) {
      path = rest.substr(1, close - 1);
      rest = rest.substr(close + 1);
      if (absl::StartsWith(rest, ":")) rest = rest.substr(1);
      rest = std::string(absl::StripLeadingAsciiWhitespace(rest));
    }
  }
  // A repeated key of an `optional` scalar collides in its synthetic oneof "_<name>".
  const std::string kOneof = "oneof field '_";
  size_t oneof = rest.find(kOneof);
  if (oneof != std::string::npos && absl::StrContains(rest, "is already set")) {
    std::string field = rest.substr(oneof + kOneof.size());
    field = field.substr(0, field.find('\''));
    return absl::StrCat(origin, ": field \"", path.empty() ? field : absl::StrCat(path, ".", field),
                        "\" is given more than once");
  }
  const std::string kCannotFind = ": Cannot find field.";
  if (absl::EndsWith(rest, kCannotFind)) {
    std::string field = rest.substr(0, rest.size() - kCannotFind.size());
    const pb::Descriptor* d = DescriptorAt(path);
    return absl::StrCat(origin, JsonKeyPosition(text, {field}), ": unknown field \"",
                        path.empty() ? field : absl::StrCat(path, ".", field), "\"",
                        d ? absl::StrCat(" (known fields", path.empty() ? "" : " of " + path, ": ",
                                         KnownFields(d), ")")
                          : "",
                        "; remove it or fix its spelling");
  }
  if (!path.empty()) {
    // Map entries come as "strategy.options[0].value": report the map itself.
    std::string field_path = path.substr(0, path.find('['));
    std::string position;
    if (field_path == path) {
      size_t dot = path.rfind('.');
      std::string parent = dot == std::string::npos ? "" : path.substr(0, dot);
      std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
      position = JsonKeyPosition(text, NameAndJsonName(parent, leaf));
    }
    static const std::pair<const char*, const char*> kTypes[] = {
        {"for type TYPE_DOUBLE", "(expected a number)"},
        {"for type TYPE_FLOAT", "(expected a number)"},
        {"for type TYPE_INT32", "(expected a 32-bit integer)"},
        {"for type TYPE_INT64", "(expected an integer)"},
        {"for type TYPE_UINT64", "(expected a non-negative integer)"},
        {"for type TYPE_UINT32", "(expected a non-negative integer)"},
        {"for type TYPE_BOOL", "(expected true or false)"},
        {"for type TYPE_STRING", "(expected a string)"},
    };
    for (const auto& [from, to] : kTypes) {
      size_t p = rest.find(from);
      if (p != std::string::npos) rest.replace(p, std::string(from).size(), to);
    }
    return absl::StrCat(origin, position, ": field \"", field_path, "\": ", rest);
  }
  return absl::StrCat(origin, ": ", message);
}

// ---------------------------------------------------------------------------------------------
// Validation

constexpr int kDefaultMicroBatch = 16;
constexpr int kDefaultSteps = 200;
constexpr double kDefaultLr = 1e-3;
constexpr uint64_t kDefaultSeed = 1234;
constexpr int kDefaultPrintEvery = 10;

// Models, datasets and optimizers, and their defaults, come from the registry (core/registry.h).
const std::vector<std::string> kSchedulers = {"Constant", "WarmupCosine"};
const std::vector<std::string> kSamplers = {"random", "sequential"};

std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

// "a", "a and b", "a, b and c" (`last` = "and" or "or").
std::string JoinWords(const std::vector<std::string>& words, const std::string& last) {
  if (words.size() <= 1) return absl::StrJoin(words, "");
  std::vector<std::string> head(words.begin(), words.end() - 1);
  return absl::StrCat(absl::StrJoin(head, ", "), " ", last, " ", words.back());
}

std::vector<std::string> QuotedAll(const std::vector<std::string>& words) {
  std::vector<std::string> out;
  for (const std::string& w : words) out.push_back(Quoted(w));
  return out;
}

// The fields of `message` that are set: present (optional scalars, messages) or non-empty
// (repeated). `skip` are left out.
std::vector<const pb::FieldDescriptor*> SetFields(const pb::Message& message,
                                                  const std::vector<std::string>& skip) {
  std::vector<const pb::FieldDescriptor*> set;
  const pb::Descriptor* d = message.GetDescriptor();
  const pb::Reflection* r = message.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (std::find(skip.begin(), skip.end(), f->name()) != skip.end()) continue;
    if (f->is_repeated() ? r->FieldSize(message, f) > 0 : r->HasField(message, f)) set.push_back(f);
  }
  return set;
}

std::string Num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

class Checker {
 public:
  void Error(std::string message) { errors_.push_back(std::move(message)); }
  bool ok() const { return errors_.empty(); }
  absl::Status Status() const {
    if (errors_.empty()) return absl::OkStatus();
    if (errors_.size() == 1) return absl::InvalidArgumentError(errors_[0]);
    return absl::InvalidArgumentError(absl::StrCat(
        errors_.size(), " problems in the training config: ", absl::StrJoin(errors_, "; ")));
  }

  // Replaces `*value` by its canonical spelling from `known` (case-insensitive), or `fallback`
  // when empty; false (and an error listing the known names) if it matches none.
  bool Name(std::string* value, const std::string& field, const std::vector<std::string>& known,
            const std::string& fallback) {
    if (value->empty() && fallback.empty()) {
      Error(absl::StrCat(field, " is not set and nothing is registered as its default; known: ",
                         known.empty() ? "(none registered)" : absl::StrJoin(known, ", ")));
      return false;
    }
    if (value->empty()) {
      *value = fallback;
      return true;
    }
    for (const std::string& k : known) {
      if (absl::EqualsIgnoreCase(*value, k)) {
        *value = k;
        return true;
      }
    }
    Error(absl::StrCat(field, " ", Quoted(*value),
                       " is unknown; known: ", absl::StrJoin(known, ", ")));
    return false;
  }

  bool Positive(const std::string& field, int64_t v) {
    if (v >= 1) return true;
    Error(absl::StrCat(field, " (", v, ") must be >= 1"));
    return false;
  }
  bool NonNegative(const std::string& field, int64_t v) {
    if (v >= 0) return true;
    Error(absl::StrCat(field, " (", v, ") must be >= 0"));
    return false;
  }
  bool PositiveReal(const std::string& field, double v) {
    if (std::isfinite(v) && v > 0) return true;
    Error(absl::StrCat(field, " (", Num(v), ") must be a finite number > 0"));
    return false;
  }
  bool NonNegativeReal(const std::string& field, double v) {
    if (std::isfinite(v) && v >= 0) return true;
    Error(absl::StrCat(field, " (", Num(v), ") must be a finite number >= 0"));
    return false;
  }
  bool UnitInterval(const std::string& field, double v) {  // [0, 1)
    if (v >= 0 && v < 1) return true;
    Error(absl::StrCat(field, " (", Num(v), ") must be in [0, 1)"));
    return false;
  }

 private:
  std::vector<std::string> errors_;
};

bool Has(const std::vector<std::string>& features, const std::string& name) {
  return std::find(features.begin(), features.end(), name) != features.end();
}

// "plugin libbraid_zero.so" for a plugin's file, the origin itself otherwise ("built-in").
std::string DescribeOrigin(const std::string& origin) {
  if (absl::EndsWith(origin, ".so")) {
    return absl::StrCat("plugin ", origin.substr(origin.rfind('/') + 1));
  }
  return origin;
}

// Checks feature sections against what the chosen strategy declares, asking the catalog only
// when a section needs a feature (so a config without one loads no plugin to be validated).
class FeatureCheck {
 public:
  FeatureCheck(Checker& c, const StrategyCatalog& catalog, const std::string& strategy)
      : c_(c), catalog_(catalog), strategy_(strategy) {}

  void Require(const std::string& section, const std::string& feature) {
    if (strategy_.empty()) return;  // strategy.path without a name: reported with strategy
    if (!asked_) {
      asked_ = true;
      absl::StatusOr<std::vector<std::string>> features = std::vector<std::string>();
      if (catalog_.features_of) features = catalog_.features_of(strategy_);
      if (features.ok()) {
        features_ = *std::move(features);
      } else {
        // Without the strategy its features are unknown: one problem, not one per section.
        unknown_ = true;
        c_.Error(absl::StrCat("strategy.name ", Quoted(strategy_), " (needed to check ", section,
                              "): ", features.status().message()));
      }
    }
    if (unknown_ || Has(features_, feature)) return;
    FeatureProviders found;
    if (catalog_.providers_of) found = catalog_.providers_of(feature);
    std::string message =
        absl::StrCat(section, " needs a strategy that provides ", Quoted(feature), "; strategy ",
                     Quoted(strategy_), " does not");
    if (!found.strategies.empty()) {
      std::vector<std::string> uses;
      for (const FeatureProvider& p : found.strategies) {
        uses.push_back(absl::StrCat(Quoted(p.strategy), " (", DescribeOrigin(p.origin), ")"));
      }
      absl::StrAppend(&message, "; use strategy.name ", JoinWords(uses, "or"));
    } else {
      absl::StrAppend(&message, ", and no ", catalog_.searched,
                      " does: it is not available yet; remove the section or add a plugin "
                      "whose strategy provides it");
    }
    if (!found.unloadable.empty()) {
      absl::StrAppend(&message, " (plugin files that could not be loaded while looking: ",
                      absl::StrJoin(found.unloadable, ", "), ")");
    }
    c_.Error(std::move(message));
  }

 private:
  Checker& c_;
  const StrategyCatalog& catalog_;
  const std::string strategy_;
  bool asked_ = false, unknown_ = false;
  std::vector<std::string> features_;
};

void CheckBatch(Checker& c, TrainConfig* cfg, int dp) {
  bool has_total = cfg->has_train_batch_size();
  bool has_micro = cfg->has_train_micro_batch_size_per_gpu();
  bool has_accum = cfg->has_gradient_accumulation_steps();
  bool ok = true;
  if (has_total) ok &= c.Positive("train_batch_size", cfg->train_batch_size());
  if (has_micro)
    ok &= c.Positive("train_micro_batch_size_per_gpu", cfg->train_micro_batch_size_per_gpu());
  if (has_accum)
    ok &= c.Positive("gradient_accumulation_steps", cfg->gradient_accumulation_steps());
  if (!ok) return;

  const int64_t total = cfg->train_batch_size();
  int64_t micro = cfg->train_micro_batch_size_per_gpu();
  int64_t accum = cfg->gradient_accumulation_steps();
  const std::string kTotal = absl::StrCat("train_batch_size (", total, ")");
  const std::string kMicro = absl::StrCat("train_micro_batch_size_per_gpu (", micro, ")");
  const std::string kAccum = absl::StrCat("gradient_accumulation_steps (", accum, ")");
  const std::string kDp = absl::StrCat("data-parallel size (", dp, ")");

  if (has_total && has_micro && has_accum) {
    if (total != micro * accum * dp) {
      c.Error(absl::StrCat(kTotal, " != ", kMicro, " × ", kAccum, " × ", kDp, " = ",
                           micro * accum * dp));
    }
    return;
  }
  if (has_total && !has_micro) {
    if (!has_accum) accum = 1;
    if (total % (accum * dp) != 0) {
      c.Error(absl::StrCat(kTotal, " is not divisible by ", has_accum ? kAccum + " × " : "", kDp,
                           " = ", accum * dp,
                           "; set train_micro_batch_size_per_gpu and gradient_accumulation_steps "
                           "so that their product times the data-parallel size equals it"));
      return;
    }
    micro = total / (accum * dp);
  } else if (has_total) {  // micro given, accumulation derived
    if (total % (micro * dp) != 0) {
      c.Error(absl::StrCat(kTotal, " is not divisible by ", kMicro, " × ", kDp, " = ", micro * dp));
      return;
    }
    accum = total / (micro * dp);
  } else {
    if (!has_micro) micro = kDefaultMicroBatch;
    if (!has_accum) accum = 1;
  }
  const int64_t product = micro * accum * dp;
  if (product > std::numeric_limits<int32_t>::max()) {
    c.Error(absl::StrCat("train_batch_size = train_micro_batch_size_per_gpu (", micro,
                         ") × gradient_accumulation_steps (", accum, ") × ", kDp, " = ", product,
                         " is too large"));
    return;
  }
  cfg->set_train_batch_size(static_cast<int32_t>(product));
  cfg->set_train_micro_batch_size_per_gpu(static_cast<int32_t>(micro));
  cfg->set_gradient_accumulation_steps(static_cast<int32_t>(accum));
}

void CheckOptimizer(Checker& c, TrainConfig* cfg) {
  const Registry& registry = Registry::Get();
  OptimizerConfig* opt = cfg->mutable_optimizer();
  if (!c.Name(opt->mutable_type(), "optimizer.type", registry.OptimizerNames(),
              registry.DefaultOptimizer())) {
    return;
  }
  absl::StatusOr<OptimizerSpec> spec = registry.GetOptimizer(opt->type());
  if (!spec.ok()) {
    c.Error(std::string(spec.status().message()));
    return;
  }
  OptimizerParams* p = opt->mutable_params();
  if (!p->has_lr()) p->set_lr(kDefaultLr);
  c.PositiveReal("optimizer.params.lr", p->lr());
  if (p->has_weight_decay()) c.NonNegativeReal("optimizer.params.weight_decay", p->weight_decay());
  // Every optimizer takes lr and weight_decay; the other params belong to those that name them.
  for (const pb::FieldDescriptor* f : SetFields(*p, {"lr", "weight_decay"})) {
    if (Has(spec->params, f->name())) continue;
    std::vector<std::string> takers;
    for (const std::string& name : registry.OptimizerNames()) {
      absl::StatusOr<OptimizerSpec> other = registry.GetOptimizer(name);
      if (other.ok() && Has(other->params, f->name())) takers.push_back(name);
    }
    c.Error(absl::StrCat("optimizer.params.", f->name(), " applies to ",
                         takers.empty() ? "no registered optimizer"
                                        : absl::StrCat(JoinWords(takers, "and"), " only"),
                         " (optimizer.type is ", Quoted(opt->type()), ")"));
  }
  if (spec->validate) {
    ConfigProblems problems;
    spec->validate(opt, &problems);
    for (std::string& problem : problems) c.Error(std::move(problem));
  }
}

void CheckScheduler(Checker& c, TrainConfig* cfg) {
  SchedulerConfig* s = cfg->mutable_scheduler();
  if (!c.Name(s->mutable_type(), "scheduler.type", kSchedulers, "Constant")) return;
  SchedulerParams* p = s->mutable_params();
  if (s->type() == "Constant") {
    std::vector<std::string> set;
    if (p->has_warmup_num_steps()) set.push_back("warmup_num_steps");
    if (p->has_total_num_steps()) set.push_back("total_num_steps");
    if (p->has_warmup_max_lr()) set.push_back("warmup_max_lr");
    if (p->has_warmup_min_lr()) set.push_back("warmup_min_lr");
    if (p->has_min_lr()) set.push_back("min_lr");
    if (!set.empty()) {
      c.Error(absl::StrCat("scheduler.params ", absl::StrJoin(set, ", "),
                           " apply to scheduler.type \"WarmupCosine\" only (the type is "
                           "\"Constant\"); remove them or change the type"));
    }
    return;
  }
  // WarmupCosine.
  if (!p->has_warmup_num_steps()) p->set_warmup_num_steps(0);
  if (!p->has_total_num_steps()) {
    if (cfg->steps() < 1) return;  // reported with steps
    p->set_total_num_steps(cfg->steps());
  }
  if (!p->has_warmup_min_lr()) p->set_warmup_min_lr(0.0);
  if (!p->has_min_lr()) p->set_min_lr(0.0);
  bool steps_ok = c.NonNegative("scheduler.params.warmup_num_steps", p->warmup_num_steps());
  steps_ok &= c.Positive("scheduler.params.total_num_steps", p->total_num_steps());
  if (steps_ok && p->warmup_num_steps() > p->total_num_steps()) {
    c.Error(absl::StrCat("scheduler.params.warmup_num_steps (", p->warmup_num_steps(),
                         ") > scheduler.params.total_num_steps (", p->total_num_steps(), ")"));
  }

  // The optimizer's lr and the peak rate are one number; two different values would leave it
  // unclear which one the user meant.
  const OptimizerParams& opt = cfg->optimizer().params();
  if (!(std::isfinite(opt.lr()) && opt.lr() > 0)) return;  // reported with the optimizer
  if (!p->has_warmup_max_lr()) {
    p->set_warmup_max_lr(opt.lr());
  } else if (p->warmup_max_lr() != opt.lr()) {
    c.Error(absl::StrCat("scheduler.params.warmup_max_lr (", Num(p->warmup_max_lr()),
                         ") != optimizer.params.lr (", Num(opt.lr()),
                         "): they are the same peak rate; give one of them"));
    return;
  }
  const double max_lr = p->warmup_max_lr();
  for (const auto& [name, v] : {std::make_pair("warmup_min_lr", p->warmup_min_lr()),
                                std::make_pair("min_lr", p->min_lr())}) {
    if (c.NonNegativeReal(absl::StrCat("scheduler.params.", name), v) && v > max_lr) {
      c.Error(absl::StrCat("scheduler.params.", name, " (", Num(v),
                           ") > the peak rate scheduler.params.warmup_max_lr (", Num(max_lr), ")"));
    }
  }
}

void CheckFeatures(Checker& c, TrainConfig* cfg, const StrategyCatalog& catalog) {
  FeatureCheck features(c, catalog, cfg->strategy().name());
  if (cfg->fp16().enabled()) {
    features.Require("fp16", kFeatureFp16);
    Fp16Config* f = cfg->mutable_fp16();
    if (f->has_loss_scale()) c.NonNegativeReal("fp16.loss_scale", f->loss_scale());
    if (f->has_initial_scale_power() &&
        (f->initial_scale_power() < 0 || f->initial_scale_power() > 63)) {
      c.Error(absl::StrCat("fp16.initial_scale_power (", f->initial_scale_power(),
                           ") must be in [0, 63]"));
    }
    if (f->has_loss_scale_window()) c.Positive("fp16.loss_scale_window", f->loss_scale_window());
    if (f->has_hysteresis()) c.Positive("fp16.hysteresis", f->hysteresis());
    if (f->has_min_loss_scale()) c.PositiveReal("fp16.min_loss_scale", f->min_loss_scale());
    if (!f->has_loss_scale()) f->set_loss_scale(0);
    if (!f->has_initial_scale_power()) f->set_initial_scale_power(16);
    if (!f->has_loss_scale_window()) f->set_loss_scale_window(1000);
    if (!f->has_hysteresis()) f->set_hysteresis(2);
    if (!f->has_min_loss_scale()) f->set_min_loss_scale(1);
  }
  if (cfg->bf16().enabled()) features.Require("bf16", kFeatureBf16);
  if (cfg->fp16().enabled() && cfg->bf16().enabled()) {
    c.Error("fp16.enabled and bf16.enabled are both true; enable at most one");
  }
  // DeepSpeed's values: "fp32", or the training precision's own name (the default).
  const std::string& comm_dtype = cfg->communication_data_type();
  const std::string half = cfg->fp16().enabled() ? "fp16" : cfg->bf16().enabled() ? "bf16" : "";
  if (!comm_dtype.empty() && comm_dtype != "fp32" && comm_dtype != half) {
    c.Error(absl::StrCat("communication_data_type ", Quoted(comm_dtype), " is unknown; known: \"fp32\"",
                         half.empty() ? "" : absl::StrCat(", \"", half, "\""),
                         " (default: the parameters' own dtype)"));
  } else if (comm_dtype == "fp32" && half.empty()) {
    c.Error("communication_data_type \"fp32\" applies under fp16 or bf16 only (gradients are "
            "already f32 without them); remove it or enable one");
  } else if (comm_dtype == "fp32" && cfg->strategy().name() != "ddp") {
    c.Error(absl::StrCat("communication_data_type \"fp32\" is implemented by strategy \"ddp\" only, not ",
                         Quoted(cfg->strategy().name()), "; remove it to reduce in ", half));
  }

  const ZeroOptimizationConfig& z = cfg->zero_optimization();
  if (z.stage() < 0 || z.stage() > 3) {
    c.Error(absl::StrCat("zero_optimization.stage (", z.stage(), ") must be 0, 1, 2 or 3"));
  } else if (z.stage() > 0) {
    features.Require(absl::StrCat("zero_optimization (stage ", z.stage(), ")"),
                     ZeroFeatureName(z.stage()));
  }
  if (z.has_reduce_bucket_size())
    c.Positive("zero_optimization.reduce_bucket_size", z.reduce_bucket_size());
  if (z.has_allgather_bucket_size()) {
    c.Positive("zero_optimization.allgather_bucket_size", z.allgather_bucket_size());
  }
  if (z.has_stage3_prefetch_bucket_size() && z.stage3_prefetch_bucket_size() < 0) {
    c.Error(absl::StrCat("zero_optimization.stage3_prefetch_bucket_size (",
                         z.stage3_prefetch_bucket_size(), ") must be >= 0"));
  }
  if (z.has_stage3_param_persistence_threshold() && z.stage3_param_persistence_threshold() < 0) {
    c.Error(absl::StrCat("zero_optimization.stage3_param_persistence_threshold (",
                         z.stage3_param_persistence_threshold(), ") must be >= 0"));
  }
  for (auto [field, off] : {std::pair<const char*, const OffloadConfig*>{"offload_optimizer", &z.offload_optimizer()},
                            {"offload_param", &z.offload_param()}}) {
    const std::string& d = off->device();
    if (!d.empty() && d != "none" && d != "cpu") {
      c.Error(absl::StrCat("zero_optimization.", field, ".device \"", d,
                           "\" is unknown; known: \"none\", \"cpu\"",
                           d == "nvme" ? " (Braid has no NVMe offload)" : ""));
    }
  }
}

// activation_checkpointing needs no strategy feature: the training program applies it to the
// model after any strategy's Setup (core/activation_checkpointing.h). Fills in the policy.
void CheckActivationCheckpointing(Checker& c, TrainConfig* cfg) {
  if (!cfg->has_activation_checkpointing()) return;
  ActivationCheckpointingConfig* a = cfg->mutable_activation_checkpointing();
  if (a->has_number_checkpoints()) {
    c.Positive("activation_checkpointing.number_checkpoints", a->number_checkpoints());
  }
  absl::StatusOr<CheckpointPolicy> policy = CheckpointPolicyFromConfig(*a);
  if (policy.ok()) {
    a->set_policy(CheckpointPolicyNames()[size_t(policy->kind)]);
  } else {
    c.Error(std::string(policy.status().message()));
  }
  // DeepSpeed options that would change where kept inputs live: refused rather than ignored, so
  // that a run does not silently hold more memory than its config promises.
  const std::pair<const char*, bool> unsupported[] = {
      {"partition_activations: Braid does not split the kept inputs over the tensor-parallel "
       "group (each rank keeps its own)",
       a->partition_activations()},
      {"cpu_checkpointing: Braid keeps the checkpointed inputs on the training device (no CPU "
       "offload)",
       a->cpu_checkpointing()},
      {"contiguous_memory_optimization: Braid does not copy the kept inputs into one buffer",
       a->contiguous_memory_optimization()},
  };
  for (const auto& [what, on] : unsupported) {
    if (on) c.Error(absl::StrCat("activation_checkpointing.", what, "; set it false or remove it"));
  }
}

// The model and data sections, against the registered models and datasets: their names, the
// model's fields, what the model takes against what the dataset yields, the dataset's token
// widths and path; then the model's own hook (its preset's defaults and shape rules).
void CheckModelAndData(Checker& c, TrainConfig* cfg) {
  const Registry& registry = Registry::Get();
  ModelConfig* m = cfg->mutable_model();
  DataConfig* d = cfg->mutable_data();
  absl::StatusOr<ModelSpec> model = absl::NotFoundError("");
  absl::StatusOr<DatasetSpec> data = absl::NotFoundError("");
  if (c.Name(m->mutable_name(), "model.name", registry.ModelNames(), registry.DefaultModel())) {
    model = registry.GetModel(m->name());
  }
  if (c.Name(d->mutable_dataset(), "data.dataset", registry.DatasetNames(),
             registry.DefaultDataset())) {
    data = registry.GetDataset(d->dataset());
  }

  // Shape fields: counts (>= 1), and only those the model takes.
  bool fields_ok = true;
  for (const pb::FieldDescriptor* f : SetFields(*m, {"name"})) {
    const pb::Reflection* r = m->GetReflection();
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT32) {
      fields_ok &= c.Positive(absl::StrCat("model.", f->name()), r->GetInt32(*m, f));
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64) {
      fields_ok &= c.Positive(absl::StrCat("model.", f->name()), r->GetInt64(*m, f));
    }
    if (model.ok() && !Has(model->fields, f->name())) {
      fields_ok = false;
      c.Error(absl::StrCat("model.", f->name(), " does not apply to model ", Quoted(m->name()),
                           model->fields.empty()
                               ? " (it takes none of the model fields)"
                               : absl::StrCat(" (it takes ", JoinWords(model->fields, "and"),
                                              " only)")));
    }
  }
  if (model.ok() && fields_ok && model->validate) {
    ConfigProblems problems;
    model->validate(m, d->dataset(), data.ok() ? &*data : nullptr, &problems);
    for (std::string& problem : problems) c.Error(std::move(problem));
  }

  if (!data.ok()) return;
  if (model.ok() && model->takes != data->yields) {
    std::vector<std::string> suitable;
    for (const std::string& name : registry.DatasetNames()) {
      absl::StatusOr<DatasetSpec> other = registry.GetDataset(name);
      if (other.ok() && other->yields == model->takes) suitable.push_back(name);
    }
    c.Error(absl::StrCat(
        "model.name ", Quoted(m->name()), " cannot train on data.dataset ", Quoted(d->dataset()),
        ": ", Quoted(m->name()), " takes ", model->takes, " (",
        suitable.empty() ? "no registered dataset yields them"
                         : absl::StrCat("data.dataset ", JoinWords(QuotedAll(suitable), "or")),
        "), ", Quoted(d->dataset()), " yields ", data->yields));
  }
  c.Name(d->mutable_sampler(), "data.sampler", kSamplers, "random");
  if (!d->has_seed()) d->set_seed(kDefaultSeed);

  if (data->token_dtypes.empty()) {
    if (!d->token_dtype().empty()) {
      c.Error(absl::StrCat("data.token_dtype (", Quoted(d->token_dtype()),
                           ") does not apply to data.dataset ", Quoted(d->dataset()),
                           " (it has no tokens)"));
    }
  } else if (data->token_dtypes.size() == 1) {
    const std::string& only = data->token_dtypes[0];
    if (!d->token_dtype().empty() && d->token_dtype() != only) {
      c.Error(absl::StrCat("data.token_dtype (", Quoted(d->token_dtype()), ") must be ",
                           Quoted(only), " for data.dataset ", Quoted(d->dataset())));
    }
    d->set_token_dtype(only);
  } else {
    c.Name(d->mutable_token_dtype(), "data.token_dtype", data->token_dtypes,
           data->default_token_dtype);
  }
  if (!data->path_needed.empty() && d->path().empty()) {
    c.Error(absl::StrCat("data.path is empty: data.dataset ", Quoted(d->dataset()), " needs ",
                         data->path_needed));
  }
}

// The parallel section against the world size: fills in data, and returns the data-parallel
// size (the world size when there is no section). Impossible layouts are one line each.
int CheckParallel(Checker& c, TrainConfig* cfg, int world) {
  if (!cfg->has_parallel()) return world;
  ParallelConfig* p = cfg->mutable_parallel();
  if (!p->has_tensor()) p->set_tensor(1);
  if (!p->has_pipeline()) p->set_pipeline(1);
  bool ok = c.Positive("parallel.tensor", p->tensor());
  ok &= c.Positive("parallel.pipeline", p->pipeline());
  if (p->has_data()) ok &= c.Positive("parallel.data", p->data());
  if (!ok) return world;
  const int tp = p->tensor() * p->pipeline();
  if (!p->has_data()) {
    if (world % tp != 0) {
      c.Error(absl::StrCat("parallel.tensor (", p->tensor(), ") x parallel.pipeline (",
                           p->pipeline(), ") = ", tp, " does not divide the ", world,
                           " processes; change the sizes or the number of processes"));
      return world;
    }
    p->set_data(world / tp);
  }
  if (tp * p->data() != world) {
    c.Error(absl::StrCat("parallel layout tensor ", p->tensor(), " x pipeline ", p->pipeline(),
                         " x data ", p->data(), " = ", tp * p->data(), " ranks, but there are ",
                         world, " processes; make the product equal the number of processes"));
    return world;
  }
  StrategyConfig* s = cfg->mutable_strategy();
  if (p->pipeline() > 1) {
    if (s->name().empty()) s->set_name("pipeline");
    auto stages = s->options().find("stages");
    if (stages != s->options().end() && stages->second != absl::StrCat(p->pipeline())) {
      c.Error(absl::StrCat("strategy.options stages (", stages->second,
                           ") disagrees with parallel.pipeline (", p->pipeline(),
                           "); give the stage count once, in parallel.pipeline"));
    }
    (*s->mutable_options())["stages"] = absl::StrCat(p->pipeline());
  }
  if (p->sequence_parallel() && p->tensor() == 1) {
    c.Error("parallel.sequence_parallel splits activations over the tensor-parallel group, but "
            "parallel.tensor is 1; set parallel.tensor > 1 or turn it off");
  }
  if (p->tensor() > 1) {
    const std::string& name = s->name();
    if (name == "dp" || name == "paramserver") {
      c.Error(absl::StrCat("strategy.name ", Quoted(name),
                           " cannot run under tensor parallelism (it keeps whole replicas); use "
                           "\"ddp\", \"zero\" or \"pipeline\""));
    }
    if (cfg->zero_optimization().stage() == 3) {
      c.Error("zero_optimization.stage 3 with parallel.tensor > 1 is not supported: tensor "
              "parallelism slices each parameter from its full initial value; use stage 1 or 2");
    }
    if (cfg->fp16().enabled() || cfg->bf16().enabled()) {
      c.Error(absl::StrCat(cfg->fp16().enabled() ? "fp16" : "bf16",
                           ".enabled with parallel.tensor > 1 is not supported yet: the "
                           "tensor-parallel layers compute in f32; turn one of them off"));
    }
  }
  return p->data();
}

void CheckRun(Checker& c, TrainConfig* cfg, int dp) {
  if (!cfg->has_steps()) cfg->set_steps(kDefaultSteps);
  c.Positive("steps", cfg->steps());
  if (!cfg->has_gradient_clipping()) cfg->set_gradient_clipping(0);
  c.NonNegativeReal("gradient_clipping", cfg->gradient_clipping());

  StrategyConfig* s = cfg->mutable_strategy();
  if (s->name().empty()) {
    if (!s->path().empty()) {
      c.Error(absl::StrCat("strategy.path (", Quoted(s->path()),
                           ") is set but strategy.name is "
                           "not; name the strategy that the plugin registers"));
    }
    // The default trains on any world size: one process alone, data parallel otherwise (the
    // training program prints the strategy it runs with at start).
    s->set_name(DefaultStrategyName(dp));
  }
  if (s->name() == "single" && dp > 1) {
    c.Error(
        absl::StrCat("strategy.name \"single\" trains one process, but the data-parallel size "
                     "is ",
                     dp, "; set strategy.name to a data-parallel strategy"));
  }

  std::string* device = cfg->mutable_device();
  if (device->empty()) *device = "cpu";
  if (*device == "cuda") *device = "cuda:0";
  int index = 0;
  if (*device != "cpu" &&
      !(absl::StartsWith(*device, "cuda:") && absl::SimpleAtoi(device->substr(5), &index) &&
        index >= 0 && device->substr(5) == absl::StrCat(index))) {
    c.Error(absl::StrCat("device ", Quoted(*device),
                         " is unknown; known: \"cpu\", \"cuda\", \"cuda:N\" (N = 0, 1, ...)"));
  }
  if (cfg->communicator().empty()) {
    cfg->set_communicator(absl::StartsWith(*device, "cuda") ? "nccl" : "gloo");
  }
  if (!cfg->has_collective_timeout_s()) cfg->set_collective_timeout_s(300);
  c.Positive("collective_timeout_s", cfg->collective_timeout_s());
  if (!cfg->has_threads()) cfg->set_threads(1);
  c.Positive("threads", cfg->threads());
  if (!cfg->has_seed()) cfg->set_seed(kDefaultSeed);

  if (cfg->has_checkpoint()) {
    CheckpointConfig* k = cfg->mutable_checkpoint();
    if (k->dir().empty()) c.Error("checkpoint.dir is empty; name the folder the checkpoints go to");
    if (!k->has_every_steps()) k->set_every_steps(0);
    if (k->every_steps() < 0) {
      c.Error(absl::StrCat("checkpoint.every_steps (", k->every_steps(),
                           ") must be >= 0 (0: only after the last step)"));
    }
    if (!k->has_keep_last()) k->set_keep_last(2);
    c.Positive("checkpoint.keep_last", k->keep_last());
    if (!k->has_resume()) k->set_resume(true);
  }

  LogConfig* log = cfg->mutable_log();
  if (!log->has_print_every()) log->set_print_every(kDefaultPrintEvery);
  c.Positive("log.print_every", log->print_every());
}

}  // namespace

// -------------------------------------------------------------------------------------------------
// Public API

absl::StatusOr<TrainConfig> ParseTextConfig(const std::string& text, const std::string& origin) {
  TrainConfig cfg;
  pb::TextFormat::Parser parser;
  TextErrorCollector errors(text, origin);
  parser.RecordErrorsTo(&errors);
  parser.AllowUnknownField(false);
  if (!parser.ParseFromString(text, &cfg)) {
    std::string message = errors.Errors();
    if (message.empty())
      message = absl::StrCat(origin, ": not a valid text-format training config");
    return absl::InvalidArgumentError(message);
  }
  return cfg;
}

absl::StatusOr<TrainConfig> ParseJsonConfig(const std::string& text, const std::string& origin) {
  TrainConfig cfg;
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = pb::util::JsonStringToMessage(text, &cfg, options);
  if (!status.ok()) {
    std::string message(status.message().data(), status.message().size());
    return absl::InvalidArgumentError(DescribeJsonError(text, origin, message));
  }
  return cfg;
}

absl::StatusOr<TrainConfig> LoadConfigFile(const std::string& path) {
  const std::string lower = absl::AsciiStrToLower(path);
  const bool json = absl::EndsWith(lower, ".json");
  const bool text = absl::EndsWith(lower, ".pbtxt") || absl::EndsWith(lower, ".textproto") ||
                    absl::EndsWith(lower, ".txt");
  if (!json && !text) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config file ", Quoted(path),
        ": unknown extension; use .json for JSON or .pbtxt, .textproto or .txt for text format"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("config file ", Quoted(path), " cannot be read"));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("config file ", Quoted(path), ": read error"));
  }
  return json ? ParseJsonConfig(contents.str(), path) : ParseTextConfig(contents.str(), path);
}

std::string ConfigToText(const TrainConfig& cfg) {
  std::string out;
  pb::TextFormat::PrintToString(cfg, &out);
  return out;
}

std::string ConfigToJson(const TrainConfig& cfg) {
  std::string out;
  pb::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;  // DeepSpeed's snake_case names
  auto status = pb::util::MessageToJsonString(cfg, &out, options);
  BRAID_CHECK(status.ok()) << "printing a TrainConfig as JSON: " << status.ToString();
  return out;
}

std::string ZeroFeatureName(int stage) { return absl::StrCat("zero", stage); }

std::vector<std::string> RequestedFeatures(const TrainConfig& cfg) {
  std::vector<std::string> features;
  if (cfg.fp16().enabled()) features.push_back(kFeatureFp16);
  if (cfg.bf16().enabled()) features.push_back(kFeatureBf16);
  const int stage = cfg.zero_optimization().stage();
  if (stage >= 1 && stage <= 3) features.push_back(ZeroFeatureName(stage));
  return features;
}

std::string DefaultStrategyName(int data_parallel_size) {
  return data_parallel_size > 1 ? "ddp" : "single";
}

absl::Status ValidateConfig(TrainConfig* cfg, int data_parallel_size,
                            const std::vector<std::string>& available_features) {
  StrategyCatalog catalog;
  catalog.features_of = [&](const std::string&) { return available_features; };
  catalog.providers_of = [](const std::string& feature) {
    FeatureProviders found;
    for (auto& [name, origin] : Registry::Get().StrategiesProviding(feature)) {
      found.strategies.push_back({name, origin});
    }
    return found;
  };
  return ValidateConfigWith(cfg, data_parallel_size, catalog);
}

absl::Status ValidateConfigWith(TrainConfig* cfg, int data_parallel_size,
                                const StrategyCatalog& strategies) {
  if (data_parallel_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-parallel size (", data_parallel_size, ") must be >= 1"));
  }
  // A schedule's peak rate given alone sets the optimizer's rate (they are one number).
  const SchedulerConfig& sched = cfg->scheduler();
  if (absl::EqualsIgnoreCase(sched.type(), "WarmupCosine") && sched.params().has_warmup_max_lr() &&
      !cfg->optimizer().params().has_lr()) {
    cfg->mutable_optimizer()->mutable_params()->set_lr(sched.params().warmup_max_lr());
  }
  Checker c;
  const int dp = CheckParallel(c, cfg, data_parallel_size);
  CheckBatch(c, cfg, dp);
  CheckRun(c, cfg, dp);
  CheckOptimizer(c, cfg);
  CheckScheduler(c, cfg);
  CheckFeatures(c, cfg, strategies);
  CheckActivationCheckpointing(c, cfg);
  CheckModelAndData(c, cfg);
  return c.Status();
}

}  // namespace braid::config
