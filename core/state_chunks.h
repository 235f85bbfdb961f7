// The training state a rank holds, as chunks of global tensors: what a sharded checkpoint writes
// (each rank its own chunks) and reads back into any other layout (each rank the elements its
// chunks need, from whichever ranks wrote them). PyTorch DCP's planner and metadata are the model.
//
// A chunk's place in its global tensor is a list of runs: [begin, end) ranges of the global
// tensor's row-major flat index, whose concatenation is the local tensor's elements in order.
// Every layout Braid has is such a list: a whole tensor is one run, a ZeRO piece one run, a
// tensor-parallel slice of rows one run per chunk, a slice of columns one run per row (and a ZeRO
// piece of such a slice, runs mapped through it).
#ifndef BRAID_CORE_STATE_CHUNKS_H_
#define BRAID_CORE_STATE_CHUNKS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/module.h"
#include "core/optimizer.h"
#include "core/tensor.h"

namespace braid {

using Runs = std::vector<std::pair<int64_t, int64_t>>;

struct StateChunk {
  std::string name;    // global tensor: "h.0.mlp.c_fc.weight", "optimizer/<param>/exp_avg", ...
  Shape global_shape;  // of the whole tensor
  Runs runs;           // where `local`'s elements sit in it (sum of lengths = local.numel())
  Tensor local;        // aliases the live state: reading it saves, writing it loads
  // False where another rank holds (and writes) the same elements: data-parallel replicas.
  bool write = true;
};

int64_t RunsLength(const Runs& runs);

// The whole of `t` as one chunk of global tensor `name` (shape = t's).
StateChunk WholeChunk(const std::string& name, const Tensor& t, bool write = true);

// Maps runs given in the flat index of a part of a global tensor (a tensor-parallel slice, say)
// into the global flat index, through `part_to_global`, which gives for a part index the runs of
// the global tensor that [begin, end) of the part covers, in order.
Runs MapRuns(const Runs& in_part, const std::function<Runs(int64_t begin, int64_t end)>& part_to_global);

// Overlap of two run lists: for every element both hold, (position in a's local order, position
// in b's local order, length) triples, in a's order.
struct Overlap {
  int64_t a_at, b_at, length;
};
std::vector<Overlap> Intersect(const Runs& a, const Runs& b);

// The optimizer's state as chunks: for each parameter it steps that `chunk_of` places (the chunk
// holding that parameter tensor, or null to leave it out), one chunk per slot named
// "optimizer/<global name>/<slot>" with the parameter's runs; plus "optimizer/step" (one value,
// written by `write_step`). With `create`, state that does not exist yet is made (for loading).
std::vector<StateChunk> OptimizerStateChunks(
    Optimizer& optimizer, const std::function<const StateChunk*(const Tensor& param)>& chunk_of,
    bool create, bool write_step);

// After loading: sets the optimizer's step count from the "optimizer/step" chunk in `chunks`
// (no-op when absent).
void RestoreOptimizerStep(Optimizer& optimizer, const std::vector<StateChunk>& chunks);

// Chunks for a strategy that holds the whole model and steps whole parameters (single, DDP):
// every parameter and buffer whole, and the optimizer's state for each; `write` false on ranks
// whose copy another rank writes (DDP's replicas other than rank 0).
std::vector<StateChunk> WholeModelChunks(Module& model, Optimizer& optimizer, bool create,
                                         bool write);

}  // namespace braid

#endif  // BRAID_CORE_STATE_CHUNKS_H_
