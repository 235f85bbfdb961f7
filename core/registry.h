// The process's one registry of named factories: strategies and communicators (from plugins),
// models and datasets (registered by their libraries under models/, linked into the training
// program) and optimizers (core's own, later plugins too). It lives in core, which the host
// program links once and exports to plugins (-rdynamic); a plugin that linked its own copy of
// core would register into an invisible second registry.
//
// Core knows no model, dataset or optimizer by name: the training program (its config validation
// included) looks every name up here.
#ifndef BRAID_CORE_REGISTRY_H_
#define BRAID_CORE_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/batch_source.h"
#include "core/checkpointer.h"
#include "core/communicator.h"
#include "core/device.h"
#include "core/mesh.h"  // kAxis*
#include "core/module.h"
#include "core/optimizer.h"
#include "core/strategy.h"
#include "core/token_decoder.h"

namespace braid {

namespace config {
class ModelConfig;      // core/config/sections.proto
class OptimizerConfig;  // core/config/sections.proto
class Sections;         // core/config/sections.proto
}  // namespace config

// What a strategy implements beyond plain training, declared when it registers; the training
// program composes its stack of layers from these, never from names.
struct StrategyTraits {
  // The features (config sections) it provides, by their section names ("fp16",
  // "bf16", "zero1".."zero3", "communication_data_type"). Validation rejects a section the
  // chosen strategy does not declare.
  std::vector<std::string> features;
  // The mesh axes it serves (kAxis*). Empty means {"data"}: a strategy that replicates or
  // shards the training state over data-parallel ranks, which is what a user's own strategy
  // usually is. A layer serving "tensor" takes the layer below it through Strategy::Wrap.
  std::vector<std::string> axes;
  // Empty when the strategy can be the layer below one that wraps it (tensor parallelism hands
  // it this rank's slices of the model); otherwise the reason it cannot, for the message that
  // refuses such a stack ("it keeps whole replicas of the model").
  std::string cannot_be_wrapped;
  // The most data-parallel ranks it trains (0: any): 1 for a strategy that trains one replica.
  int max_data_ranks = 0;
  // Whether it is the data-axis layer of a config that names no strategy, for one data-parallel
  // rank or for several. The composer asks the registered strategies (it names none itself); at
  // most one may claim each, and a user's plugin may claim one instead of a shipped one.
  enum class DefaultFor { kNone, kOneDataRank, kSeveralDataRanks };
  DefaultFor default_for = DefaultFor::kNone;
};

// The axes `traits` serves, with the default filled in.
std::vector<std::string> ServedAxes(const StrategyTraits& traits);

// Problems a validation hook found, one message each, naming the field and its value
// ("model.n_embd (250) is not a multiple of ..."); ValidateConfig reports them with the others.
using ConfigProblems = std::vector<std::string>;

// A dataset, described by what it yields, so that validation can check a model and the data
// section against it, and how to open its batches.
struct DatasetSpec {
  // What one sample is; a model trains on it if its ModelSpec::takes is the same ("tokens").
  std::string yields;
  // The data.token_dtype values it takes, in the order messages list them; empty: it has no
  // tokens (data.token_dtype must be empty). `default_token_dtype` fills an empty one.
  std::vector<std::string> token_dtypes;
  std::string default_token_dtype;
  // Distinct token values it holds (256 for bytes); 0: it depends on the file.
  int64_t vocab_size = 0;
  // Non-empty: data.path must be set, and this says what it is ("the token file's path").
  std::string path_needed;
  // The dataset of an empty config (at most one dataset may claim it).
  bool is_default = false;
  // What throughput counts in the training program's messages: "tok" (tokens), or "samples"
  // for a dataset of samples that are not sequences.
  std::string unit = "tok";
  // Opens this rank's batches from the validated config (the loader lives with the dataset, so
  // the training program names none). Unset: the program cannot train on it (an error naming it).
  std::function<absl::StatusOr<std::unique_ptr<BatchSource>>(const BatchSourceRequest& request)>
      open;
  // Non-empty: an eval section does not apply to this dataset; validation refuses one with this
  // reason ("it has no validation split of token data: ...").
  std::string eval_refused;
  // The held-out batches an eval section evaluates on (`request.config->eval()` says how many;
  // every rank gets the same), from the dataset's validation split. Unset, or an error (one line
  // saying what to do) where this data has no validation split.
  std::function<absl::StatusOr<std::vector<Batch>>(const BatchSourceRequest& request)>
      validation;
  // Optional: checks the data against a model's vocabulary of `vocab_size` ids before the model
  // is built (a prepared data set reads the largest id from its manifest); one line naming both.
  std::function<absl::Status(const config::Sections& config, int64_t vocab_size)> check_vocab;
};

// One of a model's own hyper-parameters, set as model.options { key: NAME value: "..." }: the
// way a model's shape reaches it without core's config knowing it. Validation refuses a key the
// model does not declare (naming those it does) and a value that is not of `kind`.
struct ModelOption {
  enum class Kind { kInt, kFloat, kBool, kString };
  std::string name;  // "n_kv_head"
  Kind kind = Kind::kInt;
};

// A model: how to build it from its config section, and what its section may hold.
struct ModelSpec {
  // Builds the model from its validated section (`validate` has filled in its defaults) with
  // initialisation seed `seed` on `device`.
  std::function<absl::StatusOr<std::unique_ptr<Module>>(const config::ModelConfig& model,
                                                        uint64_t seed, Device device)>
      build;
  // The ModelConfig fields besides `name` that apply to it ("n_layer", "n_embd", ...); setting
  // any other is an error naming these.
  std::vector<std::string> fields;
  // Its own hyper-parameters (model.options), in the order messages list them. The
  // validate hook fills in their defaults and checks their ranges.
  std::vector<ModelOption> options;
  // Its tensor-parallel plan, as text in the language of plugins/tensor_parallel/plan.h ("" when
  // it has none): the plan lives with the model, the tensor-parallel strategy only applies it.
  std::string tensor_plan;
  // Optional: makes weights written by another program fit the model's names before they are
  // checked and loaded (init_from): drops a tied head's copy that PyTorch and Hugging Face
  // state dicts carry under a name of its own ("lm_head.weight"). `model` is validated.
  std::function<void(const config::ModelConfig& model, std::map<std::string, Tensor>* weights)>
      adapt_weights;
  // Optional: the tokens one sample of its input holds, its context (GPT's and Llama's
  // block_size), from the validated section: the token loaders cut windows this long. Unset: 1,
  // a model of samples rather than sequences.
  std::function<int64_t(const config::ModelConfig& model)> context;
  // Optional: its training loss, of its output against a batch. Unset: cross-entropy over the
  // output's last dimension against batch.targets (next-token prediction and classification).
  CriterionFn loss;
  // The kind of data it trains on: the DatasetSpec::yields of its datasets ("tokens").
  std::string takes;
  // Optional, run after the generic checks passed (accepted fields, all >= 1): fills in the
  // model's defaults (its preset's shape) and appends what is wrong with the combination.
  // `dataset` is data.dataset's description, null when that name is unknown.
  std::function<void(config::ModelConfig* model, const std::string& dataset_name,
                     const DatasetSpec* dataset, ConfigProblems* problems)>
      validate;
  // The model of an empty config (at most one model may claim it).
  bool is_default = false;
  // Optional: the FLOPs of one training step (forward and backward) per token, or per sample
  // for a model that takes samples, from the validated section; the numerator of the MFU the
  // training program reports (none is shown without it). Computed from the config, not from a
  // built model, so a model sharded over ranks still counts whole.
  std::function<double(const config::ModelConfig& model)> train_flops_per_token;
  // Optional: inference with a cache (core/token_decoder.h) over `model`, which this spec's
  // build made, for `batch` sequences. Unset: a program that generates runs the whole context
  // through Forward for each new token (tools/sample).
  std::function<std::unique_ptr<TokenDecoder>(Module& model, int64_t batch)> decoder;
};

// An optimizer: how to build it from the config's optimizer section.
struct OptimizerSpec {
  // Builds it over `groups` (each with its lr and weight decay set) from the validated section.
  std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup> groups,
                                           const config::OptimizerConfig& optimizer)>
      make;
  // The OptimizerParams fields it takes besides lr and weight_decay ("betas", "momentum", ...);
  // setting another is an error naming the optimizers that do take it.
  std::vector<std::string> params;
  // Optional, run after the generic checks: fills in its defaults (weight_decay included, when
  // unset) and appends problems.
  std::function<void(config::OptimizerConfig* optimizer, ConfigProblems* problems)> validate;
  // The optimizer of an empty config (at most one may claim it).
  bool is_default = false;
};

class Registry {
 public:
  static Registry& Get();

  // Fails if the name is taken (two plugins claiming one name is a configuration error).
  // `traits` declares the features the strategy provides.
  absl::Status AddStrategy(const std::string& name, StrategyFactory factory,
                           const std::string& origin = "built-in", StrategyTraits traits = {});
  // The same with the default origin (inside a plugin's register call: that plugin's file).
  absl::Status AddStrategy(const std::string& name, StrategyFactory factory,
                           StrategyTraits traits);
  // Unknown names are an error listing the known ones.
  absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const std::string& name) const;
  bool HasStrategy(const std::string& name) const;
  std::vector<std::string> StrategyNames() const;
  absl::StatusOr<StrategyTraits> GetStrategyTraits(const std::string& name) const;
  // Every registered strategy that declares `feature`, as (name, origin) pairs by name; the
  // origin of a plugin's strategy is the plugin file's path.
  std::vector<std::pair<std::string, std::string>> StrategiesProviding(
      const std::string& feature) const;
  // Every registered strategy that serves mesh axis `axis` (ServedAxes), as (name, origin) pairs.
  std::vector<std::pair<std::string, std::string>> StrategiesServing(const std::string& axis) const;

  // Models (registered by their libraries under models/), same rules. MakeModel builds `name`
  // from its validated config section.
  absl::Status AddModel(const std::string& name, ModelSpec spec,
                        const std::string& origin = "built-in");
  absl::StatusOr<ModelSpec> GetModel(const std::string& name) const;
  absl::StatusOr<std::unique_ptr<Module>> MakeModel(const std::string& name,
                                                    const config::ModelConfig& model,
                                                    uint64_t seed, Device device) const;
  std::vector<std::string> ModelNames() const;
  std::string DefaultModel() const;  // "" if no model claims it

  // Datasets ("moby-dick", registered by models/data), same rules.
  absl::Status AddDataset(const std::string& name, DatasetSpec spec,
                          const std::string& origin = "built-in");
  absl::StatusOr<DatasetSpec> GetDataset(const std::string& name) const;
  std::vector<std::string> DatasetNames() const;
  std::string DefaultDataset() const;

  // Optimizers ("AdamW", "SGD": core/optimizer.cc), same rules.
  absl::Status AddOptimizer(const std::string& name, OptimizerSpec spec,
                            const std::string& origin = "built-in");
  absl::StatusOr<OptimizerSpec> GetOptimizer(const std::string& name) const;
  absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(
      const std::string& name, std::vector<ParamGroup> groups,
      const config::OptimizerConfig& optimizer) const;
  std::vector<std::string> OptimizerNames() const;
  std::string DefaultOptimizer() const;

  // Communicator backends ("gloo", "nccl"), same rules as strategies.
  absl::Status AddCommunicator(const std::string& name, CommunicatorFactory factory,
                               const std::string& origin = "built-in");
  absl::StatusOr<std::unique_ptr<Communicator>> MakeCommunicator(
      const std::string& name, const CommunicatorOptions& options) const;
  bool HasCommunicator(const std::string& name) const;
  std::vector<std::string> CommunicatorNames() const;

  // Checkpointers ("safetensors", from plugins/checkpoint), same rules as strategies.
  absl::Status AddCheckpointer(const std::string& name, CheckpointerFactory factory,
                               const std::string& origin = "built-in");
  absl::StatusOr<std::unique_ptr<Checkpointer>> MakeCheckpointer(
      const std::string& name, const CheckpointOptions& options) const;
  bool HasCheckpointer(const std::string& name) const;

  // LoadPlugin brackets a plugin's register call with these (on one thread): AddStrategy calls
  // in between that keep the default origin are attributed to `plugin`, and their errors are
  // handed back so that the load fails saying why, even if the plugin ignored them.
  void BeginPluginRegistration(const std::string& plugin);
  std::vector<std::string> EndPluginRegistration();

 private:
  Registry() = default;
  // One table per plugin kind; the kinds differ only in their factory's type.
  template <typename Factory>
  struct Table {
    const char* kind;  // "strategy", "communicator": for messages
    const char* hint;  // where entries of this kind come from, for the unknown-name message
    struct Entry {
      Factory factory;
      std::string origin;
    };
    std::map<std::string, Entry> entries;
    std::string default_name;  // the entry that claimed to be the default (specs only)
  };
  template <typename Factory>
  absl::Status Add(Table<Factory>& table, const std::string& name, Factory factory,
                   const std::string& origin);
  template <typename Factory>
  absl::StatusOr<std::pair<Factory, std::string>> Find(const Table<Factory>& table,
                                                       const std::string& name) const;
  template <typename Factory>
  std::vector<std::string> Names(const Table<Factory>& table) const;
  template <typename Factory>
  std::string Default(const Table<Factory>& table) const;

  static constexpr char kFromPlugin[] =
      "comes from a plugin: load it (LoadPlugin / EnsureStrategy) first";
  static constexpr char kFromLibrary[] =
      "registers itself from the library that defines it: link that library into the program";

  mutable std::mutex mu_;
  Table<StrategyFactory> strategies_{"strategy", kFromPlugin, {}, {}};
  std::map<std::string, StrategyTraits> strategy_traits_;  // by name, for registered strategies
  Table<CommunicatorFactory> communicators_{"communicator", kFromPlugin, {}, {}};
  Table<CheckpointerFactory> checkpointers_{"checkpointer", kFromPlugin, {}, {}};
  Table<ModelSpec> models_{"model", kFromLibrary, {}, {}};
  Table<DatasetSpec> datasets_{"dataset", kFromLibrary, {}, {}};
  Table<OptimizerSpec> optimizers_{"optimizer", kFromLibrary, {}, {}};
};

}  // namespace braid

#endif  // BRAID_CORE_REGISTRY_H_
