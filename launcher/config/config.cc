// Validating a parsed training config (the second step in config.h): ValidateConfigWith and
// the checks of the batch sizes, run settings, optimizer, scheduler, activation checkpointing,
// model and data. Parsing is in config_parse.cc; the checks that ask about strategies (parallel
// layout, feature sections) are in config_strategy.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/registry.h"
#include "google/protobuf/descriptor.h"
#include "launcher/activation_checkpointing/activation_checkpointing.h"
#include "launcher/config/config.h"
#include "launcher/config/config_internal.h"

namespace braid::config {
namespace {

namespace pb = google::protobuf;

using internal::CheckFeatures;
using internal::CheckOptimizer;
using internal::CheckScheduler;
using internal::Checker;
using internal::CheckParallel;
using internal::Has;
using internal::SetFields;
using internal::JoinWords;
using internal::Num;
using internal::Quoted;

constexpr int kDefaultMicroBatch = 16;
constexpr int kDefaultSteps = 200;
constexpr uint64_t kDefaultSeed = 1234;
constexpr int kDefaultPrintEvery = 10;

// Models, datasets and optimizers, and their defaults, come from the registry (core/registry.h).
const std::vector<std::string> kSamplers = {"random", "sequential"};

std::vector<std::string> QuotedAll(const std::vector<std::string>& words) {
  std::vector<std::string> out;
  for (const std::string& w : words) out.push_back(Quoted(w));
  return out;
}


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

// activation_checkpointing needs no strategy feature: the training program applies it to the
// model after any strategy's Setup (launcher/activation_checkpointing/activation_checkpointing.h). Fills in the policy.
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
  // DeepSpeed's options about where kept inputs live, implemented by the training program
  // (launcher/activation_checkpointing/kept_inputs.h): partition_activations splits them over the
  // tensor-parallel group, cpu_checkpointing keeps a GPU's in host memory. Where they can change
  // nothing (no tensor-parallel group; sequence parallelism's inputs, split along the sequence
  // already; a CPU run, whose inputs are in host memory already) they are accepted with a note.
  const bool tensor_parallel = cfg->has_parallel() && cfg->parallel().tensor() > 1;
  if (a->partition_activations()) {
    if (!tensor_parallel) {
      cfg->add_ignored_fields("activation_checkpointing.partition_activations");
    } else if (cfg->parallel().sequence_parallel()) {
      cfg->add_ignored_fields("activation_checkpointing.partition_activations (sequence_parallel)");
    }
  }
  if (a->cpu_checkpointing() && absl::StartsWith(cfg->device(), "cpu")) {
    cfg->add_ignored_fields("activation_checkpointing.cpu_checkpointing");
  }
  // It only fights DeepSpeed's own fragmentation: kind 2, a note.
  if (a->contiguous_memory_optimization()) {
    cfg->add_ignored_fields("activation_checkpointing.contiguous_memory_optimization");
  }
}

// model.options against the model's declared options: known keys, values of the declared kind.
// Ranges are the model's validate hook's to check.
bool CheckModelOptions(Checker& c, const ModelSpec& spec, const ModelConfig& m) {
  std::vector<std::string> declared;
  for (const ModelOption& o : spec.options) declared.push_back(o.name);
  bool ok = true;
  // By key, so the messages come in the same order whatever order the map iterates in.
  std::map<std::string, std::string> options(m.options().begin(), m.options().end());
  for (const auto& [key, value] : options) {
    auto it = std::find_if(spec.options.begin(), spec.options.end(),
                           [&key = key](const ModelOption& o) { return o.name == key; });
    const std::string field = absl::StrCat("model.options ", Quoted(key));
    if (it == spec.options.end()) {
      ok = false;
      c.Error(absl::StrCat(field, " does not apply to model ", Quoted(m.name()),
                           declared.empty()
                               ? " (it takes no options)"
                               : absl::StrCat(" (it takes ", JoinWords(declared, "and"), ")")));
      continue;
    }
    int64_t i = 0;
    double d = 0;
    const char* want = nullptr;
    switch (it->kind) {
      case ModelOption::Kind::kInt:
        if (!absl::SimpleAtoi(value, &i)) want = "an integer";
        break;
      case ModelOption::Kind::kFloat:
        if (!absl::SimpleAtod(value, &d) || !std::isfinite(d)) want = "a finite number";
        break;
      case ModelOption::Kind::kBool:
        if (value != "true" && value != "false") want = "true or false";
        break;
      case ModelOption::Kind::kString:
        break;
    }
    if (want != nullptr) {
      ok = false;
      c.Error(absl::StrCat(field, " (", Quoted(value), ") must be ", want));
    }
  }
  return ok;
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
  for (const pb::FieldDescriptor* f : SetFields(*m, {"name", "options", "path"})) {
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
  if (model.ok()) fields_ok &= CheckModelOptions(c, *model, *m);
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

// `state_holder`: the layer that holds the training state (the data axis's), whose features the
// sections need; the named strategy unless it names another axis's layer (the pipeline).
void CheckRun(Checker& c, TrainConfig* cfg, int dp, bool layout_ok, const StrategyCatalog& catalog,
              std::string* state_holder) {
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
  }
  // The composer fills in the strategy of a config that names none (the training program
  // prints the stack it runs with at start) and refuses a layout no stack serves.
  if (catalog.compose && layout_ok && (!s->name().empty() || s->path().empty())) {
    const ParallelConfig& p = cfg->parallel();
    absl::StatusOr<std::string> chosen = catalog.compose(
        cfg->has_parallel() ? p.tensor() : 1, cfg->has_parallel() ? p.pipeline() : 1, dp, s->name(),
        RequestedFeatures(*cfg));
    if (chosen.ok()) {
      if (s->name().empty()) s->set_name(*chosen);
      *state_holder = *chosen;
    } else {
      c.Error(std::string(chosen.status().message()));
    }
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

  if (cfg->has_eval()) {
    EvalConfig* e = cfg->mutable_eval();
    if (!e->has_every_steps()) e->set_every_steps(0);
    if (e->every_steps() < 0) {
      c.Error(absl::StrCat("eval.every_steps (", e->every_steps(),
                           ") must be >= 0 (0: only after the last step)"));
    }
    if (!e->has_batches()) e->set_batches(8);
    c.Positive("eval.batches", e->batches());
    // A validation loss needs a validation split; the dataset says when it has none.
    absl::StatusOr<DatasetSpec> data = Registry::Get().GetDataset(cfg->data().dataset());
    if (data.ok() && !data->eval_refused.empty()) {
      c.Error(absl::StrCat("eval does not apply to data.dataset ", Quoted(cfg->data().dataset()),
                           ": ", data->eval_refused));
    }
  }

  LogConfig* log = cfg->mutable_log();
  if (!log->has_print_every()) log->set_print_every(kDefaultPrintEvery);
  c.Positive("log.print_every", log->print_every());
}

// DeepSpeed's data_types.grad_accum_dtype (recorded by the JSON reader, kGradAccumDtypeEntry)
// against what Braid does: micro-batch gradients are accumulated in the parameters' dtype (f32,
// or bf16/f16 under mixed precision) and up-cast into the f32 masters once per step. The value
// that names that dtype is accepted, and so is "fp32" over a single micro-batch (nothing is
// accumulated: the one half gradient is up-cast once, as with an f32 buffer); any other value
// asks for what Braid does not do and is refused with the nearest setting that it does.
void CheckGradAccumDtype(Checker& c, TrainConfig* cfg) {
  const std::string prefix = absl::StrCat(internal::kGradAccumDtypeEntry, " (");
  for (std::string& entry : *cfg->mutable_ignored_fields()) {
    if (!absl::StartsWith(entry, prefix) || !absl::EndsWith(entry, ")")) continue;
    const std::string v = entry.substr(prefix.size(), entry.size() - prefix.size() - 1);
    if (v.find(':') != std::string::npos) continue;  // already checked
    const std::string params = cfg->bf16().enabled() ? "bf16" : cfg->fp16().enabled() ? "fp16" : "fp32";
    const int accum = cfg->gradient_accumulation_steps();
    const std::string field = absl::StrCat(internal::kGradAccumDtypeEntry, " ", Quoted(v));
    if (v != "fp32" && v != "bf16" && v != "fp16") {
      c.Error(absl::StrCat(field, " is not a dtype gradients are accumulated in; use \"fp32\", "
                           "\"bf16\" or \"fp16\" (Braid accumulates in the parameters' dtype, here ",
                           Quoted(params), ")"));
    } else if (v == params) {
      entry = absl::StrCat(prefix, v, ": the parameters' dtype, which Braid accumulates "
                           "micro-batch gradients in)");
    } else if (v == "fp32" && accum == 1) {
      entry = absl::StrCat(prefix, v, ": one micro-batch per step, so nothing is accumulated; its ",
                           params, " gradients are up-cast into the f32 masters once, as through "
                           "an f32 buffer)");
    } else if (v == "fp32") {
      c.Error(absl::StrCat(
          field, ": Braid accumulates the ", params, " gradients of the ", accum,
          " micro-batches of a step in ", params, " (the parameters' dtype) and up-casts them into "
          "the f32 masters once per step, not in an f32 buffer; nearest: gradient_accumulation_steps "
          "1 with a ", accum, "x larger train_micro_batch_size_per_gpu (nothing accumulated), or "
          "data_types.grad_accum_dtype ", Quoted(params)));
    } else {
      c.Error(absl::StrCat(field, ": the parameters are ", params, " and Braid accumulates gradients "
                           "in the parameters' dtype; nearest: ",
                           params == "fp32" ? absl::StrCat(v, " { enabled: true } (", v,
                                                           " parameters and gradients, f32 masters)")
                                            : absl::StrCat("data_types.grad_accum_dtype ", Quoted(params))));
    }
  }
}

// The field a problem of the training program's starts with ("model.name: ..."): a dotted
// path followed by ':'; "" when it starts otherwise.
std::string LeadingField(const std::string& problem) {
  size_t i = 0;
  while (i < problem.size() && (absl::ascii_isalnum(static_cast<unsigned char>(problem[i])) ||
                                problem[i] == '_' || problem[i] == '.')) {
    ++i;
  }
  return i > 0 && i < problem.size() && problem[i] == ':' ? problem.substr(0, i) : "";
}

}  // namespace

namespace internal {

std::string PlaceProblem(const std::string& problem,
                         const google::protobuf::Map<std::string, std::string>& positions) {
  // The longest path the message starts with, ending where a field name ends: "optimizer.params"
  // (a section) for "optimizer.params.lr (0) ..." when lr itself is not in the file.
  const std::string* best = nullptr;
  size_t best_size = 0;
  for (const auto& [path, position] : positions) {
    if (path.size() <= best_size || !absl::StartsWith(problem, path)) continue;
    const char next = problem.size() > path.size() ? problem[path.size()] : ' ';
    if (absl::ascii_isalnum(static_cast<unsigned char>(next)) || next == '_') continue;
    best = &position;
    best_size = path.size();
  }
  return best == nullptr ? problem : absl::StrCat(*best, ": ", problem);
}

std::pair<int, int> ProblemPosition(const std::string& problem) {
  // "<origin>:<line>:<column>: ": the first ":<digits>:<digits>: " in the message.
  for (size_t i = problem.find(':'); i != std::string::npos; i = problem.find(':', i + 1)) {
    int line = 0, column = 0;
    size_t j = i + 1, digits = 0;
    for (; j < problem.size() && absl::ascii_isdigit(static_cast<unsigned char>(problem[j]));
         ++j, ++digits) {
      line = line * 10 + (problem[j] - '0');
    }
    if (digits == 0 || j >= problem.size() || problem[j] != ':') continue;
    size_t k = j + 1, more = 0;
    for (; k < problem.size() && absl::ascii_isdigit(static_cast<unsigned char>(problem[k]));
         ++k, ++more) {
      column = column * 10 + (problem[k] - '0');
    }
    if (more == 0 || k >= problem.size() || problem[k] != ':') continue;
    return {line, column};
  }
  return {std::numeric_limits<int>::max(), 0};
}

}  // namespace internal

// -------------------------------------------------------------------------------------------------
// Public API

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
  internal::ResolveAutoValues(cfg, strategies.half_support);
  // A schedule's peak rate given alone sets the optimizer's rate (they are one number).
  const SchedulerConfig& sched = cfg->scheduler();
  const bool names_peak = absl::EqualsIgnoreCase(sched.type(), "WarmupCosine") ||
                          absl::EqualsIgnoreCase(sched.type(), "WarmupLR") ||
                          absl::EqualsIgnoreCase(sched.type(), "WarmupDecayLR");
  if (names_peak && sched.params().has_warmup_max_lr() && !cfg->optimizer().params().has_lr()) {
    cfg->mutable_optimizer()->mutable_params()->set_lr(sched.params().warmup_max_lr());
  }
  Checker c;
  bool layout_ok = false;
  const int dp = CheckParallel(c, cfg, data_parallel_size, &layout_ok);
  CheckBatch(c, cfg, dp);
  std::string state_holder;
  CheckRun(c, cfg, dp, layout_ok, strategies, &state_holder);
  CheckOptimizer(c, cfg);
  CheckScheduler(c, cfg);
  CheckFeatures(c, cfg, strategies, state_holder.empty() ? cfg->strategy().name() : state_holder);
  CheckActivationCheckpointing(c, cfg);
  CheckModelAndData(c, cfg);
  CheckGradAccumDtype(c, cfg);
  if (cfg->reader_problems().empty() && cfg->key_positions().empty()) return c.Status();
  // A config read with ReadOptions.defer_to_validation: the reader's problems and these in one
  // message, each at its place in the file, in the file's order (those without a place last).
  // The training program's own problems (a plugin not found, "model.name: ...") come without
  // one: placed like validation's, by the field they start with. A field the program already
  // refused is not refused a second time in validation's words ("model.name \"x\" is unknown").
  std::vector<std::string> all;
  std::set<std::string> refused_fields;
  for (const std::string& problem : cfg->reader_problems()) {
    if (internal::ProblemPosition(problem).first != std::numeric_limits<int>::max()) {
      all.push_back(problem);
      continue;
    }
    if (std::string field = LeadingField(problem); !field.empty()) refused_fields.insert(field);
    all.push_back(internal::PlaceProblem(problem, cfg->key_positions()));
  }
  for (const std::string& problem : c.errors()) {
    const size_t end = problem.find(' ');
    if (end != std::string::npos && refused_fields.count(problem.substr(0, end)) > 0) continue;
    all.push_back(internal::PlaceProblem(problem, cfg->key_positions()));
  }
  cfg->clear_reader_problems();
  cfg->clear_key_positions();
  std::stable_sort(all.begin(), all.end(), [](const std::string& a, const std::string& b) {
    return internal::ProblemPosition(a) < internal::ProblemPosition(b);
  });
  Checker placed;
  for (std::string& problem : all) placed.Error(std::move(problem));
  return placed.Status();
}

namespace internal {

std::vector<const pb::FieldDescriptor*> SetFields(const pb::Message& message,
                                                  const std::vector<std::string>& skip) {
  std::vector<const pb::FieldDescriptor*> set;
  const pb::Descriptor* d = message.GetDescriptor();
  const pb::Reflection* r = message.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (Has(skip, f->name())) continue;
    if (f->is_repeated() ? r->FieldSize(message, f) > 0 : r->HasField(message, f)) set.push_back(f);
  }
  return set;
}

}  // namespace internal

}  // namespace braid::config
