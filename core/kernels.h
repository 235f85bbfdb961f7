// The per-device kernel table: the contract between core's differentiable ops and backends.
//
// Each slot is one op with a fixed C++ signature; a backend fills the slot for its device type
// (backends/cpu for kCPU, backends/cuda for kCUDA) from a static initialiser. Tensors passed in
// are contiguous, already shape-checked by the caller, and outputs are preallocated on the same
// device. Unless stated, kernels work on f32.
#ifndef BRAID_CORE_KERNELS_H_
#define BRAID_CORE_KERNELS_H_

#include "core/check.h"
#include "core/tensor.h"

namespace braid::kernels {

template <typename Fn>
class KernelSlot {
 public:
  explicit constexpr KernelSlot(const char* name) : name_(name) {}
  void Register(DeviceType type, Fn* fn) { fns_[int(type)] = fn; }
  Fn* Find(DeviceType type) const { return fns_[int(type)]; }
  Fn* Get(Device device) const {
    Fn* f = fns_[int(device.type)];
    BRAID_CHECK(f != nullptr) << "no kernel '" << name_ << "' for " << device
                              << ": link the backend for this device type into the program";
    return f;
  }
  const char* name() const { return name_; }

 private:
  const char* name_;
  Fn* fns_[kNumDeviceTypes] = {};
};

// Registers `fn` for `type` in `slot` at static-initialisation time (alwayslink the library).
#define BRAID_REGISTER_KERNEL(slot, type, fn) \
  static const bool BRAID_CONCAT(_braid_kernel_reg_, __COUNTER__) = ((slot).Register(type, fn), true)

// ---- Memory -------------------------------------------------------------------------------
// dst = src, same numel; converts between f32/bf16/f16 (and copies any dtype to itself).
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

// y = alpha * x + beta * y, same numel.
using AxpbyFn = void(float alpha, const Tensor& x, float beta, Tensor& y);
extern KernelSlot<AxpbyFn> axpby;

// ---- Reductions ---------------------------------------------------------------------------
// out[0] = sum of all elements of a (out is a 1-element f32 tensor).
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

// ---- Fused neural-network ops --------------------------------------------------------------
// x: [N, C]; weight, bias: [C]; out: [N, C]; mean, rstd: [N] (saved for backward).
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

// logits: [N, V] f32, targets: [N] i32 (a target < 0 is ignored). losses: [N] (0 where
// ignored); probs: [N, V] softmax, kept for backward.
using CrossEntropyFwdFn = void(const Tensor& logits, const Tensor& targets, Tensor& losses,
                               Tensor& probs);
extern KernelSlot<CrossEntropyFwdFn> cross_entropy_forward;
// dlogits[n] = (probs[n] - onehot(targets[n])) * dloss[n]; dloss: [N].
using CrossEntropyBwdFn = void(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                               Tensor& dlogits);
extern KernelSlot<CrossEntropyBwdFn> cross_entropy_backward;

// weight: [V, C]; ids: [N] i32; out: [N, C] = weight[ids].
using EmbeddingFwdFn = void(const Tensor& weight, const Tensor& ids, Tensor& out);
extern KernelSlot<EmbeddingFwdFn> embedding_forward;
// dweight[ids[n]] += dout[n].
using EmbeddingBwdFn = void(const Tensor& dout, const Tensor& ids, Tensor& dweight);
extern KernelSlot<EmbeddingBwdFn> embedding_backward;

// Causal multi-head self-attention. qkv: [B, T, 3C] (q, then k, then v; head h owns features
// h*D .. h*D+D-1 of each, D = C / n_head); out: [B, T, C]; att: [B, n_head, T, T] softmax
// probabilities (upper triangle zero), kept for backward. Scale 1/sqrt(D).
using AttentionFwdFn = void(const Tensor& qkv, int n_head, Tensor& out, Tensor& att);
extern KernelSlot<AttentionFwdFn> attention_forward;
using AttentionBwdFn = void(const Tensor& dout, const Tensor& qkv, const Tensor& att, int n_head,
                            Tensor& dqkv);
extern KernelSlot<AttentionBwdFn> attention_backward;

// ---- Optimizer updates (in place, f32) -----------------------------------------------------
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
