// Internals shared by the sources of //core/config:config, not part of its API (config.h):
// the Checker that collects validation problems with the helpers that word them, and the
// strategy-side checks (config_strategy.cc) that ValidateConfigWith (config.cc) runs. A header
// of its own so that callers of config.h see none of it.
#ifndef BRAID_LAUNCHER_CONFIG_CONFIG_INTERNAL_H_
#define BRAID_LAUNCHER_CONFIG_CONFIG_INTERNAL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launcher/config/config.h"
#include "launcher/config/train_config.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/map.h"
#include "google/protobuf/message.h"

namespace braid::config::internal {

inline std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

// "a", "a and b", "a, b and c" (`last` = "and" or "or").
inline std::string JoinWords(const std::vector<std::string>& words, const std::string& last) {
  if (words.size() <= 1) return absl::StrJoin(words, "");
  std::vector<std::string> head(words.begin(), words.end() - 1);
  return absl::StrCat(absl::StrJoin(head, ", "), " ", last, " ", words.back());
}

inline std::string Num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

class Checker {
 public:
  void Error(std::string message) { errors_.push_back(std::move(message)); }
  bool ok() const { return errors_.empty(); }
  const std::vector<std::string>& errors() const { return errors_; }
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

inline bool Has(const std::vector<std::string>& features, const std::string& name) {
  return std::find(features.begin(), features.end(), name) != features.end();
}

// The checks that ValidateConfigWith (config.cc) runs and config_strategy.cc defines: the
// parallel layout (returns the data-parallel size) and the feature sections.
// `layout_ok`: false when the section is inconsistent (the composer is then not asked).
int CheckParallel(Checker& c, TrainConfig* cfg, int world, bool* layout_ok);
// Feature sections (fp16, zero_optimization, ...) against what `state_holder` declares.
void CheckFeatures(Checker& c, TrainConfig* cfg, const StrategyCatalog& catalog,
                   const std::string& state_holder);
// The fields of `message` that are set: present (optional scalars, messages) or non-empty
// (repeated); those named in `skip` left out (config.cc).
std::vector<const google::protobuf::FieldDescriptor*> SetFields(
    const google::protobuf::Message& message, const std::vector<std::string>& skip);

// The optimizer and scheduler sections (config_optim.cc); CheckScheduler after CheckOptimizer
// (the warm-up peak is the optimizer's rate).
void CheckOptimizer(Checker& c, TrainConfig* cfg);
void CheckScheduler(Checker& c, TrainConfig* cfg);

// "auto" (config_auto.cc). StripAutoValues: `json` without the "auto" values of non-string
// fields, their paths appended to `paths`; `json` itself when it has none (or does not parse:
// the reader then reports why). ResolveAutoValues, first in validation: the "auto" fields whose
// Hugging Face value is not what leaving them out gives (gradient_clipping 1.0, no warm-up,
// fp16/bf16 from `half_support`'s answer for the device).
std::string StripAutoValues(const std::string& json, std::vector<std::string>* paths);
void ResolveAutoValues(TrainConfig* cfg,
                       const std::function<HalfSupport(const std::string&)>& half_support);

// The keys of a JSON config (config_json_keys.cc), checked all at once before protobuf reads
// it: `problems` gets every unknown key (position, "did you mean") and every refused DeepSpeed
// value; `ignored_fields` the DeepSpeed keys accepted without a field here. Returns `json`
// without those keys (DeepSpeed's legacy spellings rewritten as Braid's fields). `text` is the
// file as written, for positions.
// Also every value of the wrong type for its field (a string where a number goes, ...), so that
// those come in the same run too. The unknown and mistyped keys are removed from the returned
// JSON, so the rest reads (ReadOptions.defer_to_validation).
struct JsonKeys {
  std::vector<std::string> problems;
  std::vector<std::string> ignored_fields;
  // "<origin>:<line>:<column>" of each key of the file, by field path (Braid's field names).
  std::map<std::string, std::string> positions;
  bool read = false;  // false: `json` is no JSON object (syntax, a key given twice); unchecked
};
std::string CheckJsonKeys(const std::string& text, const std::string& json,
                          const std::string& origin, JsonKeys* out);
// The note for one TrainConfig.ignored_fields entry.
std::string IgnoredFieldNote(const std::string& entry);
// DeepSpeed's data_types.grad_accum_dtype: the JSON reader records its value as the
// ignored_fields entry "data_types.grad_accum_dtype (<value>)" (and the key's position);
// validation (CheckGradAccumDtype) refuses a dtype Braid does not accumulate in, or rewrites the
// entry to "(<value>: <why it is what Braid does>)" for the note.
inline constexpr char kGradAccumDtypeEntry[] = "data_types.grad_accum_dtype";
// ":line:column" of `"key":` in `text` when it occurs exactly once, else "" (config_parse.cc).
std::string KeyPosition(const std::string& text, const std::string& key);
// ":line:column" of every key of the JSON object `text`, by its path as written ("a.b.c"; keys
// inside arrays are left out), the first where a path repeats (config_parse.cc).
std::map<std::string, std::string> JsonKeyPositions(const std::string& text);
// `problem` (a validation message, which starts with the field it is about) prefixed with the
// position of that field, or of its nearest enclosing section, in `positions`; as it is when
// none is there.
std::string PlaceProblem(const std::string& problem,
                         const google::protobuf::Map<std::string, std::string>& positions);
// The position `problem` starts with ("<origin>:<line>:<column>: "), for sorting: (line,
// column), or past every position when it has none.
std::pair<int, int> ProblemPosition(const std::string& problem);

}  // namespace braid::config::internal

#endif  // BRAID_LAUNCHER_CONFIG_CONFIG_INTERNAL_H_
