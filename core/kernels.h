// The per-device kernel table: the contract between core's differentiable ops and backends.
//
// Each slot is one op with a fixed C++ signature; a backend fills the slot for its device type
// (backends/cpu for kCPU, backends/cuda for kCUDA) from a static initialiser. Tensors passed in
// are contiguous, already shape-checked by the caller, and outputs are preallocated on the same
// device. The slots are keyed by (device type, dtype): see KernelSlot.
#ifndef BRAID_CORE_KERNELS_H_
#define BRAID_CORE_KERNELS_H_

#include "core/check.h"
#include "core/tensor.h"

namespace braid::kernels {

// One slot: a kernel per (device type, dtype). The dtype is the op's floating dtype (every
// floating operand of an op has it, see core/ops.h); where a slot's operands mix dtypes on
// purpose (LayerNorm's f32 mean/rstd, CrossEntropy's f32 losses and probabilities, axpby into
// an f32 accumulator) the slot's comment says which one keys it. The table is open: a backend or
// a plugin may register a kernel for any dtype, and Register replaces what was there (so a test
// can swap a kernel in and put the old one back).
template <typename Fn>
class KernelSlot {
 public:
  using FnType = Fn;
  explicit constexpr KernelSlot(const char* name) : name_(name) {}
  // The f32 kernel (what every backend registered before kernels were keyed by dtype).
  void Register(DeviceType type, Fn* fn) { Register(type, DType::kF32, fn); }
  void Register(DeviceType type, DType dtype, Fn* fn) { fns_[int(type)][int(dtype)] = fn; }
  Fn* Find(DeviceType type, DType dtype = DType::kF32) const {
    return fns_[int(type)][int(dtype)];
  }
  Fn* Get(Device device, DType dtype = DType::kF32) const {
    Fn* f = fns_[int(device.type)][int(dtype)];
    if (__builtin_expect(f == nullptr, 0)) FailMissing(device, dtype);
    return f;
  }
  const char* name() const { return name_; }

 private:
  [[noreturn]] void FailMissing(Device device, DType dtype) const {
    const bool has_f32 = fns_[int(device.type)][int(DType::kF32)] != nullptr;
    BRAID_CHECK(false) << "no kernel '" << name_ << "' for dtype " << DTypeName(dtype) << " on "
                       << device << ": "
                       << (has_f32 ? "this device has only other dtypes' kernels; register one "
                                     "with BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::"
                                   : "link the backend for this device type into the program, "
                                     "or register one with BRAID_REGISTER_KERNEL_FOR_DTYPE(kernels::")
                       << name_ << ", type, " << DTypeName(dtype) << ", fn)"
                       << (has_f32 && dtype != DType::kF32
                               ? " or call kernels::RegisterHalfFallbacks(type) for the up-cast "
                                 "wrappers around the f32 kernel"
                               : "");
    __builtin_unreachable();
  }
  const char* name_;
  Fn* fns_[kNumDeviceTypes][kNumDTypes] = {};
};

// Registers `fn` as `slot`'s f32 kernel for `type` at static-initialisation time (alwayslink
// the library).
#define BRAID_REGISTER_KERNEL(slot, type, fn) \
  static const bool BRAID_CONCAT(_braid_kernel_reg_, __COUNTER__) = ((slot).Register(type, fn), true)
// The same for another dtype, e.g. (kernels::matmul, DeviceType::kCPU, DType::kBF16, &MyGemm).
#define BRAID_REGISTER_KERNEL_FOR_DTYPE(slot, type, dtype, fn)                 \
  static const bool BRAID_CONCAT(_braid_kernel_reg_, __COUNTER__) = \
      ((slot).Register(type, dtype, fn), true)

// For every slot of `type` that has no bf16 or f16 kernel yet, registers a wrapper that up-casts
// the half operands to f32 (the copy kernel), runs the slot's f32 kernel and rounds each half
// output once (the copy kernel again; an output is up-cast first too, so accumulating kernels
// add into its f32 value and round once). The f32 kernel is looked up at each call, so the
// order of registration does not matter. copy and fill are dtype-generic already, adamw and sgd
// stay f32-only (master weights are f32), so those four are left alone. A backend calls this
// for the slots it does not specialise; core's tests call it to run half ops on the reference
// kernels.
void RegisterHalfFallbacks(DeviceType type);

// ---- Memory -------------------------------------------------------------------------------
// dst = src, same numel; converts between f32/bf16/f16 (and copies any dtype to itself).
// copy and fill are dtype-generic: registered and looked up under the f32 key.
using CopyFn = void(const Tensor& src, Tensor& dst);
extern KernelSlot<CopyFn> copy;
using FillFn = void(Tensor& dst, float value);  // any dtype
extern KernelSlot<FillFn> fill;

// ---- Elementwise --------------------------------------------------------------------------
enum class BinaryOp { kAdd, kSub, kMul, kDiv };
// out = a (op) b. b has a's numel, or b.numel() divides a.numel() and b repeats along a's
// leading dimensions (a row-vector bias). out may alias a.
using BinaryFn = void(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
extern KernelSlot<BinaryFn> binary;

enum class UnaryOp { kScale, kAddScalar, kRelu, kGeluTanh, kExp, kLog, kNeg, kSquare, kSqrt, kTanh };
// out = f(a) (kScale: a * scalar; kAddScalar: a + scalar). out may alias a.
using UnaryFn = void(UnaryOp op, const Tensor& a, float scalar, Tensor& out);
extern KernelSlot<UnaryFn> unary;
// grad_in = grad_out * f'(a), for kRelu, kGeluTanh, kTanh, kExp, kLog, kSquare, kSqrt.
using UnaryBackwardFn = void(UnaryOp op, const Tensor& a, const Tensor& grad_out, Tensor& grad_in);
extern KernelSlot<UnaryBackwardFn> unary_backward;

// y = alpha * x + beta * y, same numel, computed in f32 and rounded once into y. x and y may
// differ in dtype (a half gradient into an f32 accumulator, or the reverse): the kernel keyed by
// whichever of them is not f32 runs (see AxpbyKey), so half kernels take an f32 x or y too.
using AxpbyFn = void(float alpha, const Tensor& x, float beta, Tensor& y);
extern KernelSlot<AxpbyFn> axpby;
inline DType AxpbyKey(const Tensor& x, const Tensor& y) {
  return y.dtype() != DType::kF32 ? y.dtype() : x.dtype();
}

// ---- Reductions ---------------------------------------------------------------------------
// out[0] = sum of all elements of a (out is a 1-element tensor of a's dtype).
using SumAllFn = void(const Tensor& a, Tensor& out);
extern KernelSlot<SumAllFn> sum_all;
// a viewed as [rows, cols] with cols = out.numel(): out = beta * out + sum over rows.
using SumRowsFn = void(const Tensor& a, Tensor& out, float beta);
extern KernelSlot<SumRowsFn> sum_rows;

// ---- Matrix products ----------------------------------------------------------------------
// out = alpha * op(a) @ op(b) + beta * out, op = transpose when the flag is set. 2-D, or 3-D
// with a shared leading batch dimension.
using MatmulFn = void(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
                      float alpha, float beta);
extern KernelSlot<MatmulFn> matmul;
// Linear's forward in one call: out[rows, out] = x[rows, in] @ weight[out, in]ᵀ + bias[out].
// Optional, for backends whose GEMM adds the bias in its epilogue (CUDA's cuBLASLt): ops::Linear
// uses it where the device and dtype have one registered, else matmul then binary's add.
using LinearFwdFn = void(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out);
extern KernelSlot<LinearFwdFn> linear_forward;
// Linear then tanh-approximated GELU (GPT-2's MLP up-projection) in one call: pre = x weightᵀ +
// bias, out = gelu_tanh(pre), both [rows, out]. pre is written for the backward (GELU's
// derivative needs it), so the op keeps what the unfused Linear + GeluTanh keep. Optional, for
// backends whose GEMM applies bias and GELU in its epilogue (CUDA's cuBLASLt GELU_AUX_BIAS):
// ops::LinearGeluTanh uses it where the device and dtype have one, else Linear then GeluTanh.
using LinearGeluFwdFn = void(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             Tensor& pre, Tensor& out);
extern KernelSlot<LinearGeluFwdFn> linear_gelu_forward;
// Its backward's GELU half, in one pass: dpre = dout * gelu_tanh'(pre) and dbias = the column
// sums of dpre (overwritten), pre, dout and dpre [rows, out], dbias [out]. dbias sums dpre as
// stored, so it is what sum_rows of dpre gives. Optional (CUDA registers one):
// ops::LinearGeluTanh's backward uses it where the device and dtype have one, else
// unary_backward then sum_rows.
using LinearGeluBwdFn = void(const Tensor& pre, const Tensor& dout, Tensor& dpre, Tensor& dbias);
extern KernelSlot<LinearGeluBwdFn> linear_gelu_backward;

// ---- Fused neural-network ops --------------------------------------------------------------
// x: [N, C]; weight, bias: [C]; out: [N, C]; mean, rstd: [N] f32 whatever x's dtype (saved
// for backward).
using LayerNormFwdFn = void(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                            Tensor& out, Tensor& mean, Tensor& rstd);
extern KernelSlot<LayerNormFwdFn> layernorm_forward;
// Writes dx; adds into dweight and dbias (callers zero them first for a fresh gradient).
using LayerNormBwdFn = void(const Tensor& dout, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                            Tensor& dbias);
extern KernelSlot<LayerNormBwdFn> layernorm_backward;

// Row-wise softmax of x viewed as [N, C].
using SoftmaxFwdFn = void(const Tensor& x, Tensor& out);
extern KernelSlot<SoftmaxFwdFn> softmax_forward;
// dx = y * (dy - sum(dy * y)) row-wise.
using SoftmaxBwdFn = void(const Tensor& y, const Tensor& dy, Tensor& dx);
extern KernelSlot<SoftmaxBwdFn> softmax_backward;

// logits: [N, V] (the slot's dtype), targets: [N] i32 (a target < 0 is ignored). losses: [N]
// f32 (0 where ignored); probs: [N, V] softmax, f32 whatever the logits' dtype, kept for
// backward: dlogits = probs - 1 at the target cancels, and a half probability of 0.999 rounds to
// 1 (bf16) and loses the whole gradient of a confident prediction.
using CrossEntropyFwdFn = void(const Tensor& logits, const Tensor& targets, Tensor& losses,
                               Tensor& probs);
extern KernelSlot<CrossEntropyFwdFn> cross_entropy_forward;
// dlogits[n] = (probs[n] - onehot(targets[n])) * dloss[n]; probs, dloss: f32; dlogits in the
// slot's dtype.
using CrossEntropyBwdFn = void(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                               Tensor& dlogits);
extern KernelSlot<CrossEntropyBwdFn> cross_entropy_backward;
// ids: i32; out: one f32 element on ids' device = 1 / (the number of ids >= 0), or 0 when there
// is none: the weight of each counted position in CrossEntropy's mean, which ignores negative
// targets, computed where the targets are so that the host never reads them. Registered under
// the f32 key.
using InverseCountNonnegativeFn = void(const Tensor& ids, Tensor& out);
extern KernelSlot<InverseCountNonnegativeFn> inverse_count_nonnegative;

// weight: [V, C]; ids: [N] i32; out: [N, C] = weight[ids].
using EmbeddingFwdFn = void(const Tensor& weight, const Tensor& ids, Tensor& out);
extern KernelSlot<EmbeddingFwdFn> embedding_forward;
// dweight[ids[n]] += dout[n].
using EmbeddingBwdFn = void(const Tensor& dout, const Tensor& ids, Tensor& dweight);
extern KernelSlot<EmbeddingBwdFn> embedding_backward;

// Causal multi-head self-attention. qkv: [B, T, 3C] (q, then k, then v; head h owns features
// h*D .. h*D+D-1 of each, D = C / n_head); out: [B, T, C]; att: [B, n_head, T, T] softmax
// probabilities (upper triangle zero), kept for backward, in qkv's dtype (half of the memory of
// f32 for half inputs: att is the largest activation; its rounding is relative, no cancellation
// follows in backward). Scale 1/sqrt(D).
using AttentionFwdFn = void(const Tensor& qkv, int n_head, Tensor& out, Tensor& att);
extern KernelSlot<AttentionFwdFn> attention_forward;
using AttentionBwdFn = void(const Tensor& dout, const Tensor& qkv, const Tensor& att, int n_head,
                            Tensor& dqkv);
extern KernelSlot<AttentionBwdFn> attention_backward;

// The same attention, fused (flash-attention style): optional, for backends with such a kernel
// (CUDA's). Forward writes out and lse [B, n_head, T] f32, the log-sum-exp of each row's scaled
// scores, instead of the probabilities; backward recomputes them from qkv, out and lse, so the
// memory kept and taken is linear in T. ops::CausalSelfAttention uses this pair where the
// device and dtype have a forward registered, else the probability slots above.
using FlashAttentionFwdFn = void(const Tensor& qkv, int n_head, Tensor& out, Tensor& lse);
extern KernelSlot<FlashAttentionFwdFn> flash_attention_forward;
// Writes dqkv.
using FlashAttentionBwdFn = void(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, int n_head, Tensor& dqkv);
extern KernelSlot<FlashAttentionBwdFn> flash_attention_backward;

// ---- Llama-family ops (RMSNorm, SiLU/SwiGLU, rotary embedding) ------------------------------
// x: [N, C]; weight: [C]; out: [N, C] = x * rstd * weight; rstd: [N] f32 whatever x's dtype,
// rstd = 1 / sqrt(mean(x^2) + eps), saved for backward (as LayerNorm's).
using RmsNormFwdFn = void(const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                          Tensor& rstd);
extern KernelSlot<RmsNormFwdFn> rmsnorm_forward;
// Writes dx; adds into dweight (callers zero it first for a fresh gradient).
using RmsNormBwdFn = void(const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& rstd, Tensor& dx, Tensor& dweight);
extern KernelSlot<RmsNormBwdFn> rmsnorm_backward;

// out = silu(gate) * up elementwise (silu(g) = g * sigmoid(g)), same numel. `up` may be
// undefined: out = silu(gate), plain SiLU, so one kernel serves both ops.
using SwiGluFwdFn = void(const Tensor& gate, const Tensor& up, Tensor& out);
extern KernelSlot<SwiGluFwdFn> swiglu_forward;
// dgate = dout * up * silu'(gate), dup = dout * silu(gate) (written, not added). With `up`
// undefined: dgate = dout * silu'(gate) and dup is not touched (pass an undefined tensor).
using SwiGluBwdFn = void(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                         Tensor& dup);
extern KernelSlot<SwiGluBwdFn> swiglu_backward;

// Rotary position embedding, the half-split layout (Hugging Face's rotate_half): x and out are
// [B, T, H, D] with D even; at sequence index t the position is
// p = (position_offset + t) / position_scale (linear scaling), and for i < D/2 the pair
// (x[i], x[i + D/2]) is rotated by the angle p * theta^(-2i/D):
//   out[i] = x[i] cos - x[i + D/2] sin,   out[i + D/2] = x[i + D/2] cos + x[i] sin.
// `inverse` rotates by the negative angle: the rotation is orthogonal, so that is the backward.
// Angles are formed in double (an f32 angle at position 10^4 is off by ~1e-3 rad).
struct RopeParams {
  float theta = 10000.0f;
  float position_scale = 1.0f;
  int64_t position_offset = 0;
  bool inverse = false;
};
using RopeFn = void(const Tensor& x, const RopeParams& p, Tensor& out);
extern KernelSlot<RopeFn> rope;

// Causal grouped-query attention. q: [B, T, H, D]; k, v: [B, T, Hkv, D] with H a multiple of
// Hkv: query head h reads K/V head h / (H / Hkv), Hugging Face's repeat_kv grouping, without a
// repeated copy of K and V. Hkv = H is multi-head attention, Hkv = 1 multi-query. out:
// [B, T, H, D]; att: [B, H, T, T] softmax probabilities (upper triangle zero) in q's dtype, kept
// for backward as attention_forward's. Scale 1/sqrt(D).
using GqaFwdFn = void(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& att);
extern KernelSlot<GqaFwdFn> gqa_forward;
// Writes dq, dk, dv (each K/V head's gradient sums over its group of query heads).
using GqaBwdFn = void(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& att, Tensor& dq, Tensor& dk, Tensor& dv);
extern KernelSlot<GqaBwdFn> gqa_backward;

// Dropout with a counter-based mask: element i is kept when DropoutKeep(seed, i, p), and then
// out[i] = x[i] * (1 / (1 - p)), else 0 (p = 1 drops everything). The mask is a pure function of
// (seed, i, p), so it needs no storage: backward is this same slot applied to the gradient with
// the same seed, and a recomputation (activation checkpointing) or another thread count or
// backend gives the same mask. x and out have the same numel (out may alias x).
using DropoutFn = void(const Tensor& x, float p, uint64_t seed, Tensor& out);
extern KernelSlot<DropoutFn> dropout;
// The mask every backend must reproduce: SplitMix64's finaliser of seed + (i + 1) * golden
// ratio, its top 24 bits as u in [0, 1), kept when u >= p.
inline bool DropoutKeep(uint64_t seed, uint64_t i, float p) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f) >= p;
}

// ---- Optimizer updates (in place, f32 only: mixed precision keeps f32 master weights) ------
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
};
// param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param), PyTorch's AdamW.
using AdamWFn = void(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p);
extern KernelSlot<AdamWFn> adamw;
struct SgdParams {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first_step;  // momentum buffer starts as the gradient, as in PyTorch
};
using SgdFn = void(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p);
extern KernelSlot<SgdFn> sgd;

}  // namespace braid::kernels

#endif  // BRAID_CORE_KERNELS_H_
