// Differentiable operations: each runs its device's kernel and records its backward.
// Shape errors are fatal and name the op and both shapes.
//
// Dtypes: every op takes f32, bf16 or f16 (a half op computes in f32 and rounds its result once).
// All floating operands of one op must share a dtype (fatal otherwise, naming both: convert
// with Cast), and the output has it, except CrossEntropy's loss, which is f32 for any logits
// dtype. Sum and Mean keep the input's dtype. Each backward gets the gradient of its output in
// the output's dtype and returns each input's gradient in that input's dtype. LayerNorm and
// RmsNorm keep their per-row statistics in f32; CausalSelfAttention and GroupedQueryAttention
// save their probabilities in the input's dtype.
#ifndef BRAID_CORE_OPS_H_
#define BRAID_CORE_OPS_H_

#include "core/tensor.h"

namespace braid::ops {

Tensor Add(const Tensor& a, const Tensor& b);  // b same shape, or a trailing row vector
Tensor Sub(const Tensor& a, const Tensor& b);
Tensor Mul(const Tensor& a, const Tensor& b);  // same shape
Tensor Scale(const Tensor& a, float s);
Tensor Relu(const Tensor& a);
Tensor GeluTanh(const Tensor& a);
Tensor Tanh(const Tensor& a);
Tensor Exp(const Tensor& a);
Tensor Log(const Tensor& a);
Tensor Sum(const Tensor& a);   // all elements -> scalar
Tensor Mean(const Tensor& a);  // all elements -> scalar

// a: [M, K] (or [B, M, K]), b: [K, N] (or [B, K, N]); flags transpose the last two dims.
Tensor MatMul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x: [..., in], weight: [out, in] (PyTorch layout), bias: [out] or undefined.
Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// GeluTanh(Linear(x, weight, bias)) as one op where the device fuses it (the optional
// linear_gelu_forward slot: CUDA's cuBLASLt GELU epilogue); elsewhere, or without a bias,
// exactly those two ops. Either way the pre-activation is kept for backward.
Tensor LinearGeluTanh(const Tensor& x, const Tensor& weight, const Tensor& bias);
// Over the last dimension of x.
Tensor LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
Tensor Softmax(const Tensor& x);  // over the last dimension
// weight: [V, C]; ids: any shape, i32 -> [..., C].
Tensor Embedding(const Tensor& weight, const Tensor& ids);
// logits: [..., V]; targets: i32 with logits' leading shape; mean over targets >= 0.
Tensor CrossEntropy(const Tensor& logits, const Tensor& targets);
// qkv: [B, T, 3C] -> [B, T, C], causal, scale 1/sqrt(C / n_head).
Tensor CausalSelfAttention(const Tensor& qkv, int n_head);

// ---- Llama-family ops (ops_llama.cc) ----
// Over the last dimension of x: x / sqrt(mean(x^2) + eps) * weight; weight: [C]. The per-row
// 1/rms is kept in f32 for backward whatever x's dtype (as LayerNorm's rstd).
Tensor RmsNorm(const Tensor& x, const Tensor& weight, float eps = 1e-6f);
Tensor Silu(const Tensor& a);  // a * sigmoid(a)
// silu(gate) * up, same shapes: Llama's MLP is down(SwiGlu(gate(x), up(x))). One kernel, so the
// silu(gate) intermediate is never stored.
Tensor SwiGlu(const Tensor& gate, const Tensor& up);
struct RopeOptions {
  float theta = 10000.0f;       // rope_theta: the base of the rotation frequencies
  float position_scale = 1.0f;  // linear scaling: position t counts as t / position_scale
  int64_t position_offset = 0;  // the position of x's first time step
  // Static NTK-aware scaling: theta becomes theta * ntk_factor^(D / (D - 2)) (D = head_dim),
  // stretching the low frequencies by about ntk_factor while the highest stays put. 1 = off.
  float ntk_factor = 1.0f;
};
// Rotary position embedding, half-split layout (rotate_half): x [B, T, H, D], D even; the
// feature pairs (i, i + D/2) of time step t rotate by the angle
// ((position_offset + t) / position_scale) * theta^(-2i/D), theta NTK-adjusted when asked.
Tensor RotaryEmbedding(const Tensor& x, const RopeOptions& opts = {});
// Causal grouped-query attention: q [B, T, H, D], k and v [B, T, Hkv, D] with H a multiple of
// Hkv; query head h attends with K/V head h / (H / Hkv) (Hugging Face's repeat_kv grouping, K
// and V never repeated in memory). -> [B, T, H, D]; scale 1/sqrt(D). The probabilities are
// saved in q's dtype, as CausalSelfAttention's.
Tensor GroupedQueryAttention(const Tensor& q, const Tensor& k, const Tensor& v);
// Training-mode dropout: each element is zeroed with probability p, the rest scaled by
// 1 / (1 - p). The mask is a pure function of (seed, element index, p) (kernels::DropoutKeep):
// the same seed gives the same mask on any thread count, and a recomputation under activation
// checkpointing replays it exactly. Nothing is stored for backward. Callers pass a fresh seed per
// call site and step (e.g. a hash of step, layer and rank); p = 0 returns x itself.
Tensor Dropout(const Tensor& x, float p, uint64_t seed);

// Converts to `t` (returns `a` itself when it already has that dtype); backward converts the
// gradient back to a's dtype. f32, bf16 and f16 only.
Tensor Cast(const Tensor& a, DType t);
// Identity forward (a copy with its own autograd node); backward multiplies the incoming
// gradient by `s`. For loss scaling: ScaleGrad(loss, S) reports the unscaled loss while backward
// starts from S.
Tensor ScaleGrad(const Tensor& a, float s);

}  // namespace braid::ops

#endif  // BRAID_CORE_OPS_H_
