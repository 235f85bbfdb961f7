// DeepSpeed's config keys that have no field of Braid's own, each with what Braid does with it.
//
// A DeepSpeed JSON is read as a TrainConfig (launcher/config/train_config.proto), whose fields carry
// DeepSpeed's names where they mean the same (kind 1, implemented). Every other key of
// DeepSpeed's config reference (its docs/_pages/config-json.md and the keys its runtime reads)
// is in this table, as one of:
//   - kNoted: accepted, because it only tunes DeepSpeed's own implementation or already is what
//     Braid does; noted once at start with `note` (kind 2);
//   - kRefused: a DeepSpeed feature Braid does not have; refused naming `note` (the feature)
//     and `nearest` (the closest thing Braid has), unless its value switches it off (kind 3);
//   - kMapped: read as a Braid field of another name (steps_per_print, cpu_offload, ...).
// The JSON reader (config_json_keys.cc) consults it for each key protobuf does not know; a key
// in neither is an unknown field, with a "did you mean" among both.
#ifndef BRAID_LAUNCHER_CONFIG_DEEPSPEED_KEYS_H_
#define BRAID_LAUNCHER_CONFIG_DEEPSPEED_KEYS_H_

#include <string>
#include <vector>

namespace braid::config {

enum class DeepSpeedKeyKind { kNoted, kRefused, kMapped };

// `accepted`, for a kRefused key: kSwitchedOff accepts what switches a DeepSpeed feature off
// (false, a number <= 1 such as a partition size of 1 or DeepSpeed's -1, a section whose
// "enabled" is false, or with no "enabled" where `off_unless_enabled`); kNever accepts nothing.
inline constexpr char kSwitchedOff[] = "<switched off>";
inline constexpr char kNever[] = "<never>";

struct DeepSpeedKey {
  const char* path;  // dotted, from the config's root: "zero_optimization.sub_group_size"
  DeepSpeedKeyKind kind;
  // kNoted: the only value accepted, as a JSON literal (true, false, -1, 1, "fp32"), or null for
  // any; another value is refused with the note. kRefused: kSwitchedOff, kNever or a literal.
  const char* accepted;
  const char* note;     // kNoted, kMapped: what Braid does instead; kRefused: the feature
  const char* nearest;  // kRefused: the nearest thing Braid has
  bool off_unless_enabled = false;  // kRefused sections whose "enabled" defaults to false
  // For a section (an object) Braid has no message for: its keys, space-separated, each
  // checked like a field ("did you mean" for a typo); null: its content is not checked.
  const char* children = nullptr;
};

// The whole table, in DeepSpeed's order of sections.
const std::vector<DeepSpeedKey>& DeepSpeedKeys();
// The entry for `path`, or null.
const DeepSpeedKey* FindDeepSpeedKey(const std::string& path);
// The keys of section `path` (its `children`, split), empty if it lists none.
std::vector<std::string> DeepSpeedSectionKeys(const std::string& path);

}  // namespace braid::config

#endif  // BRAID_LAUNCHER_CONFIG_DEEPSPEED_KEYS_H_
