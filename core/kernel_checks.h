// The argument checks of the kernel table's slots (core/kernels.h), shared by every backend.
//
// Each slot's comment in kernels.h is a contract: which operands are f32 or i32 whatever the
// slot's dtype, which shapes go together. Every backend's kernels (the CPU, CUDA and the
// reference kernels of core/testing) check it the same way, so the checks live here once and a
// kernel calls the one for its slot first. `backend` ("cpu", "cuda", "reference") and the slot's
// name start every message, with the offending tensor (DescribeForError); `dtype` is the dtype
// the kernel computes in (its key in the table: DType::kF32 for an f32 kernel), which every
// floating operand of the slot has unless kernels.h fixes it (LayerNorm's mean and rstd,
// CrossEntropy's losses, probabilities and dloss: f32; targets and ids: i32).
//
// What stays with a backend: where its operands live (host or device), its own limits (BLAS's
// 32-bit sizes) and checks that read the data (target and id ranges), which only the host can
// afford.
#ifndef BRAID_CORE_KERNEL_CHECKS_H_
#define BRAID_CORE_KERNEL_CHECKS_H_

#include <cstdint>
#include <initializer_list>

#include "core/kernels.h"

namespace braid::kernels::checks {

// ---- Building blocks ------------------------------------------------------------------------
void NumelIs(const char* backend, const char* kernel, const Tensor& t, int64_t n);
void DTypeIs(const char* backend, const char* kernel, const Tensor& t, DType want);
void DTypesAre(const char* backend, const char* kernel, DType want,
               std::initializer_list<const Tensor*> ts);

// ---- What the checks give back ----------------------------------------------------------------
// A tensor viewed as `rows` rows of `cols` elements.
struct RowsDims {
  int64_t rows, cols;
};
// One batch entry: a is stored [a_rows, a_cols], b [b_rows, b_cols]; op(a) @ op(b) is [m, n]
// with inner dimension k.
struct MatmulDims {
  int64_t batch, m, n, k;
  int64_t a_rows, a_cols, b_rows, b_cols;
};
// weight [vocab, cols], n ids.
struct EmbeddingDims {
  int64_t vocab, cols, n;
};
// qkv [b, t, 3c]; h heads of d = c / h features.
struct AttentionDims {
  int64_t b, t, c, h, d;
};

// ---- One per slot ----------------------------------------------------------------------------
void Copy(const char* backend, const Tensor& src, const Tensor& dst);  // any dtypes
void Binary(const char* backend, DType dtype, const Tensor& a, const Tensor& b, const Tensor& out);
void Unary(const char* backend, DType dtype, const Tensor& a, const Tensor& out);
void UnaryBackward(const char* backend, DType dtype, UnaryOp op, const Tensor& a,
                   const Tensor& grad_out, const Tensor& grad_in);
// x and y both in `dtype`: a kernel taking mixed dtypes (see AxpbyKey) checks NumelIs alone.
void Axpby(const char* backend, DType dtype, const Tensor& x, const Tensor& y);
void SumAll(const char* backend, DType dtype, const Tensor& a, const Tensor& out);
RowsDims SumRows(const char* backend, DType dtype, const Tensor& a, const Tensor& out);
MatmulDims Matmul(const char* backend, DType dtype, const Tensor& a, const Tensor& b,
                  const Tensor& out, bool trans_a, bool trans_b);
RowsDims LayerNormForward(const char* backend, DType dtype, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, const Tensor& out, const Tensor& mean,
                          const Tensor& rstd);
RowsDims LayerNormBackward(const char* backend, DType dtype, const Tensor& dout, const Tensor& x,
                           const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dweight, const Tensor& dbias);
RowsDims SoftmaxForward(const char* backend, DType dtype, const Tensor& x, const Tensor& out);
RowsDims SoftmaxBackward(const char* backend, DType dtype, const Tensor& y, const Tensor& dy,
                         const Tensor& dx);
// rows = N, cols = V.
RowsDims CrossEntropyForward(const char* backend, DType dtype, const Tensor& logits,
                             const Tensor& targets, const Tensor& losses, const Tensor& probs);
RowsDims CrossEntropyBackward(const char* backend, DType dtype, const Tensor& probs,
                              const Tensor& targets, const Tensor& dloss, const Tensor& dlogits);
EmbeddingDims EmbeddingForward(const char* backend, DType dtype, const Tensor& weight,
                               const Tensor& ids, const Tensor& out);
EmbeddingDims EmbeddingBackward(const char* backend, DType dtype, const Tensor& dout,
                                const Tensor& ids, const Tensor& dweight);
AttentionDims AttentionForward(const char* backend, DType dtype, const Tensor& qkv, int n_head,
                               const Tensor& out, const Tensor& att);
AttentionDims AttentionBackward(const char* backend, DType dtype, const Tensor& dout,
                                const Tensor& qkv, const Tensor& att, int n_head,
                                const Tensor& dqkv);
// lse [B, n_head, T] f32 whatever the dtype.
AttentionDims FlashAttentionForward(const char* backend, DType dtype, const Tensor& qkv,
                                    int n_head, const Tensor& out, const Tensor& lse);
AttentionDims FlashAttentionBackward(const char* backend, DType dtype, const Tensor& dout,
                                     const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     int n_head, const Tensor& dqkv);
RowsDims RmsNormForward(const char* backend, DType dtype, const Tensor& x, const Tensor& weight,
                        const Tensor& out, const Tensor& rstd);
RowsDims RmsNormBackward(const char* backend, DType dtype, const Tensor& dout, const Tensor& x,
                         const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                         const Tensor& dweight);
// Returns the element count; `up` (and `dup`) may be undefined (plain SiLU).
int64_t SwiGluForward(const char* backend, DType dtype, const Tensor& gate, const Tensor& up,
                      const Tensor& out);
int64_t SwiGluBackward(const char* backend, DType dtype, const Tensor& dout, const Tensor& gate,
                       const Tensor& up, const Tensor& dgate, const Tensor& dup);
// x [b, t, h, d], d even, out x's shape; position_scale > 0 and finite, theta > 0.
struct RopeDims {
  int64_t b, t, h, d;
};
RopeDims Rope(const char* backend, DType dtype, const Tensor& x, const RopeParams& p,
              const Tensor& out);
// q [b, t, h, d], k and v [b, t, hkv, d], h a multiple of hkv.
struct GqaDims {
  int64_t b, t, h, hkv, d;
};
GqaDims GqaForward(const char* backend, DType dtype, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& out, const Tensor& att);
GqaDims GqaBackward(const char* backend, DType dtype, const Tensor& dout, const Tensor& q,
                    const Tensor& k, const Tensor& v, const Tensor& att, const Tensor& dq,
                    const Tensor& dk, const Tensor& dv);
// 0 <= p <= 1; returns the element count.
int64_t Dropout(const char* backend, DType dtype, const Tensor& x, float p, const Tensor& out);
// The optimizer slots are f32 only (master weights), so they take no dtype.
void AdamW(const char* backend, const Tensor& param, const Tensor& grad, const Tensor& m,
           const Tensor& v, const AdamWParams& p);
// momentum_buf is checked only when p.momentum != 0 (it is unused, maybe empty, otherwise).
void Sgd(const char* backend, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
         const SgdParams& p);

}  // namespace braid::kernels::checks

#endif  // BRAID_CORE_KERNEL_CHECKS_H_
