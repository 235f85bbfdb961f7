// bf16 and f16 kernels for the CPU: every slot the ops use computes in f32 and rounds once.
//
// Each half kernel up-casts its half inputs into f32 scratch (vectorised, convert.h), runs the
// slot's f32 kernel, and rounds each output back once. Outputs the f32 kernel only writes get
// uninitialised scratch (no up-cast); outputs it adds into (dweight and dbias of LayerNorm's
// backward, sum_rows and matmul with beta != 0, axpby) are up-cast first, so the sum is formed in
// f32 and rounded once, never per addition. Embedding, whose weight is a large table of which a
// step touches a few rows, works on the half rows directly. The f32 kernel is looked up at each
// call, so a replaced f32 kernel is followed.
//
// Matrix products up-cast too: Debian's OpenBLAS 0.3.21 declares cblas_sbgemm in cblas.h but
// is built without BUILD_BFLOAT16 and does not export it (nm -D shows no sbgemm), so there is no
// bf16 GEMM to call; and none exists for f16.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "backends/cpu/convert.h"
#include "backends/cpu/simd.h"
#include "backends/cpu/thread_pool.h"
#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/kernels.h"

namespace braid::cpu {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

bool IsHalf(DType t) { return t == DType::kBF16 || t == DType::kF16; }

void CheckFloatOperand(const char* kernel, const Tensor& t) {
  BRAID_CHECK(IsFloating(t.dtype()))
      << "cpu " << kernel << " (half): " << t.DescribeForError() << " is not f32, bf16 or f16";
}

// An f32 tensor holding t's values (t itself when it is f32).
Tensor Up(const char* kernel, const Tensor& t) {
  CheckFloatOperand(kernel, t);
  if (t.dtype() == DType::kF32) return t;
  Tensor f = Tensor::Empty(t.shape(), DType::kF32, t.device());
  const char* src = static_cast<const char*>(t.raw_data());
  float* dst = f.data<float>();
  const DType dt = t.dtype();
  ParallelFor(t.numel(), kElementGrain, [&](int64_t b, int64_t e) {
    ToF32(dt, src + b * 2, dst + b, e - b);
  });
  return f;
}

// f32 scratch for an output the kernel only writes (t itself when it is f32).
Tensor Scratch(const char* kernel, const Tensor& t) {
  CheckFloatOperand(kernel, t);
  if (t.dtype() == DType::kF32) return t;
  return Tensor::Empty(t.shape(), DType::kF32, t.device());
}

// Rounds the f32 result f into t, once (nothing when t is f32: f is t).
void Down(const Tensor& f, const Tensor& t) {
  if (t.dtype() == DType::kF32) return;
  const float* src = f.data<float>();
  char* dst = static_cast<char*>(t.raw_data());
  const DType dt = t.dtype();
  ParallelFor(t.numel(), kElementGrain, [&](int64_t b, int64_t e) {
    FromF32(dt, src + b, dst + b * 2, e - b);
  });
}

constexpr DeviceType kCpu = DeviceType::kCPU;

// ---- Elementwise and reductions ------------------------------------------------------------

void Binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  Tensor A = Up("binary", a), B = Up("binary", b), O = Scratch("binary", out);
  kernels::binary.Get(out.device())(op, A, B, O);
  Down(O, out);
}

void Unary(UnaryOp op, const Tensor& a, float scalar, Tensor& out) {
  Tensor A = Up("unary", a), O = Scratch("unary", out);
  kernels::unary.Get(out.device())(op, A, scalar, O);
  Down(O, out);
}

void UnaryBackward(UnaryOp op, const Tensor& a, const Tensor& grad_out, Tensor& grad_in) {
  Tensor A = Up("unary_backward", a), G = Up("unary_backward", grad_out);
  Tensor O = Scratch("unary_backward", grad_in);
  kernels::unary_backward.Get(grad_in.device())(op, A, G, O);
  Down(O, grad_in);
}

// y = alpha x + beta y streamed in blocks through stack buffers: autograd's accumulation runs
// this for every half gradient, and it needs no scratch tensors. x and y may each be f32, bf16
// or f16 (kernels::AxpbyKey).
void Axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  CheckFloatOperand("axpby", x);
  CheckFloatOperand("axpby", y);
  const int64_t n = x.numel();
  BRAID_CHECK(y.numel() == n) << "cpu axpby: " << x.DescribeForError() << " and "
                              << y.DescribeForError() << " differ in size";
  const DType xt = x.dtype(), yt = y.dtype();
  const char* px = static_cast<const char*>(x.raw_data());
  char* py = static_cast<char*>(y.raw_data());
  const size_t xs = SizeOf(xt), ys = SizeOf(yt);
  ParallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
    constexpr int64_t kBlock = 512;
    float bx[kBlock], by[kBlock];
    for (int64_t i = b; i < e; i += kBlock) {
      const int64_t m = std::min(kBlock, e - i);
      ToF32(xt, px + i * xs, bx, m);
      // beta == 0: y is not read (it may be uninitialised), as in BLAS.
      if (beta != 0.0f) {
        ToF32(yt, py + i * ys, by, m);
        for (int64_t j = 0; j < m; ++j) by[j] = alpha * bx[j] + beta * by[j];
      } else {
        for (int64_t j = 0; j < m; ++j) by[j] = alpha * bx[j];
      }
      FromF32(yt, by, py + i * ys, m);
    }
  });
}

void SumAll(const Tensor& a, Tensor& out) {
  Tensor A = Up("sum_all", a), O = Scratch("sum_all", out);
  kernels::sum_all.Get(out.device())(A, O);
  Down(O, out);
}

void SumRows(const Tensor& a, Tensor& out, float beta) {
  Tensor A = Up("sum_rows", a);
  Tensor O = beta != 0.0f ? Up("sum_rows", out) : Scratch("sum_rows", out);
  kernels::sum_rows.Get(out.device())(A, O, beta);
  Down(O, out);
}

void Matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
            float alpha, float beta) {
  Tensor A = Up("matmul", a), B = Up("matmul", b);
  Tensor O = beta != 0.0f ? Up("matmul", out) : Scratch("matmul", out);
  kernels::matmul.Get(out.device())(A, B, O, trans_a, trans_b, alpha, beta);
  Down(O, out);
}

// ---- Fused neural-network ops ----------------------------------------------------------------

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& out, Tensor& mean, Tensor& rstd) {
  Tensor X = Up("layernorm_forward", x), W = Up("layernorm_forward", weight);
  Tensor B = Up("layernorm_forward", bias), O = Scratch("layernorm_forward", out);
  Tensor M = Scratch("layernorm_forward", mean), R = Scratch("layernorm_forward", rstd);
  kernels::layernorm_forward.Get(out.device())(X, W, B, eps, O, M, R);
  Down(O, out);
  Down(M, mean);
  Down(R, rstd);
}

void LayerNormBackward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                       Tensor& dbias) {
  const char* k = "layernorm_backward";
  Tensor G = Up(k, dout), X = Up(k, x), W = Up(k, weight), M = Up(k, mean), R = Up(k, rstd);
  // dweight and dbias are added into: their f32 values take the sums, rounded once after.
  Tensor DX = Scratch(k, dx), DW = Up(k, dweight), DB = Up(k, dbias);
  kernels::layernorm_backward.Get(dx.device())(G, X, W, M, R, DX, DW, DB);
  Down(DX, dx);
  Down(DW, dweight);
  Down(DB, dbias);
}

void SoftmaxForward(const Tensor& x, Tensor& out) {
  Tensor X = Up("softmax_forward", x), O = Scratch("softmax_forward", out);
  kernels::softmax_forward.Get(out.device())(X, O);
  Down(O, out);
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  Tensor Y = Up("softmax_backward", y), G = Up("softmax_backward", dy);
  Tensor O = Scratch("softmax_backward", dx);
  kernels::softmax_backward.Get(dx.device())(Y, G, O);
  Down(O, dx);
}

void CrossEntropyForward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                         Tensor& probs) {
  const char* k = "cross_entropy_forward";
  Tensor L = Up(k, logits), LS = Scratch(k, losses), P = Scratch(k, probs);
  kernels::cross_entropy_forward.Get(logits.device())(L, targets, LS, P);
  Down(LS, losses);
  Down(P, probs);
}

void CrossEntropyBackward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                          Tensor& dlogits) {
  const char* k = "cross_entropy_backward";
  Tensor P = Up(k, probs), D = Up(k, dloss), O = Scratch(k, dlogits);
  kernels::cross_entropy_backward.Get(dlogits.device())(P, targets, D, O);
  Down(O, dlogits);
}

void AttentionForward(const Tensor& qkv, int n_head, Tensor& out, Tensor& att) {
  Tensor Q = Up("attention_forward", qkv), O = Scratch("attention_forward", out);
  Tensor A = Scratch("attention_forward", att);
  kernels::attention_forward.Get(out.device())(Q, n_head, O, A);
  Down(O, out);
  Down(A, att);
}

void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int n_head,
                       Tensor& dqkv) {
  const char* k = "attention_backward";
  Tensor G = Up(k, dout), Q = Up(k, qkv), A = Up(k, att), O = Scratch(k, dqkv);
  kernels::attention_backward.Get(dqkv.device())(G, Q, A, n_head, O);
  Down(O, dqkv);
}

// ---- Embedding: on the half rows ----------------------------------------------------------------

// After the slot's checks (keyed by the table's dtype): the table is half, and the ids in range.
void CheckHalfTable(const char* kernel, const Tensor& table, const Tensor& ids) {
  BRAID_CHECK(IsHalf(table.dtype()))
      << "cpu " << kernel << " (half) wants a bf16 or f16 table, got " << table.DescribeForError();
  const int32_t* pi = ids.data<int32_t>();
  const int64_t v = table.size(0);
  for (int64_t r = 0, n = ids.numel(); r < n; ++r) {
    BRAID_CHECK(pi[r] >= 0 && pi[r] < v) << "cpu " << kernel << ": id " << pi[r]
                                         << " at position " << r << " outside [0, " << v << ")";
  }
}

// A gather: the rows are copied as they are (no arithmetic, so nothing to round).
void EmbeddingForward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  const auto dims = kernels::checks::EmbeddingForward("cpu", weight.dtype(), weight, ids, out);
  CheckHalfTable("embedding_forward", weight, ids);
  const int64_t c = dims.cols, n = dims.n;
  const uint16_t* pw = static_cast<const uint16_t*>(weight.raw_data());
  uint16_t* po = static_cast<uint16_t*>(out.raw_data());
  const int32_t* pi = ids.data<int32_t>();
  ParallelFor(n, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(c, 1)),
              [&](int64_t r0, int64_t r1) {
                for (int64_t r = r0; r < r1; ++r) {
                  std::memcpy(po + r * c, pw + int64_t(pi[r]) * c, size_t(c) * 2);
                }
              });
}

// dweight[id] += sum of dout[n] over the positions n with that id: per distinct id, the row's
// f32 value plus every contribution in position order, rounded once. Distinct ids own distinct
// rows, so threads split the ids with no races and the result does not depend on their number.
void EmbeddingBackward(const Tensor& dout, const Tensor& ids, Tensor& dweight) {
  const auto dims = kernels::checks::EmbeddingBackward("cpu", dweight.dtype(), dout, ids, dweight);
  CheckHalfTable("embedding_backward", dweight, ids);
  const int64_t c = dims.cols, n = dims.n;
  const DType dt = dweight.dtype();
  const uint16_t* pg = static_cast<const uint16_t*>(dout.raw_data());
  uint16_t* pw = static_cast<uint16_t*>(dweight.raw_data());
  const int32_t* pi = ids.data<int32_t>();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return pi[a] < pi[b]; });
  std::vector<int64_t> starts;  // where each distinct id's run begins in `order`
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || pi[order[size_t(i)]] != pi[order[size_t(i - 1)]]) starts.push_back(i);
  }
  const int64_t groups = int64_t(starts.size());
  starts.push_back(n);
  ParallelFor(groups, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(c, 1) / 4),
              [&](int64_t g0, int64_t g1) {
                std::vector<float> acc(static_cast<size_t>(c)), row(static_cast<size_t>(c));
                for (int64_t g = g0; g < g1; ++g) {
                  const int64_t id = pi[order[size_t(starts[size_t(g)])]];
                  ToF32(dt, pw + id * c, acc.data(), c);
                  for (int64_t i = starts[size_t(g)]; i < starts[size_t(g + 1)]; ++i) {
                    ToF32(dt, pg + order[size_t(i)] * c, row.data(), c);
                    for (int64_t j = 0; j < c; ++j) acc[size_t(j)] += row[size_t(j)];
                  }
                  FromF32(dt, acc.data(), pw + id * c, c);
                }
              });
}

// ---- Llama-family ops ------------------------------------------------------------------------

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& out, Tensor& rstd) {
  const char* k = "rmsnorm_forward";
  Tensor X = Up(k, x), W = Up(k, weight), O = Scratch(k, out), R = Scratch(k, rstd);
  kernels::rmsnorm_forward.Get(out.device())(X, W, eps, O, R);
  Down(O, out);
  Down(R, rstd);
}

void RmsNormBackward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                     Tensor& dx, Tensor& dweight) {
  const char* k = "rmsnorm_backward";
  Tensor G = Up(k, dout), X = Up(k, x), W = Up(k, weight), R = Up(k, rstd);
  // dweight is added into: its f32 value takes the sum, rounded once after.
  Tensor DX = Scratch(k, dx), DW = Up(k, dweight);
  kernels::rmsnorm_backward.Get(dx.device())(G, X, W, R, DX, DW);
  Down(DX, dx);
  Down(DW, dweight);
}

// `up` and `dup` are undefined for plain SiLU: they stay undefined.
Tensor UpIfDefined(const char* k, const Tensor& t) { return t.defined() ? Up(k, t) : t; }
Tensor ScratchIfDefined(const char* k, const Tensor& t) { return t.defined() ? Scratch(k, t) : t; }

void SwiGluForward(const Tensor& gate, const Tensor& up, Tensor& out) {
  const char* k = "swiglu_forward";
  Tensor G = Up(k, gate), U = UpIfDefined(k, up), O = Scratch(k, out);
  kernels::swiglu_forward.Get(out.device())(G, U, O);
  Down(O, out);
}

void SwiGluBackward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                    Tensor& dup) {
  const char* k = "swiglu_backward";
  Tensor D = Up(k, dout), G = Up(k, gate), U = UpIfDefined(k, up);
  Tensor DG = Scratch(k, dgate), DU = ScratchIfDefined(k, dup);
  kernels::swiglu_backward.Get(dgate.device())(D, G, U, DG, DU);
  Down(DG, dgate);
  if (dup.defined()) Down(DU, dup);
}

void Rope(const Tensor& x, const kernels::RopeParams& p, Tensor& out) {
  Tensor X = Up("rope", x), O = Scratch("rope", out);
  kernels::rope.Get(out.device())(X, p, O);
  Down(O, out);
}

void GqaForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& att) {
  const char* n = "gqa_forward";
  Tensor Q = Up(n, q), K = Up(n, k), V = Up(n, v), O = Scratch(n, out), A = Scratch(n, att);
  kernels::gqa_forward.Get(out.device())(Q, K, V, O, A);
  Down(O, out);
  Down(A, att);
}

void GqaBackward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& att, Tensor& dq, Tensor& dk, Tensor& dv) {
  const char* n = "gqa_backward";
  Tensor G = Up(n, dout), Q = Up(n, q), K = Up(n, k), V = Up(n, v), A = Up(n, att);
  Tensor DQ = Scratch(n, dq), DK = Scratch(n, dk), DV = Scratch(n, dv);
  kernels::gqa_backward.Get(dq.device())(G, Q, K, V, A, DQ, DK, DV);
  Down(DQ, dq);
  Down(DK, dk);
  Down(DV, dv);
}

void Dropout(const Tensor& x, float p, uint64_t seed, Tensor& out) {
  Tensor X = Up("dropout", x), O = Scratch("dropout", out);
  kernels::dropout.Get(out.device())(X, p, seed, O);
  Down(O, out);
}

template <typename Fn>
void RegisterBoth(kernels::KernelSlot<Fn>& slot, Fn* fn) {
  slot.Register(kCpu, DType::kBF16, fn);
  slot.Register(kCpu, DType::kF16, fn);
}

const bool kRegistered = [] {
  RegisterBoth(kernels::binary, &Binary);
  RegisterBoth(kernels::unary, &Unary);
  RegisterBoth(kernels::unary_backward, &UnaryBackward);
  RegisterBoth(kernels::axpby, &Axpby);
  RegisterBoth(kernels::sum_all, &SumAll);
  RegisterBoth(kernels::sum_rows, &SumRows);
  RegisterBoth(kernels::matmul, &Matmul);
  RegisterBoth(kernels::layernorm_forward, &LayerNormForward);
  RegisterBoth(kernels::layernorm_backward, &LayerNormBackward);
  RegisterBoth(kernels::softmax_forward, &SoftmaxForward);
  RegisterBoth(kernels::softmax_backward, &SoftmaxBackward);
  RegisterBoth(kernels::cross_entropy_forward, &CrossEntropyForward);
  RegisterBoth(kernels::cross_entropy_backward, &CrossEntropyBackward);
  RegisterBoth(kernels::embedding_forward, &EmbeddingForward);
  RegisterBoth(kernels::embedding_backward, &EmbeddingBackward);
  RegisterBoth(kernels::attention_forward, &AttentionForward);
  RegisterBoth(kernels::attention_backward, &AttentionBackward);
  RegisterBoth(kernels::rmsnorm_forward, &RmsNormForward);
  RegisterBoth(kernels::rmsnorm_backward, &RmsNormBackward);
  RegisterBoth(kernels::swiglu_forward, &SwiGluForward);
  RegisterBoth(kernels::swiglu_backward, &SwiGluBackward);
  RegisterBoth(kernels::rope, &Rope);
  RegisterBoth(kernels::gqa_forward, &GqaForward);
  RegisterBoth(kernels::gqa_backward, &GqaBackward);
  RegisterBoth(kernels::dropout, &Dropout);
  return true;
}();

}  // namespace
}  // namespace braid::cpu
