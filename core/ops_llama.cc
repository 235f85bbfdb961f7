// The Llama-family ops of core/ops.h: RmsNorm, Silu, SwiGlu, RotaryEmbedding,
// GroupedQueryAttention, Dropout. Same shape as ops.cc: check, run the device's kernel, record
// the backward.
#include <cmath>

#include "core/autograd.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "core/ops_internal.h"

namespace braid::ops {

using autograd::RecordFunction;
using autograd::SavedTensor;
using internal::CheckFloat;
using internal::CheckSameDType;
using internal::CheckSameDevice;
using internal::EmptyLike;

Tensor RmsNorm(const Tensor& x, const Tensor& weight, float eps) {
  CheckFloat("RmsNorm", x);
  BRAID_CHECK(x.ndim() >= 1 && weight.ndim() == 1 && weight.size(0) == x.size(-1) &&
              x.size(-1) > 0)
      << "RmsNorm: weight " << weight.DescribeForError() << " must be [" << x.size(-1)
      << "], the last dimension of input " << x.DescribeForError();
  CheckSameDevice("RmsNorm", x, weight);
  CheckSameDType("RmsNorm", x, weight);
  BRAID_CHECK(eps >= 0.0f) << "RmsNorm: eps " << eps << " is negative";
  const int64_t c = x.size(-1), n = x.numel() / c;
  Tensor out = EmptyLike(x);
  // f32 whatever x's dtype: one value per row, and a half rstd would scale the whole row's
  // gradient by its rounding error.
  Tensor rstd = Tensor::Empty({n}, DType::kF32, x.device());
  Tensor o2 = out.Detach().Reshape({n, c});
  kernels::rmsnorm_forward.Get(x.device(), x.dtype())(x.Detach().Reshape({n, c}), weight, eps,
                                                      o2, rstd);
  SavedTensor sx(x), sw(weight), sr(rstd);
  RecordFunction("RmsNorm", {x, weight}, {&out}, [sx, sw, sr, n, c](const std::vector<Tensor>& g) {
    Tensor X = sx.Get(), W = sw.Get();
    Tensor dx = EmptyLike(X);
    Tensor dw = Tensor::Zeros({c}, W.dtype(), X.device());
    Tensor dx2 = dx.Reshape({n, c});
    kernels::rmsnorm_backward.Get(X.device(), X.dtype())(g[0].Reshape({n, c}), X.Reshape({n, c}),
                                                         W, sr.Get(), dx2, dw);
    return std::vector<Tensor>{dx, dw};
  });
  return out;
}

Tensor Silu(const Tensor& a) {
  CheckFloat("Silu", a);
  Tensor out = EmptyLike(a);
  kernels::swiglu_forward.Get(a.device(), a.dtype())(a.Detach(), Tensor(), out);
  SavedTensor sa(a);
  RecordFunction("Silu", {a}, {&out}, [sa](const std::vector<Tensor>& g) {
    Tensor A = sa.Get();
    Tensor da = EmptyLike(A), none;
    kernels::swiglu_backward.Get(A.device(), A.dtype())(g[0], A, Tensor(), da, none);
    return std::vector<Tensor>{da};
  });
  return out;
}

Tensor SwiGlu(const Tensor& gate, const Tensor& up) {
  CheckFloat("SwiGlu", gate);
  CheckSameDevice("SwiGlu", gate, up);
  CheckSameDType("SwiGlu", gate, up);
  BRAID_CHECK(gate.shape() == up.shape())
      << "SwiGlu: gate " << gate.DescribeForError() << " and up " << up.DescribeForError()
      << " must have the same shape";
  Tensor out = EmptyLike(gate);
  kernels::swiglu_forward.Get(gate.device(), gate.dtype())(gate.Detach(), up.Detach(), out);
  SavedTensor sg(gate), su(up);
  RecordFunction("SwiGlu", {gate, up}, {&out}, [sg, su](const std::vector<Tensor>& g) {
    Tensor G = sg.Get(), U = su.Get();
    Tensor dg = EmptyLike(G), du = EmptyLike(U);
    kernels::swiglu_backward.Get(G.device(), G.dtype())(g[0], G, U, dg, du);
    return std::vector<Tensor>{dg, du};
  });
  return out;
}

Tensor RotaryEmbedding(const Tensor& x, const RopeOptions& opts) {
  CheckFloat("RotaryEmbedding", x);
  BRAID_CHECK(x.ndim() == 4 && x.size(3) % 2 == 0)
      << "RotaryEmbedding wants x [B, T, n_head, head_dim] with head_dim even, got "
      << x.DescribeForError();
  BRAID_CHECK(opts.theta > 0.0f && opts.position_scale > 0.0f && opts.ntk_factor > 0.0f &&
              opts.position_offset >= 0)
      << "RotaryEmbedding: theta " << opts.theta << ", position_scale " << opts.position_scale
      << " and ntk_factor " << opts.ntk_factor << " must be positive, position_offset "
      << opts.position_offset << " not negative";
  const int64_t d = x.size(3);
  kernels::RopeParams p;
  // NTK-aware: theta * factor^(D / (D - 2)) makes the lowest frequency theta^(-(D-2)/D) slower by
  // exactly the factor. D = 2 has only the frequency 1, which no base changes.
  p.theta = opts.ntk_factor == 1.0f || d <= 2
                ? opts.theta
                : float(double(opts.theta) *
                        std::pow(double(opts.ntk_factor), double(d) / double(d - 2)));
  p.position_scale = opts.position_scale;
  p.position_offset = opts.position_offset;
  Tensor out = EmptyLike(x);
  kernels::rope.Get(x.device(), x.dtype())(x.Detach(), p, out);
  const Shape shape = x.shape();
  RecordFunction("RotaryEmbedding", {x}, {&out}, [p, shape](const std::vector<Tensor>& g) {
    // The rotation is orthogonal: its transpose, the gradient's map, is the inverse rotation.
    kernels::RopeParams inv = p;
    inv.inverse = true;
    Tensor dx = EmptyLike(g[0]).Reshape(shape);
    kernels::rope.Get(dx.device(), dx.dtype())(g[0].Reshape(shape), inv, dx);
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor GroupedQueryAttention(const Tensor& q, const Tensor& k, const Tensor& v) {
  CheckFloat("GroupedQueryAttention", q);
  CheckSameDevice("GroupedQueryAttention", q, k);
  CheckSameDevice("GroupedQueryAttention", q, v);
  CheckSameDType("GroupedQueryAttention", q, k);
  CheckSameDType("GroupedQueryAttention", q, v);
  BRAID_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.shape() == k.shape() && k.size(0) == q.size(0) &&
              k.size(1) == q.size(1) && k.size(3) == q.size(3) && k.size(2) > 0 &&
              q.size(2) % k.size(2) == 0)
      << "GroupedQueryAttention wants q [B, T, n_head, head_dim] and k, v [B, T, n_kv_head, "
         "head_dim] with n_head a multiple of n_kv_head, got q "
      << q.DescribeForError() << ", k " << k.DescribeForError() << ", v " << v.DescribeForError();
  const int64_t b = q.size(0), t = q.size(1), h = q.size(2);
  Tensor out = EmptyLike(q);
  Tensor att = Tensor::Empty({b, h, t, t}, q.dtype(), q.device());
  kernels::gqa_forward.Get(q.device(), q.dtype())(q.Detach(), k.Detach(), v.Detach(), out, att);
  SavedTensor sq(q), sk(k), sv(v), sa(att);
  RecordFunction("GroupedQueryAttention", {q, k, v}, {&out},
                 [sq, sk, sv, sa](const std::vector<Tensor>& g) {
                   Tensor Q = sq.Get(), K = sk.Get(), V = sv.Get();
                   Tensor dq = EmptyLike(Q), dk = EmptyLike(K), dv = EmptyLike(V);
                   kernels::gqa_backward.Get(Q.device(), Q.dtype())(g[0].Reshape(Q.shape()), Q, K,
                                                                    V, sa.Get(), dq, dk, dv);
                   return std::vector<Tensor>{dq, dk, dv};
                 });
  return out;
}

Tensor Dropout(const Tensor& x, float p, uint64_t seed) {
  CheckFloat("Dropout", x);
  BRAID_CHECK(p >= 0.0f && p <= 1.0f) << "Dropout: p " << p << " is not in [0, 1]";
  if (p == 0.0f) return x;
  Tensor out = EmptyLike(x);
  kernels::dropout.Get(x.device(), x.dtype())(x.Detach(), p, seed, out);
  const Shape shape = x.shape();
  RecordFunction("Dropout", {x}, {&out}, [p, seed, shape](const std::vector<Tensor>& g) {
    // d out / d x is the same masked scaling: the same kernel, the same seed.
    Tensor dx = Tensor::Empty(shape, g[0].dtype(), g[0].device());
    kernels::dropout.Get(dx.device(), dx.dtype())(g[0], p, seed, dx);
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace braid::ops
