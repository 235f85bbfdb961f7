// Differentiable operations: each runs its device's kernel and records its backward.
// Shape errors are fatal and name the op and both shapes.
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
// Over the last dimension of x.
Tensor LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
Tensor Softmax(const Tensor& x);  // over the last dimension
// weight: [V, C]; ids: any shape, i32 -> [..., C].
Tensor Embedding(const Tensor& weight, const Tensor& ids);
// logits: [..., V]; targets: i32 with logits' leading shape; mean over targets >= 0.
Tensor CrossEntropy(const Tensor& logits, const Tensor& targets);
// qkv: [B, T, 3C] -> [B, T, C], causal, scale 1/sqrt(C / n_head).
Tensor CausalSelfAttention(const Tensor& qkv, int n_head);

}  // namespace braid::ops

#endif  // BRAID_CORE_OPS_H_
