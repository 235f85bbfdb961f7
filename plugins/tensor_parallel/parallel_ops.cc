#include "plugins/tensor_parallel/parallel_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"

namespace braid::tensor_parallel {
namespace {

void Count(std::atomic<int64_t>* c, const Tensor& t) {
  if (c != nullptr) *c += int64_t(t.nbytes());
}

// Two ranks on the CPU exchange their buffers with point-to-point messages instead of calling
// the communicator's collectives. Gloo's collectives between processes of one host go over
// loopback TCP, whose transport thread takes a core from a computing rank, while its Send/Recv
// between them go through shared-memory rings (backends/gloo/shm_link.h); a perf profile of
// TP = 2 on gpt-mini put ~15% of the processes' samples in the TCP path and the transport's
// epoll, for 20 blocking all-reduces per step. A pair's exchange moves what a ring all-reduce on
// 2 ranks moves (there each rank's half of a buffer, each way, twice; here the whole buffer
// once), in one round trip. Elsewhere (more ranks, GPU communicators) the communicator's own
// collectives, waited for with WaitOnDevice: what reads their results is the next op on the
// device, so under NCCL the compute stream waits for them and the host goes on.
bool Pair(const Communicator& g, const Tensor& t) {
  return g.size() == 2 && t.device().type == DeviceType::kCPU;
}

constexpr int kExchangeTag = 0x7470;  // "tp": this group's only point-to-point traffic

// The peer's `mine` (same shape and dtype). Both ranks call it at the same point.
Tensor Exchange(const Tensor& mine, Communicator& g, const char* what) {
  const int peer = 1 - g.rank();
  Tensor theirs = Tensor::Empty(mine.shape(), mine.dtype(), mine.device());
  std::shared_ptr<Work> recv = g.Recv(theirs, peer, kExchangeTag);
  std::shared_ptr<Work> send = g.Send(mine, peer, kExchangeTag);
  absl::Status st = recv->Wait();
  if (st.ok()) st = send->Wait();
  BRAID_CHECK(st.ok()) << "tensor parallel: " << what << " failed on rank " << g.rank()
                       << " of the tensor-parallel group: " << st.message();
  return theirs;
}

Tensor Sum(const Tensor& x, Communicator& g, const char* what) {
  if (Pair(g, x)) {
    Tensor sum = Exchange(x, g, what);
    // x0 + x1 on one rank, x1 + x0 on the other: the same bits (addition commutes).
    autograd::AccumulateInto(sum, x);
    return sum;
  }
  Tensor sum = x.Clone();
  absl::Status st = g.AllReduce(sum, ReduceOp::kSum)->WaitOnDevice();
  BRAID_CHECK(st.ok()) << "tensor parallel: " << what << " failed on rank " << g.rank()
                       << " of the tensor-parallel group: " << st.message();
  return sum;
}

// In place: `t` summed or maxed over the group.
void AllReduceOrDie(Tensor& t, ReduceOp op, Communicator& g, const char* what) {
  if (Pair(g, t) && t.dtype() == DType::kF32 && (op == ReduceOp::kSum || op == ReduceOp::kMax)) {
    Tensor theirs = Exchange(t, g, what);
    if (op == ReduceOp::kSum) {
      autograd::AccumulateInto(t, theirs);
    } else {
      float* a = t.data<float>();
      const float* b = theirs.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) a[i] = std::max(a[i], b[i]);
    }
    return;
  }
  absl::Status st = g.AllReduce(t, op)->WaitOnDevice();
  BRAID_CHECK(st.ok()) << "tensor parallel: " << what << " failed on rank " << g.rank()
                       << " of the tensor-parallel group: " << st.message();
}

}  // namespace

Tensor SumOverGroup(const Tensor& x, Communicator& group, const char* what) {
  return group.size() == 1 ? x : Sum(x, group, what);
}

Tensor CopyToGroup(const Tensor& x, Communicator& group, CommCounters* counters) {
  if (group.size() == 1) return x;
  Communicator* g = &group;
  return autograd::ApplyFunction(
      "CopyToTensorParallel", {x},
      // The identity: the input's own memory (a detached alias; activations are never written
      // in place), not a copy.
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
      [g, counters](const std::vector<Tensor>& grads) {
        Tensor sum = Sum(grads[0], *g, "all-reducing the gradient of a replicated input");
        Count(counters ? &counters->backward_bytes : nullptr, sum);
        return std::vector<Tensor>{sum};
      })[0];
}

Tensor ReduceFromGroup(const Tensor& x, Communicator& group, CommCounters* counters) {
  if (group.size() == 1) return x;
  Communicator* g = &group;
  return autograd::ApplyFunction(
      "ReduceFromTensorParallel", {x},
      [g, counters](const std::vector<Tensor>& in) {
        Tensor sum = Sum(in[0], *g, "all-reducing partial sums of a row-split layer");
        Count(counters ? &counters->forward_bytes : nullptr, sum);
        return std::vector<Tensor>{sum};
      },
      [](const std::vector<Tensor>& grads) { return std::vector<Tensor>{grads[0]}; })[0];
}

namespace {

// [B, t * Tl, I] <-> [t][B][Tl][I]: rank r's sequence rows made contiguous for the collectives.
// One pass straight between the two buffers: these run twice per split layer and step, on
// activations of B*T*C floats, so every extra host copy is paid ~20 times a step.
void PermuteRanks(const float* from, float* to, int64_t b, int t, int64_t tl, int64_t inner,
                  bool to_rank_major) {
  const int64_t rows = tl * inner;
  for (int64_t i = 0; i < b; ++i) {
    for (int r = 0; r < t; ++r) {
      const int64_t batch_major = (i * t + r) * rows, rank_major = (r * b + i) * rows;
      const float* src = from + (to_rank_major ? batch_major : rank_major);
      std::copy(src, src + rows, to + (to_rank_major ? rank_major : batch_major));
    }
  }
}

// `x` in the other layout (new storage): on the host one pass; elsewhere through host vectors.
Tensor Permuted(const Tensor& x, const Shape& shape, int64_t b, int t, int64_t tl, int64_t inner,
                bool to_rank_major) {
  if (x.device().type == DeviceType::kCPU) {
    Tensor out = Tensor::Empty(shape, DType::kF32, x.device());
    PermuteRanks(x.data<float>(), out.data<float>(), b, t, tl, inner, to_rank_major);
    return out;
  }
  std::vector<float> from = x.ToFloatVector(), to(from.size());
  PermuteRanks(from.data(), to.data(), b, t, tl, inner, to_rank_major);
  return Tensor::FromVector(to, shape, x.device());
}

void CheckSequenceInput(const Tensor& x, const char* op) {
  BRAID_CHECK(x.ndim() >= 2 && x.dtype() == DType::kF32)
      << op << ": sequence parallelism splits f32 activations [B, T, ...] along T, got "
      << x.DescribeForError();
}

// All-gather along T: [B, Tl, I] -> [B, t*Tl, I].
Tensor AllGatherSequence(const Tensor& x, Communicator& g, std::atomic<int64_t>* bytes) {
  const int t = g.size();
  const int64_t b = x.size(0), tl = x.size(1), inner = x.numel() / std::max<int64_t>(b * tl, 1);
  // The collective only reads its input: a view of x, no copy.
  Tensor flat = x.Detach().Reshape({x.numel()});
  Shape shape = x.shape();
  shape[1] = tl * t;
  if (bytes != nullptr) *bytes += int64_t(flat.nbytes()) * t / 2;  // half an all-reduce's volume
  if (Pair(g, x)) {
    // The peer's rows, then both ranks' rows interleaved per sequence straight into the result.
    Tensor theirs = Exchange(flat, g, "all-gathering the sequence");
    const float* part[2] = {nullptr, nullptr};
    part[g.rank()] = flat.data<float>();
    part[1 - g.rank()] = theirs.data<float>();
    Tensor out = Tensor::Empty(shape, DType::kF32, x.device());
    float* to = out.data<float>();
    const int64_t rows = tl * inner;
    for (int64_t i = 0; i < b; ++i) {
      for (int r = 0; r < 2; ++r) std::copy(part[r] + i * rows, part[r] + (i + 1) * rows, to + (2 * i + r) * rows);
    }
    return out;
  }
  Tensor all = Tensor::Empty({x.numel() * t}, DType::kF32, x.device());
  absl::Status st = g.AllGather(flat, all)->WaitOnDevice();
  BRAID_CHECK(st.ok()) << "tensor parallel: all-gathering the sequence failed on rank " << g.rank()
                       << ": " << st.message();
  // One sequence: rank-major is already [1, t*Tl, I].
  return b == 1 ? all.Reshape(shape) : Permuted(all, shape, b, t, tl, inner, false);
}

// Reduce-scatter along T: [B, T, I] partial sums -> [B, T/t, I] of this rank's rows.
Tensor ReduceScatterSequence(const Tensor& x, Communicator& g, std::atomic<int64_t>* bytes) {
  const int t = g.size();
  const int64_t b = x.size(0), full = x.size(1);
  BRAID_CHECK(full % t == 0) << "sequence parallelism: the sequence length " << full
                             << " is not a multiple of the tensor-parallel size " << t
                             << "; use a context length the tensor size divides";
  const int64_t tl = full / t, inner = x.numel() / std::max<int64_t>(b * full, 1);
  if (bytes != nullptr) *bytes += int64_t(x.nbytes()) / 2;  // half an all-reduce's
  Shape shape = x.shape();
  shape[1] = tl;
  if (Pair(g, x)) {
    // The peer's rows of each sequence go to it; its partial sums of ours come back and ours are
    // added (x0 + x1 or x1 + x0: the same bits).
    const int me = g.rank();
    const int64_t rows = tl * inner;
    const float* from = x.data<float>();
    Tensor for_peer = Tensor::Empty(shape, DType::kF32, x.device());
    float* fp = for_peer.data<float>();
    for (int64_t i = 0; i < b; ++i) {
      const float* src = from + (2 * i + (1 - me)) * rows;
      std::copy(src, src + rows, fp + i * rows);
    }
    Tensor mine = Exchange(for_peer, g, "reduce-scattering the sequence");
    float* __restrict m = mine.data<float>();
    for (int64_t i = 0; i < b; ++i) {
      const float* __restrict own = from + (2 * i + me) * rows;
      float* __restrict dst = m + i * rows;
      for (int64_t j = 0; j < rows; ++j) dst[j] += own[j];
    }
    return mine;
  }
  // The collective only reads its input: with one sequence, x itself is rank-major.
  Tensor rank_major = b == 1 ? x.Detach().Reshape({x.numel()})
                             : Permuted(x.Detach(), {x.numel()}, b, t, tl, inner, true);
  Tensor mine = Tensor::Empty({x.numel() / t}, DType::kF32, x.device());
  absl::Status st = g.ReduceScatter(rank_major, mine, ReduceOp::kSum)->WaitOnDevice();
  BRAID_CHECK(st.ok()) << "tensor parallel: reduce-scattering the sequence failed on rank "
                       << g.rank() << ": " << st.message();
  return mine.Reshape(shape);
}

}  // namespace

Tensor GatherSequence(const Tensor& x, Communicator& group, CommCounters* counters) {
  CheckSequenceInput(x, "GatherSequence");
  if (group.size() == 1) return x;
  Communicator* g = &group;
  return autograd::ApplyFunction(
      "GatherSequence", {x},
      [g, counters](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{AllGatherSequence(in[0], *g, counters ? &counters->forward_bytes : nullptr)};
      },
      [g, counters](const std::vector<Tensor>& grads) {
        return std::vector<Tensor>{ReduceScatterSequence(grads[0], *g, counters ? &counters->backward_bytes : nullptr)};
      })[0];
}

Tensor ScatterSequence(const Tensor& x, Communicator& group, CommCounters* counters) {
  CheckSequenceInput(x, "ScatterSequence");
  if (group.size() == 1) return x;
  Communicator* g = &group;
  return autograd::ApplyFunction(
      "ScatterSequence", {x},
      [g, counters](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ReduceScatterSequence(in[0], *g, counters ? &counters->forward_bytes : nullptr)};
      },
      [g, counters](const std::vector<Tensor>& grads) {
        return std::vector<Tensor>{AllGatherSequence(grads[0], *g, counters ? &counters->backward_bytes : nullptr)};
      })[0];
}

Tensor VocabParallelEmbedding(const Tensor& weight, const Tensor& ids, int64_t vocab_start,
                              Communicator& group, CommCounters* counters,
                              bool sequence_parallel) {
  BRAID_CHECK(ids.dtype() == DType::kI32) << "VocabParallelEmbedding: ids must be i32, got "
                                          << ids.DescribeForError();
  const int64_t rows = weight.size(0), dim = weight.size(1);
  std::vector<int32_t> local = ids.ToVector<int32_t>();
  std::vector<float> mask(local.size() * size_t(dim));
  for (size_t i = 0; i < local.size(); ++i) {
    const int64_t id = int64_t(local[i]) - vocab_start;
    const bool mine = id >= 0 && id < rows;
    local[i] = mine ? int32_t(id) : 0;  // any row of ours: the mask zeroes it
    std::fill(mask.begin() + long(i) * dim, mask.begin() + long(i + 1) * dim, mine ? 1.0f : 0.0f);
  }
  Shape out_shape = ids.shape();
  out_shape.push_back(dim);
  Tensor looked = ops::Embedding(weight, Tensor::FromVector(local, ids.shape(), ids.device()));
  Tensor masked = ops::Mul(looked, Tensor::FromVector(mask, out_shape, weight.device()));
  return sequence_parallel ? ScatterSequence(masked, group, counters)
                           : ReduceFromGroup(masked, group, counters);
}

Tensor VocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets, Communicator& group,
                                 CommCounters* counters) {
  BRAID_CHECK(logits.dtype() == DType::kF32 && targets.dtype() == DType::kI32 &&
              logits.numel() == targets.numel() * logits.size(-1))
      << "VocabParallelCrossEntropy: logits [..., V/t] f32 and i32 targets of their leading "
         "shape, got "
      << logits.DescribeForError() << " and " << targets.DescribeForError();
  const int64_t cols = logits.size(-1), n = targets.numel();
  const int64_t start = int64_t(group.rank()) * cols;
  Communicator* g = &group;
  const Device device = logits.device();
  const Shape shape = logits.shape();
  // Softmax probabilities of this rank's columns, kept for backward (as the full op keeps them).
  auto probs = std::make_shared<std::vector<float>>();
  auto count = std::make_shared<int64_t>(0);
  std::vector<int32_t> t = targets.ToVector<int32_t>();
  auto forward = [=](const std::vector<Tensor>& in) {
    std::vector<float> l = in[0].ToFloatVector();
    Tensor max = Tensor::Empty({n}, DType::kF32, device);
    {
      std::vector<float> m(size_t(n), -std::numeric_limits<float>::infinity());
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < cols; ++c) m[size_t(r)] = std::max(m[size_t(r)], l[size_t(r * cols + c)]);
      }
      max = Tensor::FromVector(m, {n}, device);
    }
    AllReduceOrDie(max, ReduceOp::kMax, *g, "all-reducing the logits' maximum");
    std::vector<float> m = max.ToFloatVector();
    // [sum of exp(l - max) over our columns | the target's shifted logit, where we own it].
    std::vector<float> sums(size_t(2 * n), 0.0f);
    probs->assign(l.size(), 0.0f);
    for (int64_t r = 0; r < n; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) {
        float e = std::exp(l[size_t(r * cols + c)] - m[size_t(r)]);
        (*probs)[size_t(r * cols + c)] = e;
        s += e;
      }
      sums[size_t(r)] = float(s);
      const int64_t tc = int64_t(t[size_t(r)]) - start;
      if (t[size_t(r)] >= 0 && tc >= 0 && tc < cols) sums[size_t(n + r)] = l[size_t(r * cols + tc)] - m[size_t(r)];
    }
    Tensor packed = Tensor::FromVector(sums, {2 * n}, device);
    AllReduceOrDie(packed, ReduceOp::kSum, *g, "all-reducing the softmax denominators");
    if (counters != nullptr) counters->forward_bytes += int64_t(max.nbytes() + packed.nbytes());
    std::vector<float> total = packed.ToFloatVector();
    double loss = 0;
    int64_t valid = 0;
    for (int64_t r = 0; r < n; ++r) {
      const float denom = total[size_t(r)];
      for (int64_t c = 0; c < cols; ++c) (*probs)[size_t(r * cols + c)] /= denom;
      if (t[size_t(r)] < 0) continue;
      loss += std::log(double(denom)) - double(total[size_t(n + r)]);
      ++valid;
    }
    *count = valid;
    return std::vector<Tensor>{Tensor::Scalar(valid > 0 ? float(loss / double(valid)) : 0.0f, device)};
  };
  auto backward = [=](const std::vector<Tensor>& grads) {
    const float scale = *count > 0 ? grads[0].item() / float(*count) : 0.0f;
    std::vector<float> d(size_t(n * cols), 0.0f);
    for (int64_t r = 0; r < n; ++r) {
      if (t[size_t(r)] < 0) continue;
      for (int64_t c = 0; c < cols; ++c) d[size_t(r * cols + c)] = scale * (*probs)[size_t(r * cols + c)];
      const int64_t tc = int64_t(t[size_t(r)]) - start;
      if (tc >= 0 && tc < cols) d[size_t(r * cols + tc)] -= scale;
    }
    return std::vector<Tensor>{Tensor::FromVector(d, shape, device), Tensor()};
  };
  return autograd::ApplyFunction("VocabParallelCrossEntropy", {logits, targets}, forward, backward)[0];
}

}  // namespace braid::tensor_parallel
