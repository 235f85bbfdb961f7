#include "core/kernel_checks.h"

#include <cmath>
#include <ostream>

namespace braid::kernels::checks {
namespace {

// "cpu kernel 'layernorm_forward'": how every message starts.
struct Where {
  const char* backend;
  const char* kernel;
};
std::ostream& operator<<(std::ostream& os, const Where& w) {
  return os << w.backend << " kernel '" << w.kernel << "'";
}

// x is whole rows of `cols` elements, cols being `of`'s element count.
void RowsOf(const char* backend, const char* kernel, const Tensor& x, int64_t cols,
            const Tensor& of) {
  BRAID_CHECK(cols > 0 && x.numel() % cols == 0)
      << Where{backend, kernel} << ": " << x.DescribeForError() << " is not rows of "
      << of.DescribeForError();
}

// Updates stay f32: with half parameters, mixed precision keeps f32 master weights (and f32
// gradients for them), and the optimizer updates those, not the half copies.
void OptimizerOperand(const char* backend, const char* kernel, const Tensor& t, int64_t n) {
  BRAID_CHECK(t.dtype() == DType::kF32)
      << Where{backend, kernel} << ": " << t.DescribeForError() << " is not f32: optimizer "
      << "updates run on f32 only; for bf16/f16 parameters keep f32 master weights (mixed "
      << "precision) and update those";
  NumelIs(backend, kernel, t, n);
}

// Both cross-entropy slots: `rows_of` ([N, V], `name` in the message) gives N and V; targets
// and `per_row` have N elements, `like_rows_of` N * V.
RowsDims CrossEntropyShapes(const char* backend, const char* kernel, const char* name,
                            const Tensor& rows_of, const Tensor& targets, const Tensor& per_row,
                            const Tensor& like_rows_of) {
  BRAID_CHECK(rows_of.ndim() == 2) << Where{backend, kernel} << " wants " << name
                                   << " [N, V], got " << rows_of.DescribeForError();
  const int64_t n = rows_of.size(0), v = rows_of.size(1);
  NumelIs(backend, kernel, targets, n);
  NumelIs(backend, kernel, per_row, n);
  NumelIs(backend, kernel, like_rows_of, n * v);
  return {n, v};
}

// Both embedding slots: a [V, C] table (`table_name` in the message), i32 ids and [N, C] rows.
EmbeddingDims Embedding(const char* backend, const char* kernel, DType dtype,
                        const char* table_name, const Tensor& table, const Tensor& ids,
                        const Tensor& rows) {
  DTypesAre(backend, kernel, dtype, {&table, &rows});
  DTypeIs(backend, kernel, ids, DType::kI32);
  BRAID_CHECK(table.ndim() == 2) << Where{backend, kernel} << " wants " << table_name
                                 << " [V, C], got " << table.DescribeForError();
  const EmbeddingDims d{table.size(0), table.size(1), ids.numel()};
  NumelIs(backend, kernel, rows, d.n * d.cols);
  return d;
}

// Both attention slots: qkv [B, T, 3C] with C divisible by n_head.
AttentionDims Attention(const char* backend, const char* kernel, const Tensor& qkv, int n_head) {
  BRAID_CHECK(qkv.ndim() == 3 && n_head > 0 && qkv.size(2) % (3 * int64_t(n_head)) == 0)
      << Where{backend, kernel} << " wants qkv [B, T, 3C] with C divisible by n_head=" << n_head
      << ", got " << qkv.DescribeForError();
  AttentionDims a;
  a.b = qkv.size(0);
  a.t = qkv.size(1);
  a.c = qkv.size(2) / 3;
  a.h = n_head;
  a.d = a.c / n_head;
  return a;
}

// A normalisation over rows (LayerNorm, RMSNorm, forward or backward): x is rows of
// weight.numel() columns; each of `like_x` holds as many values as x, each of `per_column` one
// per column (bias, the weight's gradients), each of `per_row` one per row (saved statistics).
RowsDims NormRows(const char* backend, const char* k, const Tensor& x, const Tensor& weight,
                  std::initializer_list<const Tensor*> like_x,
                  std::initializer_list<const Tensor*> per_column,
                  std::initializer_list<const Tensor*> per_row) {
  const int64_t c = weight.numel();
  RowsOf(backend, k, x, c, weight);
  const int64_t rows = x.numel() / c;
  for (const Tensor* t : like_x) NumelIs(backend, k, *t, x.numel());
  for (const Tensor* t : per_column) NumelIs(backend, k, *t, c);
  for (const Tensor* t : per_row) NumelIs(backend, k, *t, rows);
  return {rows, c};
}

}  // namespace

// ---- Building blocks ------------------------------------------------------------------------

void NumelIs(const char* backend, const char* kernel, const Tensor& t, int64_t n) {
  BRAID_CHECK(t.numel() == n) << Where{backend, kernel} << ": " << t.DescribeForError()
                              << " should have " << n << " elements";
}

void DTypeIs(const char* backend, const char* kernel, const Tensor& t, DType want) {
  BRAID_CHECK(t.dtype() == want) << Where{backend, kernel} << " wants " << DTypeName(want)
                                 << ", got " << t.DescribeForError();
}

void DTypesAre(const char* backend, const char* kernel, DType want,
               std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) DTypeIs(backend, kernel, *t, want);
}

// ---- Memory and elementwise -------------------------------------------------------------------

void Copy(const char* backend, const Tensor& src, const Tensor& dst) {
  NumelIs(backend, copy.name(), dst, src.numel());
}

void Binary(const char* backend, DType dtype, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* k = binary.name();
  DTypesAre(backend, k, dtype, {&a, &b, &out});
  const int64_t n = a.numel(), nb = b.numel();
  NumelIs(backend, k, out, n);
  BRAID_CHECK(nb == n || (nb > 0 && n % nb == 0))
      << Where{backend, k} << ": " << b.DescribeForError() << " neither matches nor repeats along "
      << a.DescribeForError();
}

void Unary(const char* backend, DType dtype, const Tensor& a, const Tensor& out) {
  DTypesAre(backend, unary.name(), dtype, {&a, &out});
  NumelIs(backend, unary.name(), out, a.numel());
}

void UnaryBackward(const char* backend, DType dtype, UnaryOp op, const Tensor& a,
                   const Tensor& grad_out, const Tensor& grad_in) {
  const char* k = unary_backward.name();
  DTypesAre(backend, k, dtype, {&a, &grad_out, &grad_in});
  NumelIs(backend, k, grad_out, a.numel());
  NumelIs(backend, k, grad_in, a.numel());
  BRAID_CHECK(op != UnaryOp::kScale)
      << Where{backend, k} << ": kScale's derivative is its scalar, which this slot does not "
      << "receive; scale the gradient with `unary` instead";
}

void Axpby(const char* backend, DType dtype, const Tensor& x, const Tensor& y) {
  DTypesAre(backend, axpby.name(), dtype, {&x, &y});
  NumelIs(backend, axpby.name(), y, x.numel());
}

// ---- Reductions and matrix products -----------------------------------------------------------

void SumAll(const char* backend, DType dtype, const Tensor& a, const Tensor& out) {
  DTypesAre(backend, sum_all.name(), dtype, {&a, &out});
  NumelIs(backend, sum_all.name(), out, 1);
}

RowsDims SumRows(const char* backend, DType dtype, const Tensor& a, const Tensor& out) {
  DTypesAre(backend, sum_rows.name(), dtype, {&a, &out});
  const int64_t cols = out.numel();
  RowsOf(backend, sum_rows.name(), a, cols, out);
  return {a.numel() / cols, cols};
}

MatmulDims Matmul(const char* backend, DType dtype, const Tensor& a, const Tensor& b,
                  const Tensor& out, bool trans_a, bool trans_b) {
  const char* k = matmul.name();
  DTypesAre(backend, k, dtype, {&a, &b, &out});
  const bool batched = a.ndim() == 3;
  BRAID_CHECK((a.ndim() == 2 && b.ndim() == 2 && out.ndim() == 2) ||
              (batched && b.ndim() == 3 && out.ndim() == 3 && a.size(0) == b.size(0) &&
               a.size(0) == out.size(0)))
      << Where{backend, k} << " wants 2-D or same-batch 3-D operands, got "
      << a.DescribeForError() << ", " << b.DescribeForError() << " -> " << out.DescribeForError();
  MatmulDims d;
  d.batch = batched ? a.size(0) : 1;
  d.a_rows = a.size(-2), d.a_cols = a.size(-1), d.b_rows = b.size(-2), d.b_cols = b.size(-1);
  d.m = trans_a ? d.a_cols : d.a_rows;
  d.k = trans_a ? d.a_rows : d.a_cols;
  d.n = trans_b ? d.b_rows : d.b_cols;
  const int64_t kb = trans_b ? d.b_cols : d.b_rows;
  BRAID_CHECK(d.k == kb && out.size(-2) == d.m && out.size(-1) == d.n)
      << Where{backend, k} << ": " << a.DescribeForError() << (trans_a ? "^T" : "") << " @ "
      << b.DescribeForError() << (trans_b ? "^T" : "") << " does not give "
      << out.DescribeForError();
  return d;
}

// ---- Fused neural-network ops -----------------------------------------------------------------

RowsDims LayerNormForward(const char* backend, DType dtype, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, const Tensor& out, const Tensor& mean,
                          const Tensor& rstd) {
  const char* k = layernorm_forward.name();
  DTypesAre(backend, k, dtype, {&x, &weight, &bias, &out});
  DTypesAre(backend, k, DType::kF32, {&mean, &rstd});
  return NormRows(backend, k, x, weight, {&out}, {&bias}, {&mean, &rstd});
}

RowsDims LayerNormBackward(const char* backend, DType dtype, const Tensor& dout, const Tensor& x,
                           const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const char* k = layernorm_backward.name();
  DTypesAre(backend, k, dtype, {&dout, &x, &weight, &dx, &dweight, &dbias});
  DTypesAre(backend, k, DType::kF32, {&mean, &rstd});
  return NormRows(backend, k, x, weight, {&dout, &dx}, {&dweight, &dbias}, {&mean, &rstd});
}

RowsDims SoftmaxForward(const char* backend, DType dtype, const Tensor& x, const Tensor& out) {
  const char* k = softmax_forward.name();
  DTypesAre(backend, k, dtype, {&x, &out});
  NumelIs(backend, k, out, x.numel());
  BRAID_CHECK(x.ndim() >= 1) << Where{backend, k} << " of a scalar " << x.DescribeForError();
  const int64_t c = x.size(-1);
  return {c == 0 ? 0 : x.numel() / c, c};
}

RowsDims SoftmaxBackward(const char* backend, DType dtype, const Tensor& y, const Tensor& dy,
                         const Tensor& dx) {
  const char* k = softmax_backward.name();
  DTypesAre(backend, k, dtype, {&y, &dy, &dx});
  NumelIs(backend, k, dy, y.numel());
  NumelIs(backend, k, dx, y.numel());
  BRAID_CHECK(y.ndim() >= 1) << Where{backend, k} << " of a scalar " << y.DescribeForError();
  const int64_t c = y.size(-1);
  return {c == 0 ? 0 : y.numel() / c, c};
}

RowsDims CrossEntropyForward(const char* backend, DType dtype, const Tensor& logits,
                             const Tensor& targets, const Tensor& losses, const Tensor& probs) {
  const char* k = cross_entropy_forward.name();
  DTypeIs(backend, k, logits, dtype);
  DTypeIs(backend, k, targets, DType::kI32);
  DTypesAre(backend, k, DType::kF32, {&losses, &probs});
  return CrossEntropyShapes(backend, k, "logits", logits, targets, losses, probs);
}

RowsDims CrossEntropyBackward(const char* backend, DType dtype, const Tensor& probs,
                              const Tensor& targets, const Tensor& dloss, const Tensor& dlogits) {
  const char* k = cross_entropy_backward.name();
  DTypesAre(backend, k, DType::kF32, {&probs, &dloss});
  DTypeIs(backend, k, targets, DType::kI32);
  DTypeIs(backend, k, dlogits, dtype);
  return CrossEntropyShapes(backend, k, "probs", probs, targets, dloss, dlogits);
}

EmbeddingDims EmbeddingForward(const char* backend, DType dtype, const Tensor& weight,
                               const Tensor& ids, const Tensor& out) {
  return Embedding(backend, embedding_forward.name(), dtype, "weight", weight, ids, out);
}

EmbeddingDims EmbeddingBackward(const char* backend, DType dtype, const Tensor& dout,
                                const Tensor& ids, const Tensor& dweight) {
  return Embedding(backend, embedding_backward.name(), dtype, "dweight", dweight, ids, dout);
}

AttentionDims AttentionForward(const char* backend, DType dtype, const Tensor& qkv, int n_head,
                               const Tensor& out, const Tensor& att) {
  const char* k = attention_forward.name();
  DTypesAre(backend, k, dtype, {&qkv, &out, &att});
  const AttentionDims s = Attention(backend, k, qkv, n_head);
  NumelIs(backend, k, out, s.b * s.t * s.c);
  NumelIs(backend, k, att, s.b * s.h * s.t * s.t);
  return s;
}

AttentionDims AttentionBackward(const char* backend, DType dtype, const Tensor& dout,
                                const Tensor& qkv, const Tensor& att, int n_head,
                                const Tensor& dqkv) {
  const char* k = attention_backward.name();
  DTypesAre(backend, k, dtype, {&dout, &qkv, &att, &dqkv});
  const AttentionDims s = Attention(backend, k, qkv, n_head);
  NumelIs(backend, k, dout, s.b * s.t * s.c);
  NumelIs(backend, k, att, s.b * s.h * s.t * s.t);
  NumelIs(backend, k, dqkv, qkv.numel());
  return s;
}

AttentionDims FlashAttentionForward(const char* backend, DType dtype, const Tensor& qkv,
                                    int n_head, const Tensor& out, const Tensor& lse) {
  const char* k = flash_attention_forward.name();
  DTypesAre(backend, k, dtype, {&qkv, &out});
  DTypeIs(backend, k, lse, DType::kF32);
  const AttentionDims s = Attention(backend, k, qkv, n_head);
  NumelIs(backend, k, out, s.b * s.t * s.c);
  NumelIs(backend, k, lse, s.b * s.h * s.t);
  return s;
}

AttentionDims FlashAttentionBackward(const char* backend, DType dtype, const Tensor& dout,
                                     const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     int n_head, const Tensor& dqkv) {
  const char* k = flash_attention_backward.name();
  DTypesAre(backend, k, dtype, {&dout, &qkv, &out, &dqkv});
  DTypeIs(backend, k, lse, DType::kF32);
  const AttentionDims s = Attention(backend, k, qkv, n_head);
  NumelIs(backend, k, dout, s.b * s.t * s.c);
  NumelIs(backend, k, out, s.b * s.t * s.c);
  NumelIs(backend, k, lse, s.b * s.h * s.t);
  NumelIs(backend, k, dqkv, qkv.numel());
  return s;
}

// ---- Llama-family ops ---------------------------------------------------------------------

RowsDims RmsNormForward(const char* backend, DType dtype, const Tensor& x, const Tensor& weight,
                        const Tensor& out, const Tensor& rstd) {
  const char* k = rmsnorm_forward.name();
  DTypesAre(backend, k, dtype, {&x, &weight, &out});
  DTypeIs(backend, k, rstd, DType::kF32);
  return NormRows(backend, k, x, weight, {&out}, {}, {&rstd});
}

RowsDims RmsNormBackward(const char* backend, DType dtype, const Tensor& dout, const Tensor& x,
                         const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                         const Tensor& dweight) {
  const char* k = rmsnorm_backward.name();
  DTypesAre(backend, k, dtype, {&dout, &x, &weight, &dx, &dweight});
  DTypeIs(backend, k, rstd, DType::kF32);
  return NormRows(backend, k, x, weight, {&dout, &dx}, {&dweight}, {&rstd});
}

int64_t SwiGluForward(const char* backend, DType dtype, const Tensor& gate, const Tensor& up,
                      const Tensor& out) {
  const char* k = swiglu_forward.name();
  DTypesAre(backend, k, dtype, {&gate, &out});
  NumelIs(backend, k, out, gate.numel());
  if (up.defined()) {
    DTypeIs(backend, k, up, dtype);
    NumelIs(backend, k, up, gate.numel());
  }
  return gate.numel();
}

int64_t SwiGluBackward(const char* backend, DType dtype, const Tensor& dout, const Tensor& gate,
                       const Tensor& up, const Tensor& dgate, const Tensor& dup) {
  const char* k = swiglu_backward.name();
  DTypesAre(backend, k, dtype, {&dout, &gate, &dgate});
  const int64_t n = gate.numel();
  NumelIs(backend, k, dout, n);
  NumelIs(backend, k, dgate, n);
  // dup is written exactly when up is given: a caller that passes one without the other has
  // mixed up SiLU and SwiGLU.
  BRAID_CHECK(up.defined() == dup.defined())
      << Where{backend, k} << ": up and dup must be both given (SwiGLU) or both undefined (SiLU)";
  if (up.defined()) {
    DTypesAre(backend, k, dtype, {&up, &dup});
    NumelIs(backend, k, up, n);
    NumelIs(backend, k, dup, n);
  }
  return n;
}

RopeDims Rope(const char* backend, DType dtype, const Tensor& x, const RopeParams& p,
              const Tensor& out) {
  const char* k = rope.name();
  DTypesAre(backend, k, dtype, {&x, &out});
  BRAID_CHECK(x.ndim() == 4 && x.size(3) % 2 == 0)
      << Where{backend, k} << " wants x [B, T, H, D] with D even, got " << x.DescribeForError();
  NumelIs(backend, k, out, x.numel());
  BRAID_CHECK(p.theta > 0.0f && std::isfinite(p.theta) && p.position_scale > 0.0f &&
              std::isfinite(p.position_scale) && p.position_offset >= 0)
      << Where{backend, k} << ": theta " << p.theta << " and position_scale "
      << p.position_scale << " must be positive and finite, position_offset "
      << p.position_offset << " not negative";
  return {x.size(0), x.size(1), x.size(2), x.size(3)};
}

namespace {
GqaDims GqaShapes(const char* backend, const char* k, const Tensor& q, const Tensor& key,
                  const Tensor& v, const Tensor& att) {
  BRAID_CHECK(q.ndim() == 4 && key.ndim() == 4 && v.shape() == key.shape() &&
              key.size(0) == q.size(0) && key.size(1) == q.size(1) && key.size(3) == q.size(3) &&
              key.size(2) > 0 && q.size(2) % key.size(2) == 0)
      << Where{backend, k} << " wants q [B, T, H, D] and k, v [B, T, Hkv, D] with H a multiple "
      << "of Hkv, got q " << q.DescribeForError() << ", k " << key.DescribeForError() << ", v "
      << v.DescribeForError();
  const GqaDims d{q.size(0), q.size(1), q.size(2), key.size(2), q.size(3)};
  NumelIs(backend, k, att, d.b * d.h * d.t * d.t);
  return d;
}
}  // namespace

GqaDims GqaForward(const char* backend, DType dtype, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& out, const Tensor& att) {
  const char* name = gqa_forward.name();
  DTypesAre(backend, name, dtype, {&q, &k, &v, &out, &att});
  const GqaDims d = GqaShapes(backend, name, q, k, v, att);
  NumelIs(backend, name, out, q.numel());
  return d;
}

GqaDims GqaBackward(const char* backend, DType dtype, const Tensor& dout, const Tensor& q,
                    const Tensor& k, const Tensor& v, const Tensor& att, const Tensor& dq,
                    const Tensor& dk, const Tensor& dv) {
  const char* name = gqa_backward.name();
  DTypesAre(backend, name, dtype, {&dout, &q, &k, &v, &att, &dq, &dk, &dv});
  const GqaDims d = GqaShapes(backend, name, q, k, v, att);
  NumelIs(backend, name, dout, q.numel());
  NumelIs(backend, name, dq, q.numel());
  NumelIs(backend, name, dk, k.numel());
  NumelIs(backend, name, dv, v.numel());
  return d;
}

int64_t Dropout(const char* backend, DType dtype, const Tensor& x, float p, const Tensor& out) {
  const char* k = dropout.name();
  DTypesAre(backend, k, dtype, {&x, &out});
  NumelIs(backend, k, out, x.numel());
  BRAID_CHECK(p >= 0.0f && p <= 1.0f) << Where{backend, k} << ": p " << p << " is not in [0, 1]";
  return x.numel();
}

// ---- Optimizer updates ------------------------------------------------------------------------

void AdamW(const char* backend, const Tensor& param, const Tensor& grad, const Tensor& m,
           const Tensor& v, const AdamWParams& p) {
  const char* k = adamw.name();
  for (const Tensor* t : {&param, &grad, &m, &v}) OptimizerOperand(backend, k, *t, param.numel());
  BRAID_CHECK(p.step >= 1) << Where{backend, k} << ": step is 1-based, got " << p.step;
}

void Sgd(const char* backend, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
         const SgdParams& p) {
  const char* k = sgd.name();
  OptimizerOperand(backend, k, param, param.numel());
  OptimizerOperand(backend, k, grad, param.numel());
  if (p.momentum != 0.0f) OptimizerOperand(backend, k, momentum_buf, param.numel());
}

}  // namespace braid::kernels::checks
