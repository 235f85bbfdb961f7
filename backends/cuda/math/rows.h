// Row-wise pieces: LayerNorm forward/backward per element, the online softmax's (max, sum)
// state and its merge, cross-entropy per row, the softmax backward element, the attention
// softmax step, and the same on bf16/f16 storage (the end of this file). A kernel owns the reduction order (a warp or block tree); these functions are
// what each thread computes between reductions, so the CPU tests can run them in the CPU
// backend's order (exact) and in the GPU's tree order (within a stated tolerance).
#ifndef BRAID_BACKENDS_CUDA_MATH_ROWS_H_
#define BRAID_BACKENDS_CUDA_MATH_ROWS_H_

#include "backends/cuda/math/convert.h"
#include "backends/cuda/math/hd.h"

namespace braid::cuda::math {

// ---- LayerNorm -----------------------------------------------------------------------------
// Two passes, as the CPU backend: mean = sum(x) / C, then rstd = 1 / sqrt(sum((x - mean)^2) / C
// + eps). Two passes over a row in cache rather than one pass of E[x^2] - mean^2, which cancels
// catastrophically when |mean| >> std.
BRAID_HD float LayerNormMean(float sum, int64_t c) { return sum / float(c); }
BRAID_HD float LayerNormCentredSquare(float x, float mean) { return (x - mean) * (x - mean); }
BRAID_HD float LayerNormRstd(float sum_sq, int64_t c, float eps) {
  return 1.0f / sqrtf(sum_sq / float(c) + eps);
}
BRAID_HD float LayerNormOut(float x, float mean, float rstd, float w, float b) {
  return (x - mean) * rstd * w + b;
}

// Backward, per row: xhat = (x - mean) rstd, dn = dout * w; the row sums sdn = sum(dn) and
// sdnx = sum(dn xhat); then dx = (dn - sdn / C - xhat * sdnx / C) * rstd. dweight and dbias are
// column sums over rows of dout * xhat and dout.
BRAID_HD float LayerNormXhat(float x, float mean, float rstd) { return (x - mean) * rstd; }
BRAID_HD float LayerNormDx(float dout, float w, float xhat, float mean_dn, float mean_dnx,
                           float rstd) {
  return (dout * w - mean_dn - xhat * mean_dnx) * rstd;
}

// ---- Online softmax ------------------------------------------------------------------------
// The state of a softmax over a stream of values: their maximum m and sum(exp(x - m)). Values
// are pushed one at a time or states merged pairwise (a warp's tree), in any order; the result
// differs from the two-pass max-then-sum only by the rescaling roundings (see rows_test.cc).
struct MaxSum {
  float m;
  float s;
};

BRAID_HD MaxSum MaxSumEmpty() { return MaxSum{-INFINITY, 0.0f}; }

// Non-finite values give what the CPU's two passes give (s = sum exp(x - max)): a +inf makes
// s NaN (its own term is exp(inf - inf)), so every probability is NaN; a -inf adds exp(-inf - m)
// = 0 (skipped: pushed first, exp(-inf - -inf) would be NaN); a NaN makes s NaN.
BRAID_HD MaxSum MaxSumPush(MaxSum a, float x) {
  if (x > a.m) {
    // exp(-inf - x) = 0 when the state was empty; exp(x - x) is 1, or NaN for x = +inf.
    return MaxSum{x, a.s * expf(a.m - x) + expf(x - x)};
  }
  if (x == -INFINITY) return a;
  return MaxSum{a.m, a.s + expf(x - a.m)};
}

BRAID_HD MaxSum MaxSumMerge(MaxSum a, MaxSum b) {
  // An empty side contributes nothing (and -inf - -inf would be NaN).
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = a.m > b.m ? a.m : b.m;
  return MaxSum{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// softmax element from the row's state: exp(x - m) * (1 / s), as the CPU scales by 1 / s.
BRAID_HD float SoftmaxProb(float x, MaxSum st, float inv_s) { return expf(x - st.m) * inv_s; }

// softmax backward: dx = y (dy - sum(dy y)).
BRAID_HD float SoftmaxGrad(float y, float dy, float dot) { return y * (dy - dot); }

// ---- Cross-entropy -------------------------------------------------------------------------
// -log softmax[t] = log(sum exp(x - m)) - (x_t - m): no log of a rounded probability. An
// ignored row (t < 0) has loss 0.
BRAID_HD float CrossEntropyLoss(MaxSum st, float x_target, int32_t target) {
  return target < 0 ? 0.0f : logf(st.s) - (x_target - st.m);
}

// dlogits[i] = (p[i] - [i == t]) * dloss, and 0 for an ignored row.
BRAID_HD float CrossEntropyGrad(float p, int64_t i, int32_t target, float dloss) {
  if (target < 0) return 0.0f;
  return i == target ? (p - 1.0f) * dloss : p * dloss;
}

// ---- Attention -----------------------------------------------------------------------------
// Causal attention for query row i: scores s_j = scale * (q_i . k_j) for j <= i, probabilities
// p_j = softmax(s)_j (0 above the diagonal), out_i = sum_j p_j v_j. Backward, with
// dp_j = dout_i . v_j and dot = sum_j p_j dp_j: ds_j = p_j (dp_j - dot) scale, then
// dq_i = sum_j ds_j k_j, dk_j = sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i.
BRAID_HD bool AttentionVisible(int64_t i, int64_t j) { return j <= i; }
BRAID_HD float AttentionScore(float qk_dot, float scale) { return scale * qk_dot; }
BRAID_HD float AttentionDScore(float p, float dp, float dot, float scale) {
  return p * (dp - dot) * scale;
}

// ---- Storage in any of the three formats (f32, bf16, f16) -----------------------------------
// The row kernels are templates on the storage format F (convert.h). Each stored operand is
// loaded to f32, every sum and row statistic is formed in f32, and each stored output is rounded
// once: what the CPU backend's half kernels do (backends/cpu/half_kernels.cc up-casts the
// operands, runs the f32 kernel and rounds each output once; embedding works on the half rows
// with an f32 accumulator per row). Composed in the CPU's order these give its bits
// (rows_half_math_test.cc). LayerNorm's mean and rstd and cross-entropy's losses, probabilities
// and dloss are f32 whatever F is (core/kernel_checks.h). For f32, LoadF32 and StoreAs are the
// identity.
template <Format F>
BRAID_HD float LoadF32(Stored<F> v) { return Elem<F>::Get(v); }
template <Format F>
BRAID_HD Stored<F> StoreAs(float v) { return Elem<F>::Put(v); }

template <Format F>
BRAID_HD Stored<F> LayerNormOutStored(Stored<F> x, float mean, float rstd, Stored<F> w,
                                      Stored<F> b) {
  return StoreAs<F>(LayerNormOut(LoadF32<F>(x), mean, rstd, LoadF32<F>(w), LoadF32<F>(b)));
}

// The backward's row terms: dn = dout w (summed into mean_dn) and dn xhat (into mean_dnx).
template <Format F>
BRAID_HD float LayerNormDn(Stored<F> dout, Stored<F> w) {
  return LoadF32<F>(dout) * LoadF32<F>(w);
}
template <Format F>
BRAID_HD float LayerNormDnXhat(Stored<F> dout, Stored<F> w, Stored<F> x, float mean, float rstd) {
  return LayerNormDn<F>(dout, w) * LayerNormXhat(LoadF32<F>(x), mean, rstd);
}
template <Format F>
BRAID_HD Stored<F> LayerNormDxStored(Stored<F> dout, Stored<F> w, Stored<F> x, float mean,
                                     float rstd, float mean_dn, float mean_dnx) {
  return StoreAs<F>(LayerNormDx(LoadF32<F>(dout), LoadF32<F>(w),
                                LayerNormXhat(LoadF32<F>(x), mean, rstd), mean_dn, mean_dnx, rstd));
}

// dweight[i] += sum_r dout[r, i] xhat[r, i] and dbias[i] += sum_r dout[r, i], column i, in the
// CPU backend's order (backends/cpu/nn_kernels.cc, kLayerNormSlices): min(16, rows) row slices,
// each summed in row order from 0, the slice sums added in order to the stored value's f32,
// rounded once. The GPU runs it blocked, in two passes (kernels/nn.cu): one thread per (slice,
// column) sums its slice (LayerNormDwDbSlice), then one per column adds the slices
// (AddSlicesStored); LayerNormDwDbColumn is the same two steps in one thread. Either way the
// same bits as the CPU's portable path wherever a * b + c is not contracted into an FMA (nvcc
// contracts; the host compiler here does not).
inline constexpr int64_t kLayerNormSlices = 16;

BRAID_HD int64_t LayerNormSliceCount(int64_t rows) {
  return rows < kLayerNormSlices ? rows : kLayerNormSlices;
}

// Slice s of `slices`: rows [rows s / slices, rows (s + 1) / slices) of column i, from 0.
template <Format F>
BRAID_HD void LayerNormDwDbSlice(const Stored<F>* dout, const Stored<F>* x, const float* mean,
                                 const float* rstd, int64_t rows, int64_t c, int64_t i,
                                 int64_t s, int64_t slices, float* pw, float* pb) {
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = rows * s / slices; r < rows * (s + 1) / slices; ++r) {
    const float g = LoadF32<F>(dout[r * c + i]);
    sw += g * LayerNormXhat(LoadF32<F>(x[r * c + i]), mean[r], rstd[r]);
    sb += g;
  }
  *pw = sw;
  *pb = sb;
}

// The stored value's f32 plus part[0], part[stride], ... (`slices` of them) in order, rounded
// once to F.
template <Format F>
BRAID_HD Stored<F> AddSlicesStored(Stored<F> stored, const float* part, int64_t slices,
                                   int64_t stride) {
  float acc = LoadF32<F>(stored);
  for (int64_t s = 0; s < slices; ++s) acc += part[s * stride];
  return StoreAs<F>(acc);
}

template <Format F>
BRAID_HD void LayerNormDwDbColumn(const Stored<F>* dout, const Stored<F>* x, const float* mean,
                                  const float* rstd, int64_t rows, int64_t c, int64_t i,
                                  Stored<F>* dw, Stored<F>* db) {
  const int64_t slices = LayerNormSliceCount(rows);
  float pw[kLayerNormSlices], pb[kLayerNormSlices];
  for (int64_t s = 0; s < slices; ++s) {
    LayerNormDwDbSlice<F>(dout, x, mean, rstd, rows, c, i, s, slices, &pw[s], &pb[s]);
  }
  dw[i] = AddSlicesStored<F>(dw[i], pw, slices, 1);
  db[i] = AddSlicesStored<F>(db[i], pb, slices, 1);
}

// sum_rows on F storage, column i: out = beta * out + the column's sum over rows, in row order
// from 0 in f32, rounded once: the CPU's half sum_rows (up-cast, the f32 kernel's per-column
// order, one rounding) exactly. beta == 0 never reads out (it may be uninitialised).
template <Format F>
BRAID_HD Stored<F> SumRowsColumn(const Stored<F>* a, int64_t rows, int64_t cols, int64_t i,
                                 Stored<F> out, float beta) {
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) acc += LoadF32<F>(a[r * cols + i]);
  return StoreAs<F>(beta != 0.0f ? beta * LoadF32<F>(out) + acc : acc);
}

template <Format F>
BRAID_HD Stored<F> SoftmaxProbStored(Stored<F> x, MaxSum st, float inv_s) {
  return StoreAs<F>(SoftmaxProb(LoadF32<F>(x), st, inv_s));
}
// The softmax backward's dot product term dy y, and the element from the row's dot.
template <Format F>
BRAID_HD float SoftmaxDotTerm(Stored<F> y, Stored<F> dy) {
  return LoadF32<F>(dy) * LoadF32<F>(y);
}
template <Format F>
BRAID_HD Stored<F> SoftmaxGradStored(Stored<F> y, Stored<F> dy, float dot) {
  return StoreAs<F>(SoftmaxGrad(LoadF32<F>(y), LoadF32<F>(dy), dot));
}

// dlogits in F from the f32 probabilities and dloss.
template <Format F>
BRAID_HD Stored<F> CrossEntropyGradStored(float p, int64_t i, int32_t target, float dloss) {
  return StoreAs<F>(CrossEntropyGrad(p, i, target, dloss));
}

// Embedding backward for one table row `id` and column i: the stored value's f32 plus the
// gradient rows of every position holding that id, in position order, rounded once (the CPU
// half kernel's order: positions stably sorted by id, one f32 accumulator per row). `order`
// lists positions sorted by id; [begin, end) is the id's run in it.
template <Format F>
BRAID_HD Stored<F> EmbeddingGradColumn(Stored<F> w, const Stored<F>* dout, const int32_t* order,
                                       int64_t begin, int64_t end, int64_t c, int64_t i) {
  float acc = LoadF32<F>(w);
  for (int64_t k = begin; k < end; ++k) acc += LoadF32<F>(dout[int64_t(order[k]) * c + i]);
  return StoreAs<F>(acc);
}

}  // namespace braid::cuda::math

#endif  // BRAID_BACKENDS_CUDA_MATH_ROWS_H_
