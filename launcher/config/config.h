// Reading and checking a training configuration (launcher/config/train_config.proto).
//
// Two steps, because the second needs facts only the launcher knows:
//   1. Parse*/LoadConfigFile: syntax, unknown fields and wrong types. Errors name the origin
//      (file), the line and column where the format gives them, and the field.
//   2. ValidateConfig: fills in defaults and derived values (batch sizes, schedule length, ...)
//      and rejects values that are out of range, unknown names and inconsistent combinations,
//      naming the field(s) and the values. Every problem found is reported at once.
//
// Models, datasets and optimizers are not known here by name: validation looks them up in the
// process's registry (core/registry.h), where their libraries registered them (models/,
// core/optimizer.cc), and runs their validation hooks. Feature sections (fp16, zero_optimization,
// ...) are checked against what the chosen strategy declares (StrategyTraits).
#ifndef BRAID_LAUNCHER_CONFIG_CONFIG_H_
#define BRAID_LAUNCHER_CONFIG_CONFIG_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "launcher/config/train_config.pb.h"

namespace braid::config {

// How the readers treat the problems they find.
struct ReadOptions {
  // False: every problem of the keys (unknown, refused, a value of the wrong type) is the
  // reader's error, all in one message. True (the training program's way): those problems go
  // into the config (TrainConfig.reader_problems, with where each key is in key_positions) and
  // the reader returns it, so that ValidateConfigWith reports them together with the value
  // problems it finds, each at its file:line:column, in one message. A file that is no JSON
  // object (a syntax error, a key given twice) is the reader's error either way. The text
  // reader has no problems to defer (protobuf's parser stops at its first), but records
  // key_positions the same way.
  bool defer_to_validation = false;
};

// Protobuf text format. `origin` (a file name, or e.g. "--config_text") prefixes every error.
// The parser stops at its first error (syntax, an unknown field, a value of the wrong type);
// with `options.defer_to_validation` it records where each field is (key_positions), so that
// validation's problems come at their file:line:column as a JSON file's do.
absl::StatusOr<TrainConfig> ParseTextConfig(const std::string& text, const std::string& origin,
                                            const ReadOptions& options = {});
// JSON (DeepSpeed-style; field names as in the .proto or their lowerCamelCase JSON names).
absl::StatusOr<TrainConfig> ParseJsonConfig(const std::string& text, const std::string& origin,
                                            const ReadOptions& options = {});
// Reads `path` and parses it by extension: .json as JSON; .pbtxt, .textproto, .txt as text.
absl::StatusOr<TrainConfig> LoadConfigFile(const std::string& path,
                                           const ReadOptions& options = {});

// The config as text format / JSON (e.g. to record the effective config of a run).
std::string ConfigToText(const TrainConfig& cfg);
std::string ConfigToJson(const TrainConfig& cfg);

// What plugins and models read of `cfg` (core/config/sections.proto): its fields of the same
// names and numbers, copied (StrategyContext::config, BatchSourceRequest::config).
Sections SectionsOf(const TrainConfig& cfg);

// One line per field a JSON config gave as "auto" (TrainConfig.auto_fields): its value after
// ValidateConfig and where that came from, e.g. `gradient_clipping = 1 ("auto": 1.0, Hugging
// Face's max_grad_norm default)`; then one per DeepSpeed key accepted without effect or read
// as Braid's field (TrainConfig.ignored_fields). For the training program to print once, at
// start.
std::vector<std::string> ConfigNotes(const TrainConfig& cfg);

// True when `type` (any case) names an optimizer DeepSpeed configs use that Braid does not
// have ("Lamb", "OneBitAdam", ...): unless a plugin registers it, validation refuses it naming
// the nearest Braid optimizer. For the training program, which looks for an optimizer plugin
// before validation: a plugin not found for such a name is validation's to report.
bool IsDeepSpeedOptimizerBraidLacks(const std::string& type);

// Names of plugin-provided features, as listed in ValidateConfig's `available_features`.
inline constexpr char kFeatureFp16[] = "fp16";
inline constexpr char kFeatureBf16[] = "bf16";
// communication_data_type "fp32": gradients reduced in f32 under fp16/bf16.
inline constexpr char kFeatureCommFp32[] = "communication_data_type";
// ZeRO stage N (1..3) is the feature "zeroN".
std::string ZeroFeatureName(int stage);

// The feature sections `cfg` asks for (fp16, bf16, zeroN), by name. activation_checkpointing is
// not one: the training program applies it under every strategy.
std::vector<std::string> RequestedFeatures(const TrainConfig& cfg);


// A strategy that declares a feature, for the message when the chosen one does not.
struct FeatureProvider {
  std::string strategy;  // its registered name
  std::string origin;    // the plugin file that registered it (or "built-in", ...)
};
struct FeatureProviders {
  std::vector<FeatureProvider> strategies;
  // Plugin files that could not be loaded while looking, each with the reason.
  std::vector<std::string> unloadable;
};

// The half-precision dtypes a device computes in, as its backend says; for "auto" in
// fp16.enabled / bf16.enabled.
struct HalfSupport {
  bool bf16 = false;
  bool fp16 = false;
};

// What validation asks about strategies (and the device). features_of and providers_of are called only when the
// config requests a feature section, with strategy.name after compose has filled it in.
struct StrategyCatalog {
  // The composer (the training program's): given the layout (tensor, pipeline and data sizes,
  // validated), the strategy the config names (empty: none) and the features its sections
  // request (RequestedFeatures: a config that names no strategy gets one that provides them),
  // the strategy that holds the training state — the one the feature sections are checked
  // against and strategy.name is set to — or why no stack of layers serves that layout (a
  // problem of strategy.name, naming the layers). Null: strategy.name is kept as it is.
  std::function<absl::StatusOr<std::string>(int tensor, int pipeline, int data,
                                            const std::string& named,
                                            const std::vector<std::string>& features)>
      compose;
  // The features strategy `name` declares (may load its plugin). An error is reported as a
  // problem of strategy.name.
  std::function<absl::StatusOr<std::vector<std::string>>(const std::string& name)> features_of;
  // The strategies that declare `feature` (the training program loads every plugin on the
  // search path first); called only for a feature the chosen strategy lacks. Null: none known.
  std::function<FeatureProviders(const std::string& feature)> providers_of;
  // Which strategies providers_of looked at, for the message when none provides a feature.
  std::string searched = "registered strategy";
  // For fp16.enabled / bf16.enabled "auto" (Hugging Face's rule: bf16 where the device computes
  // in it, else fp16 where it does that, else off): the device's answer, asked with cfg.device
  // ("cpu" when empty) and only when a config has such an "auto". Null: neither (a CPU).
  std::function<HalfSupport(const std::string& device)> half_support;
};

// Fills defaults and derived values into `cfg` and checks it for a job with
// `data_parallel_size` ranks (the number of processes: with a `parallel` section the
// data-parallel size is its data axis, checked against it). Sections needing a feature (fp16, bf16, zero_optimization.stage
// > 0) are rejected unless the chosen strategy provides the feature;
// the message names the strategies that do. Call it once: afterwards the batch-size fields are
// all set, so calling it again with another data-parallel size reports them as inconsistent.
absl::Status ValidateConfigWith(TrainConfig* cfg, int data_parallel_size,
                                const StrategyCatalog& strategies);

// The same with the chosen strategy's features given as a list; the strategies that provide a
// missing feature are looked up among those registered so far (nothing is loaded).
absl::Status ValidateConfig(TrainConfig* cfg, int data_parallel_size,
                            const std::vector<std::string>& available_features);

}  // namespace braid::config

#endif  // BRAID_LAUNCHER_CONFIG_CONFIG_H_
