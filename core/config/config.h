// Reading and checking a training configuration (core/config/train_config.proto).
//
// Two steps, because the second needs facts only the launcher knows:
//   1. Parse*/LoadConfigFile: syntax, unknown fields and wrong types. Errors name the origin
//      (file), the line and column where the format gives them, and the field.
//   2. ValidateConfig: fills in defaults and derived values (batch sizes, schedule length, ...)
//      and rejects values that are out of range, unknown names and inconsistent combinations,
//      naming the field(s) and the values. Every problem found is reported at once.
#ifndef BRAID_CORE_CONFIG_CONFIG_H_
#define BRAID_CORE_CONFIG_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/train_config.pb.h"

namespace braid::config {

// Protobuf text format. `origin` (a file name, or e.g. "--config_text") prefixes every error.
absl::StatusOr<TrainConfig> ParseTextConfig(const std::string& text, const std::string& origin);
// JSON (DeepSpeed-style; field names as in the .proto or their lowerCamelCase JSON names).
absl::StatusOr<TrainConfig> ParseJsonConfig(const std::string& text, const std::string& origin);
// Reads `path` and parses it by extension: .json as JSON; .pbtxt, .textproto, .txt as text.
absl::StatusOr<TrainConfig> LoadConfigFile(const std::string& path);

// The config as text format / JSON (e.g. to record the effective config of a run).
std::string ConfigToText(const TrainConfig& cfg);
std::string ConfigToJson(const TrainConfig& cfg);

// Names of plugin-provided features, as listed in ValidateConfig's `available_features`.
inline constexpr char kFeatureFp16[] = "fp16";
inline constexpr char kFeatureBf16[] = "bf16";
inline constexpr char kFeatureActivationCheckpointing[] = "activation_checkpointing";
// ZeRO stage N (1..3) is the feature "zeroN".
std::string ZeroFeatureName(int stage);

// Fills defaults and derived values into `cfg` and checks it for a job with
// `data_parallel_size` ranks. Sections needing a feature (fp16, bf16, zero_optimization.stage
// > 0, activation_checkpointing) are rejected unless the feature's name is in
// `available_features`. Call it once: afterwards the batch-size fields are all set, so calling
// it again with another data-parallel size reports them as inconsistent.
absl::Status ValidateConfig(TrainConfig* cfg, int data_parallel_size,
                            const std::vector<std::string>& available_features);

}  // namespace braid::config

#endif  // BRAID_CORE_CONFIG_CONFIG_H_
