// Naive reference implementations of every slot in core/kernels.h, for tests only.
//
// Each function is the simplest loop that matches the slot's documented contract, single
// threaded, accumulating in double. Optimised backends are tested against these, and core's own
// tests run on them when no backend is linked in. Slow by design: keep tensors small.
//
// Conventions shared with the slots (and relied on by core/ops.cc): a `beta` of exactly 0 means
// the output's previous contents are not read (they may be uninitialised, even NaN), as in BLAS.
#ifndef BRAID_CORE_TESTING_REFERENCE_KERNELS_H_
#define BRAID_CORE_TESTING_REFERENCE_KERNELS_H_

#include "core/kernels.h"
#include "core/tensor.h"

namespace braid::reference {

using kernels::AdamWParams;
using kernels::BinaryOp;
using kernels::SgdParams;
using kernels::UnaryOp;

void copy(const Tensor& src, Tensor& dst);
void fill(Tensor& dst, float value);

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
void unary(UnaryOp op, const Tensor& a, float scalar, Tensor& out);
void unary_backward(UnaryOp op, const Tensor& a, const Tensor& grad_out, Tensor& grad_in);
void axpby(float alpha, const Tensor& x, float beta, Tensor& y);

void sum_all(const Tensor& a, Tensor& out);
void sum_rows(const Tensor& a, Tensor& out, float beta);

void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
            float alpha, float beta);

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       Tensor& out, Tensor& mean, Tensor& rstd);
void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                        Tensor& dbias);

void softmax_forward(const Tensor& x, Tensor& out);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                           Tensor& probs);
void inverse_count_nonnegative(const Tensor& ids, Tensor& out);
void cross_entropy_backward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                            Tensor& dlogits);

void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out);
void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dweight);

void attention_forward(const Tensor& qkv, int n_head, Tensor& out, Tensor& att);
void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int n_head,
                        Tensor& dqkv);

// reference_kernels_llama.cc.
void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& out, Tensor& rstd);
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                      const Tensor& rstd, Tensor& dx, Tensor& dweight);
void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out);
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup);
void rope(const Tensor& x, const kernels::RopeParams& p, Tensor& out);
void gqa_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& att);
void gqa_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& att, Tensor& dq, Tensor& dk, Tensor& dv);

void dropout(const Tensor& x, float p, uint64_t seed, Tensor& out);

void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p);
void sgd(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p);

// Fills every kernel slot that has no kCPU kernel yet with the reference above, so a real CPU
// backend linked into the same test keeps its own kernels. Idempotent.
void RegisterReferenceKernels();

}  // namespace braid::reference

#endif  // BRAID_CORE_TESTING_REFERENCE_KERNELS_H_
