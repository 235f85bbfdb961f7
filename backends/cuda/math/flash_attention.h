// The tile math of the fused (flash-attention style) causal attention, attention_flash.cu: what
// one query row (forward, dQ) or one key row (dK/dV) computes per tile of kFlashTile keys or
// queries, between the warp reductions the kernel owns. flash_attention_math_test.cc runs these
// helpers in the kernel's tile order on the CPU against a naive double-precision attention, so
// the algorithm is checked without a GPU.
//
// Forward, per query row i, key tiles in order: the running state (m, l) is the maximum of the
// visible scores seen so far and sum exp(s - m); a tile with maximum t rescales l and the output
// accumulator by exp(m_old - max(m_old, t)), then adds p_j = exp(s_j - m) and p_j v_j. At the
// end out_i = acc / l and only lse_i = m + log(l) is kept for backward (no T x T matrix).
// Backward recomputes p_ij = exp(s_ij - lse_i) tile by tile; with delta_i = dout_i . out_i
// (= sum_j p_ij dp_ij), ds_ij = p_ij (dp_ij - delta_i) scale, dq_i = sum_j ds_ij k_j,
// dk_j = sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i.
#ifndef BRAID_BACKENDS_CUDA_MATH_FLASH_ATTENTION_H_
#define BRAID_BACKENDS_CUDA_MATH_FLASH_ATTENTION_H_

#include "backends/cuda/math/hd.h"

namespace braid::cuda::math {

// Keys (forward, dQ) or queries (dK/dV) per tile: one per lane of a warp.
constexpr int kFlashTile = 32;
// Head dimensions up to this are kept in registers (ceil(D / 32) per lane, rounded up to 1, 2,
// 4 or 8); larger heads take the reference kernel (attention_plan.h).
constexpr int kFlashMaxHeadDim = 256;
// Rows (warps) per block: they share each tile of K and V (forward, dQ) or of Q and dout (dK/dV)
// loaded once into shared memory. The block runs every tile up to its last row's, so a row's
// later tiles may be fully masked for it (FlashRescale leaves the state unchanged then).
constexpr int kFlashRowsPerBlock = 8;

// A score is visible to query row i when its key j is not in the future and exists (the last
// tile of a sequence whose length is not a multiple of the tile is partly empty).
BRAID_HD bool FlashVisible(int64_t i, int64_t j, int64_t t) { return j <= i && j < t && i < t; }

// The masked, scaled score: -inf where not visible, so exp() gives exactly 0.
BRAID_HD float FlashScore(float qk_dot, float scale, bool visible) {
  return visible ? scale * qk_dot : -INFINITY;
}

// The running softmax state of one query row.
struct FlashRow {
  float m;  // max of the visible scores so far (-inf before the first)
  float l;  // sum of exp(s - m) over them
};

BRAID_HD FlashRow FlashRowStart() { return FlashRow{-INFINITY, 0.0f}; }

// Starts a tile whose visible scores have maximum tile_max (-inf when none is visible): moves
// the running maximum and returns the factor that the accumulated l (done here) and output
// accumulator (done by the caller) are multiplied by.
BRAID_HD float FlashRescale(FlashRow* r, float tile_max) {
  const float m = r->m > tile_max ? r->m : tile_max;
  // Nothing accumulated yet (or nothing visible at all): no factor to apply, and -inf - -inf
  // would be NaN.
  const float alpha = (r->m == -INFINITY || m == -INFINITY) ? 0.0f : expf(r->m - m);
  r->m = m;
  r->l *= alpha;
  return alpha;
}

// The un-normalised probability of a (masked) score in the current tile, after FlashRescale.
BRAID_HD float FlashTileProb(float s, const FlashRow& r) {
  return s == -INFINITY ? 0.0f : expf(s - r.m);
}

// Adds the tile's sum of FlashTileProb to l.
BRAID_HD void FlashAddMass(FlashRow* r, float tile_sum) { r->l += tile_sum; }

// One output element from its accumulator: acc / l. Every causal row sees its own key, so l >= 1.
BRAID_HD float FlashOutput(float acc, const FlashRow& r) { return acc / r.l; }

// What the forward keeps for backward: log sum_j exp(s_j).
BRAID_HD float FlashLogSumExp(const FlashRow& r) { return r.m + logf(r.l); }

// Backward: the probability recomputed from the score and the row's log-sum-exp (0 where masked).
BRAID_HD float FlashRecomputedProb(float s, float lse) {
  return s == -INFINITY ? 0.0f : expf(s - lse);
}

// Backward: the score gradient, given dp = dout_i . v_j and delta_i = dout_i . out_i.
BRAID_HD float FlashDScore(float p, float dp, float delta, float scale) {
  return p * (dp - delta) * scale;
}

// Index helpers for qkv [B, T, 3C] (q, k, v; head h owns features h D .. h D + D - 1 of each),
// out/dout [B, T, C] and the row statistics [B, H, T].
BRAID_HD int64_t FlashQkvIndex(int64_t b, int64_t t, int64_t which, int64_t h, int64_t d,
                               int64_t seq, int64_t c, int64_t head_dim) {
  return (b * seq + t) * 3 * c + which * c + h * head_dim + d;
}
BRAID_HD int64_t FlashOutIndex(int64_t b, int64_t t, int64_t h, int64_t d, int64_t seq, int64_t c,
                               int64_t head_dim) {
  return (b * seq + t) * c + h * head_dim + d;
}

}  // namespace braid::cuda::math

#endif  // BRAID_BACKENDS_CUDA_MATH_FLASH_ATTENTION_H_
