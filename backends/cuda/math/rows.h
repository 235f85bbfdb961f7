// Row-wise pieces: LayerNorm forward/backward per element, the online softmax's (max, sum)
// state and its merge, cross-entropy per row, the softmax backward element and the attention
// softmax step. A kernel owns the reduction order (a warp or block tree); these functions are
// what each thread computes between reductions, so the CPU tests can run them in the CPU
// backend's order (exact) and in the GPU's tree order (within a stated tolerance).
#ifndef BRAID_BACKENDS_CUDA_MATH_ROWS_H_
#define BRAID_BACKENDS_CUDA_MATH_ROWS_H_

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

BRAID_HD MaxSum MaxSumPush(MaxSum a, float x) {
  if (x > a.m) {
    // exp(-inf - x) = 0 when the state was empty.
    return MaxSum{x, a.s * expf(a.m - x) + 1.0f};
  }
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

}  // namespace braid::cuda::math

#endif  // BRAID_BACKENDS_CUDA_MATH_ROWS_H_
