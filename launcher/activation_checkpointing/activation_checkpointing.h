// Activation (gradient) checkpointing (Chen et al. 2016): a checkpointed module keeps only its
// input for backward and recomputes the rest when backward reaches it, trading one extra forward
// of that module for the memory of everything its ops would have saved.
//
// How (non-reentrant, in the manner of PyTorch's torch.utils.checkpoint(use_reentrant=False)):
// the module's forward is replaced (Module::ReplaceForward) by one that runs the original forward
// normally, building the ordinary autograd graph, but inside a SavedTensorHooksScope whose pack
// keeps a numbered placeholder instead of each tensor an op saves. The first placeholder backward
// unpacks makes the checkpoint run the forward again from the kept input, under a scope whose
// pack records what the ops save, in the same order; unpack(i) then hands out the i-th recorded
// tensor and drops the checkpoint's reference, so the recomputed activations are freed as
// backward consumes them. The graph backward runs is the original one (same nodes, same order,
// same values), so gradients are bitwise those of the plain model.
//
// A segment is several consecutive modules (blocks) checkpointed together: one input kept for
// all of them, all recomputed at once. The `sqrt` policy uses ~√n segments of ~√n blocks. The
// policy's last segment is kept, not recomputed, by default: backward needs it first
// (CheckpointPolicy::checkpoint_last_segment).
//
// Rules the implementation relies on, checked where they can be:
// - Ops save the same tensors, in the same order, when the forward is run again. Braid's ops do;
//   the recompute fails loudly (naming the module) when the count or a shape differs.
// - Replay is exact because Braid's ops keep no random state: ops::Dropout's mask is a function
//   of (seed, element index, p), so the recompute, called with the same seed, draws the same
//   mask (ops_llama_checkpoint_test beside this file). An op that draws from a generator must
//   register it with SetCheckpointRngState, so the recompute replays the same draws.
// - Blocks of a segment feed each other directly (block k+1's input is block k's output, as in
//   GPT's layer stack). When they do not (a pipeline stage boundary cuts a segment, or something
//   runs between the two blocks), the segment splits there by itself.
// - Checkpoints do not nest: EnableActivationCheckpointing refuses a module inside, or around, one
//   already checkpointed.
#ifndef BRAID_LAUNCHER_ACTIVATION_CHECKPOINTING_ACTIVATION_CHECKPOINTING_H_
#define BRAID_LAUNCHER_ACTIVATION_CHECKPOINTING_ACTIVATION_CHECKPOINTING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/module.h"

namespace braid {

namespace config {
class ActivationCheckpointingConfig;  // launcher/config/train_config.proto
}
class KeptInputs;  // kept_inputs.h

// Which modules of a model are checkpointed, over its n blocks (Module::NamedBlocks, in order).
struct CheckpointPolicy {
  enum class Kind {
    // ⌈√n⌉ segments of consecutive blocks, lengths differing by at most one (longer first):
    // n = 8 gives 3 + 3 + 2, n = 32 gives 6 + 6 + 5 + 5 + 5 + 5. Kept: one input per segment;
    // recomputed in backward: one segment at a time, so activation memory grows as √n.
    kSqrt,
    kEveryBlock,  // each block alone: n inputs kept, one block's activations recomputed at once
    kEveryK,      // blocks 0, k, 2k, ... each alone; the others keep their activations
    kAttention,   // the `attn` child of each block alone (selective: the attention's activations)
  };
  Kind kind = Kind::kSqrt;
  int every_k = 0;  // kEveryK only, >= 1
  // Whether the last segment is recomputed when it ends at the model's last block. By default it
  // is not (Megatron and DeepSpeed skip it too): backward starts there right after the forward,
  // so recomputing it would rebuild at once what the forward had just dropped, for one more
  // forward of those blocks. It is left as it is instead: its ops' saved tensors stay, and the
  // engine frees each once its node ran, as it frees recomputed ones. The peak is the same, or
  // higher by at most that segment's saved tensors where the loss and head's backward is the
  // peak (selective attention: one attention's, in the unit test). True
  // where backward does not follow the forward at once (a GPipe schedule's last stage runs every
  // micro-batch's forward first), and in tests of the recompute on one-block models.
  bool checkpoint_last_segment = false;
  // Where each segment keeps its input until the recompute (kept_inputs.h: this rank's slice
  // under partition_activations, host memory under cpu_checkpointing, and the bytes held).
  // Null: the input itself, on its device, uncounted.
  std::shared_ptr<KeptInputs> kept_inputs;

  // "sqrt", "every_block", "every_k, k=2", "attention".
  std::string ToString() const;
};

// The policy names a config may give, in the order the documentation lists them.
const std::vector<std::string>& CheckpointPolicyNames();

// `name` is one of CheckpointPolicyNames, any case ("" = "sqrt"); `every_k` is required by
// "every_k" and refused by the others. Errors name the config field and what to give instead.
absl::StatusOr<CheckpointPolicy> ParseCheckpointPolicy(const std::string& name,
                                                       std::optional<int> every_k);
absl::StatusOr<CheckpointPolicy> CheckpointPolicyFromConfig(
    const config::ActivationCheckpointingConfig& section);

// The segments `policy` recomputes of `num_blocks` blocks: each a list of consecutive block
// indices (for kAttention, the blocks whose `attn` is checkpointed). Without
// checkpoint_last_segment, a last segment that ends at block num_blocks - 1 is left out (it is
// kept, not recomputed).
std::vector<std::vector<int>> PlanCheckpointSegments(int num_blocks, const CheckpointPolicy& policy);

// What EnableActivationCheckpointing did, for the training program's line.
struct CheckpointingSummary {
  CheckpointPolicy policy;
  int modules = 0;   // modules whose forward is now replaced (blocks, or their attn)
  int covered = 0;   // blocks with (some of) their activations recomputed
  int blocks = 0;    // blocks of the model
  int segments = 0;  // recomputed segments: inputs kept per forward (none split at run time)
  int last_kept = 0;  // blocks of the last segment, kept and not recomputed (checkpoint_last_segment)
  // "6 of 8 blocks in 2 segments (policy sqrt; the last 2 blocks kept, not recomputed: backward
  // starts there)".
  std::string ToString() const;
};

// Checkpoints `model`'s blocks by `policy`. Call it on the model in its final form (after a
// strategy's Setup: tensor parallelism has split it, the pipeline has cut it); a block's forward
// already replaced is kept and checkpointed as it is. Errors: a model without blocks, a block
// without `attn` (policy attention), a module already checkpointed.
absl::StatusOr<CheckpointingSummary> EnableActivationCheckpointing(Module& model,
                                                                   const CheckpointPolicy& policy);

// Checkpoints `modules` (name, module), consecutive modules each fed the previous one's output,
// as one segment, its input kept by `kept_inputs` (null: as it is). What
// EnableActivationCheckpointing does per segment; open for other layouts.
absl::Status CheckpointSegment(const std::vector<std::pair<std::string, Module*>>& modules,
                               std::shared_ptr<KeptInputs> kept_inputs = nullptr);

// Restores the forward of every checkpointed module under `model` (including itself) to what it
// was before; returns how many were restored.
int DisableActivationCheckpointing(Module& model);

// Whether `m`'s forward is checkpointed.
bool IsActivationCheckpointed(const Module& m);

// This thread's counts, for tests and benchmarks.
struct ActivationCheckpointStats {
  int64_t forwards = 0;      // segment forwards that kept only their input (grad mode on)
  int64_t recomputes = 0;    // segment forwards run again during backward
  int64_t placeholders = 0;  // saved tensors replaced by placeholders
};
ActivationCheckpointStats GetActivationCheckpointStats();
void ResetActivationCheckpointStats();

// How to read and restore the state of a random generator that ops draw from, so a recompute
// replays the draws of the forward it repeats. Process-wide; empty functions (the default):
// nothing to replay, which is exact today because no Braid op keeps random state (dropout's
// mask is a function of its seed).
struct CheckpointRngState {
  std::function<std::shared_ptr<void>()> save;
  std::function<void(const std::shared_ptr<void>&)> restore;
};
void SetCheckpointRngState(CheckpointRngState state);

}  // namespace braid

#endif  // BRAID_LAUNCHER_ACTIVATION_CHECKPOINTING_ACTIVATION_CHECKPOINTING_H_
