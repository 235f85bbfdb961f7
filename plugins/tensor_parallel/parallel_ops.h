// The differentiable communication of Megatron-style tensor parallelism, over one group:
//   f = CopyToGroup:     identity forward, all-reduce (sum) of the gradient backward; where a
//                         replicated activation enters a column-split layer.
//   g = ReduceFromGroup: all-reduce (sum) forward, identity backward; where a row-split layer's
//                         partial sums leave.
// and the vocabulary-parallel embedding and cross-entropy, which never gather the full vocabulary.
// Every collective waits with the communicator's timeout; a failure is fatal and names the op
// (a rank of a tensor-parallel group cannot go on without its peers).
#ifndef BRAID_PLUGINS_TENSOR_PARALLEL_PARALLEL_OPS_H_
#define BRAID_PLUGINS_TENSOR_PARALLEL_PARALLEL_OPS_H_

#include <atomic>
#include <cstdint>

#include "core/communicator.h"
#include "core/tensor.h"

namespace braid::tensor_parallel {

// Bytes the ops below all-reduced, forward and backward apart (for the summary and the
// benchmark's comparison with the formula). Shared by every op of one strategy. An all-gather
// or reduce-scatter of a full tensor of N bytes counts N/2: on a ring it moves half of what an
// all-reduce of N bytes moves, so sequence parallelism's figures compare with plain TP's.
struct CommCounters {
  std::atomic<int64_t> forward_bytes{0};
  std::atomic<int64_t> backward_bytes{0};
};

// Every op below communicates through these: on two ranks on the CPU as one exchange of
// point-to-point messages (the Gloo communicator's Send/Recv between ranks of one host go through
// shared memory, its collectives over loopback TCP), otherwise with the communicator's
// collectives. Both give every rank bit-identical sums.
// The sum of `x` over the group as a new tensor (x itself on a group of one); not differentiable;
// `what` names it in the fatal error a failure is.
Tensor SumOverGroup(const Tensor& x, Communicator& group, const char* what);

Tensor CopyToGroup(const Tensor& x, Communicator& group, CommCounters* counters = nullptr);
Tensor ReduceFromGroup(const Tensor& x, Communicator& group, CommCounters* counters = nullptr);

// Sequence parallelism (Korthikanti et al. 2022): between the split layers, activations
// [B, T, ...] are split along T (dimension 1) over the group instead of replicated, so norms and
// residuals hold T/t of the sequence. f becomes an all-gather along T (backward: reduce-scatter)
// and g a reduce-scatter along T (backward: all-gather): the same bytes as the all-reduces.
// GatherSequence: [B, T/t, ...] -> [B, T, ...] (rank r's rows at r*T/t).
Tensor GatherSequence(const Tensor& x, Communicator& group, CommCounters* counters = nullptr);
// ScatterSequence: partial sums [B, T, ...] -> this rank's rows [B, T/t, ...] of their sum.
// T must be a multiple of the group size (fatal otherwise, naming both).
Tensor ScatterSequence(const Tensor& x, Communicator& group, CommCounters* counters = nullptr);

// weight: this rank's rows [vocab_start, vocab_start + rows) of the full [V, C] table; ids: i32,
// any shape, every id in [0, V). Ids outside this rank's rows give zeros here; the all-reduce
// over the group gives every rank the full lookup [..., C].
// With sequence_parallel, the sum is a reduce-scatter along T instead: [B, T/t, C] of this
// rank's rows.
Tensor VocabParallelEmbedding(const Tensor& weight, const Tensor& ids, int64_t vocab_start,
                              Communicator& group, CommCounters* counters = nullptr,
                              bool sequence_parallel = false);

// logits: [..., V/t] f32, this rank's columns [rank * V/t, (rank + 1) * V/t) of the full logits;
// targets: i32 with logits' leading shape (< 0: ignored). The mean cross-entropy over the
// targets >= 0, equal on every rank of the group, as ops::CrossEntropy of the full logits
// would give. Two all-reduces of B·T values (the max; the sum of exponentials and the target's
// logit together), never the logits; the gradient is local.
Tensor VocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets, Communicator& group,
                                 CommCounters* counters = nullptr);

}  // namespace braid::tensor_parallel

#endif  // BRAID_PLUGINS_TENSOR_PARALLEL_PARALLEL_OPS_H_
