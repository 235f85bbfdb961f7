// A tensor-parallel plan: which modules of a model are split, and how. A plan is data, so a
// user parallelizes a new model by writing one (docs/WRITING_A_STRATEGY.md, "Writing a plan"),
// never a second model. One rule per line, `#` starts a comment:
//
//   <module pattern>  <style> [chunks=K]
//   output            vocab_sharded
//
// A pattern is a module name as Module::NamedModules gives it, `*` standing for one dotted
// component ("h.*.mlp.c_fc"). Styles (Megatron-Core's layers, PyTorch's parallelize_module):
//   colwise          weight [out, in] and bias [out] split by output rows (in K equal chunks
//                    split alike: chunks=3 for a fused q|k|v projection, so each rank gets its
//                    heads of each); input through f (identity / all-reduce of the gradient);
//                    the output stays split. A module without parameters of its own (a tied
//                    head) just takes f: its weight is split by its owner's rule.
//   rowwise          weight split by input columns; one all-reduce (g) of the output, then the
//                    bias, replicated, added once.
//   vocab_embedding  weight [V, C] split by rows; lookups outside a rank's rows give zero; g.
//   sequence_slice   (sequence parallelism only) the module's output [T, ...] keeps this rank's
//                    rows of the sequence: position embeddings added to a split sequence.
// `divides <model field>` names a model config field (n_head, n_embd, n_layer) or one of the
// model's options (model.options: n_kv_head) the tensor size must divide, checked at start
// (attention is split by heads). `output vocab_sharded` says the model's output is split over its last dimension (the tied
// head's logits): the loss is then the vocabulary-parallel cross-entropy. `sequence_dim 1` says
// the activations between split layers are [B, T, ...]: sequence parallelism may then split T
// (with it, f and g become all-gather and reduce-scatter along T, and every replicated
// parameter, which then sees only this rank's part of the sequence, has its gradient summed
// over the group as it arrives).
// Every parameter no rule splits is replicated; its gradient is the same on every rank of the
// group (the f and g ops make it so).
#ifndef BRAID_PLUGINS_TENSOR_PARALLEL_PLAN_H_
#define BRAID_PLUGINS_TENSOR_PARALLEL_PLAN_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/communicator.h"
#include "core/module.h"
#include "core/state_chunks.h"
#include "plugins/tensor_parallel/parallel_ops.h"

namespace braid::tensor_parallel {

enum class Style { kColwise, kRowwise, kVocabEmbedding, kSequenceSlice };

struct Rule {
  std::string pattern;
  Style style;
  int chunks = 1;
  int line = 0;  // in the plan's text, for messages
};

struct Plan {
  std::string name;  // "gpt", or the file it came from
  std::vector<Rule> rules;
  bool output_vocab_sharded = false;
  bool sequence_dim_declared = false;  // `sequence_dim 1`
  // `divides n_head`: model config fields the tensor size must divide (attention is split by
  // heads, so a rank must get whole heads), checked against the config at start.
  std::vector<std::string> divides;
};

absl::StatusOr<Plan> ParsePlan(const std::string& text, const std::string& origin);
// The plan a registered model carries (ModelSpec::tensor_plan: the plan lives with the model,
// this plugin only applies it); NotFound when the model is unknown or registers none.
absl::StatusOr<Plan> RegisteredPlan(const std::string& model);
// `spec` is a registered model's name ("gpt-mini": its plan) or a plan file's path.
absl::StatusOr<Plan> LoadPlan(const std::string& spec);

// How one parameter is split: along `dim` (0 or 1) into `chunks` equal chunks, each split
// equally over the group's ranks. `full_shape` is the unsplit shape.
struct ShardSpec {
  int dim = 0;
  int chunks = 1;
  Shape full_shape;
};
using ShardMap = std::map<std::string, ShardSpec>;  // by NamedParameters name

// This rank's part of a full tensor under `spec` (a new tensor on full's device).
Tensor SliceForRank(const Tensor& full, const ShardSpec& spec, int rank, int size);
// Where [begin, end) of this rank's part (its flat index) sits in the full tensor's flat index,
// as runs (core/state_chunks.h).
Runs PartToFull(const ShardSpec& spec, int rank, int size, int64_t begin, int64_t end);

// The full tensor from every rank's part (collective over `group`).
absl::StatusOr<Tensor> GatherFromGroup(const Tensor& local, const ShardSpec& spec,
                                       Communicator& group);

// Applies `plan` to `model` for this rank of `group`: splits the named parameters in place
// (every handle to them now sees this rank's part, under the same name), replaces the matched
// modules' forwards, and gives replicated parameters a gradient-norm share of 1/size. A rule
// that matches nothing, a style that does not fit its module, or a size the group does not
// divide is an error naming the rule and the module, before anything is changed.
// With sequence_parallel (the plan must declare `sequence_dim 1`), activations between the
// split layers are split along the sequence as well.
absl::StatusOr<ShardMap> ApplyPlan(Module& model, const Plan& plan, Communicator& group,
                                   CommCounters* counters, bool sequence_parallel = false);

}  // namespace braid::tensor_parallel

#endif  // BRAID_PLUGINS_TENSOR_PARALLEL_PLAN_H_
