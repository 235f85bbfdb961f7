#include "core/ops.h"

#include <cmath>

#include "core/autograd.h"
#include "core/kernels.h"

namespace braid::ops {

using autograd::RecordFunction;
using autograd::SavedTensor;
using kernels::BinaryOp;
using kernels::UnaryOp;

namespace {

Tensor EmptyLike(const Tensor& t) { return Tensor::Empty(t.shape(), t.dtype(), t.device()); }

void CheckSameDevice(const char* op, const Tensor& a, const Tensor& b) {
  BRAID_CHECK(a.device() == b.device()) << op << ": tensors on different devices: "
                                        << a.DescribeForError() << " and " << b.DescribeForError();
}

void CheckF32(const char* op, const Tensor& a) {
  BRAID_CHECK(a.dtype() == DType::kF32) << op << " needs f32, got " << a.DescribeForError();
}

bool IsRowBroadcast(const Tensor& a, const Tensor& b) {
  if (b.ndim() == 0 || b.ndim() > a.ndim()) return false;
  for (int i = 1; i <= b.ndim(); ++i) {
    if (a.size(-i) != b.size(-i)) return false;
  }
  return true;
}

Tensor Binary(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  CheckSameDevice(name, a, b);
  CheckF32(name, a);
  CheckF32(name, b);
  bool same = a.shape() == b.shape();
  BRAID_CHECK(same || (op != BinaryOp::kMul && op != BinaryOp::kDiv && IsRowBroadcast(a, b)))
      << name << ": shapes do not match: " << a.DescribeForError() << " and "
      << b.DescribeForError() << " (b must have a's shape, or be a's trailing dimensions)";
  Tensor out = EmptyLike(a);
  kernels::binary.Get(a.device())(op, a, b, out);
  SavedTensor sa, sb;
  if (op == BinaryOp::kMul) {
    sa = SavedTensor(a);
    sb = SavedTensor(b);
  }
  Shape bshape = b.shape();
  RecordFunction(name, {a, b}, {&out}, [op, same, bshape, sa, sb](const std::vector<Tensor>& g) {
    const Tensor& go = g[0];
    Tensor ga, gb;
    if (op == BinaryOp::kMul) {
      ga = EmptyLike(go);
      gb = EmptyLike(go);
      kernels::binary.Get(go.device())(BinaryOp::kMul, go, sb.Get(), ga);
      kernels::binary.Get(go.device())(BinaryOp::kMul, go, sa.Get(), gb);
      return std::vector<Tensor>{ga, gb};
    }
    ga = go;
    if (same) {
      gb = go;
    } else {
      gb = Tensor::Empty(bshape, DType::kF32, go.device());
      kernels::sum_rows.Get(go.device())(go, gb, 0.0f);
    }
    if (op == BinaryOp::kSub) {
      Tensor neg = EmptyLike(gb);
      kernels::unary.Get(go.device())(UnaryOp::kScale, gb, -1.0f, neg);
      gb = neg;
    }
    return std::vector<Tensor>{ga, gb};
  });
  return out;
}

// Unary ops whose derivative the unary_backward kernel knows from the input.
Tensor Unary(const char* name, UnaryOp op, const Tensor& a) {
  CheckF32(name, a);
  Tensor out = EmptyLike(a);
  kernels::unary.Get(a.device())(op, a, 0.0f, out);
  SavedTensor sa(a);
  RecordFunction(name, {a}, {&out}, [op, sa](const std::vector<Tensor>& g) {
    Tensor x = sa.Get();
    Tensor gi = EmptyLike(x);
    kernels::unary_backward.Get(x.device())(op, x, g[0], gi);
    return std::vector<Tensor>{gi};
  });
  return out;
}

}  // namespace

Tensor Add(const Tensor& a, const Tensor& b) { return Binary("Add", BinaryOp::kAdd, a, b); }
Tensor Sub(const Tensor& a, const Tensor& b) { return Binary("Sub", BinaryOp::kSub, a, b); }
Tensor Mul(const Tensor& a, const Tensor& b) { return Binary("Mul", BinaryOp::kMul, a, b); }

Tensor Scale(const Tensor& a, float s) {
  CheckF32("Scale", a);
  Tensor out = EmptyLike(a);
  kernels::unary.Get(a.device())(UnaryOp::kScale, a, s, out);
  RecordFunction("Scale", {a}, {&out}, [s](const std::vector<Tensor>& g) {
    Tensor gi = EmptyLike(g[0]);
    kernels::unary.Get(gi.device())(UnaryOp::kScale, g[0], s, gi);
    return std::vector<Tensor>{gi};
  });
  return out;
}

Tensor Relu(const Tensor& a) { return Unary("Relu", UnaryOp::kRelu, a); }
Tensor GeluTanh(const Tensor& a) { return Unary("GeluTanh", UnaryOp::kGeluTanh, a); }
Tensor Tanh(const Tensor& a) { return Unary("Tanh", UnaryOp::kTanh, a); }
Tensor Exp(const Tensor& a) { return Unary("Exp", UnaryOp::kExp, a); }
Tensor Log(const Tensor& a) { return Unary("Log", UnaryOp::kLog, a); }

Tensor Sum(const Tensor& a) {
  CheckF32("Sum", a);
  Tensor out = Tensor::Empty({}, DType::kF32, a.device());
  kernels::sum_all.Get(a.device())(a, out);
  Shape shape = a.shape();
  RecordFunction("Sum", {a}, {&out}, [shape](const std::vector<Tensor>& g) {
    Tensor gi = Tensor::Empty(shape, DType::kF32, g[0].device());
    Tensor zero = Tensor::Zeros(shape, DType::kF32, g[0].device());
    // Broadcast the scalar gradient: zeros + g (as a 1-element row vector).
    kernels::binary.Get(gi.device())(BinaryOp::kAdd, zero, g[0].Reshape({1}), gi);
    return std::vector<Tensor>{gi};
  });
  return out;
}

Tensor Mean(const Tensor& a) {
  BRAID_CHECK(a.numel() > 0) << "Mean of empty " << a.DescribeForError();
  return Scale(Sum(a), 1.0f / float(a.numel()));
}

Tensor MatMul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  CheckSameDevice("MatMul", a, b);
  CheckF32("MatMul", a);
  CheckF32("MatMul", b);
  BRAID_CHECK((a.ndim() == 2 && b.ndim() == 2) ||
              (a.ndim() == 3 && b.ndim() == 3 && a.size(0) == b.size(0)))
      << "MatMul wants 2-D @ 2-D or batched 3-D @ 3-D, got " << a.DescribeForError() << " and "
      << b.DescribeForError();
  int64_t m = trans_a ? a.size(-1) : a.size(-2);
  int64_t ka = trans_a ? a.size(-2) : a.size(-1);
  int64_t kb = trans_b ? b.size(-1) : b.size(-2);
  int64_t n = trans_b ? b.size(-2) : b.size(-1);
  BRAID_CHECK(ka == kb) << "MatMul: inner dimensions differ (" << ka << " vs " << kb << ") for "
                        << a.DescribeForError() << (trans_a ? "ᵀ" : "") << " @ "
                        << b.DescribeForError() << (trans_b ? "ᵀ" : "");
  Shape os = a.ndim() == 3 ? Shape{a.size(0), m, n} : Shape{m, n};
  Tensor out = Tensor::Empty(os, DType::kF32, a.device());
  kernels::matmul.Get(a.device())(a, b, out, trans_a, trans_b, 1.0f, 0.0f);
  SavedTensor sa(a), sb(b);
  RecordFunction("MatMul", {a, b}, {&out},
                 [sa, sb, trans_a, trans_b](const std::vector<Tensor>& g) {
                   Tensor A = sa.Get(), B = sb.Get();
                   const Tensor& G = g[0];
                   auto mm = kernels::matmul.Get(G.device());
                   Tensor ga = EmptyLike(A), gb = EmptyLike(B);
                   // C = op(A) op(B); dop(A) = G op(B)ᵀ; dop(B) = op(A)ᵀ G.
                   if (!trans_a) mm(G, B, ga, false, !trans_b, 1.0f, 0.0f);
                   else mm(B, G, ga, trans_b, true, 1.0f, 0.0f);
                   if (!trans_b) mm(A, G, gb, !trans_a, false, 1.0f, 0.0f);
                   else mm(G, A, gb, true, trans_a, 1.0f, 0.0f);
                   return std::vector<Tensor>{ga, gb};
                 });
  return out;
}

Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  CheckSameDevice("Linear", x, weight);
  CheckF32("Linear", x);
  BRAID_CHECK(weight.ndim() == 2 && x.ndim() >= 1 && x.size(-1) == weight.size(1))
      << "Linear: input " << x.DescribeForError() << " does not fit weight "
      << weight.DescribeForError() << " (weight is [out, in]; input's last dimension must be in)";
  int64_t out_f = weight.size(0), in_f = weight.size(1);
  if (bias.defined()) {
    BRAID_CHECK(bias.ndim() == 1 && bias.size(0) == out_f)
        << "Linear: bias " << bias.DescribeForError() << " does not fit weight "
        << weight.DescribeForError();
  }
  int64_t rows = x.numel() / in_f;
  Shape os = x.shape();
  os.back() = out_f;
  Tensor out = Tensor::Empty(os, DType::kF32, x.device());
  Tensor x2 = x.Detach().Reshape({rows, in_f});
  Tensor o2 = out.Detach().Reshape({rows, out_f});
  kernels::matmul.Get(x.device())(x2, weight, o2, false, true, 1.0f, 0.0f);
  if (bias.defined()) kernels::binary.Get(x.device())(BinaryOp::kAdd, o2, bias, o2);
  SavedTensor sx(x), sw(weight);
  bool has_bias = bias.defined();
  std::vector<Tensor> inputs = {x, weight};
  if (has_bias) inputs.push_back(bias);
  RecordFunction("Linear", inputs, {&out},
                 [sx, sw, has_bias, rows, in_f, out_f](const std::vector<Tensor>& g) {
                   Tensor X = sx.Get(), W = sw.Get();
                   Tensor G = g[0].Reshape({rows, out_f});
                   auto mm = kernels::matmul.Get(G.device());
                   Tensor gx = EmptyLike(X);
                   Tensor gx2 = gx.Reshape({rows, in_f});
                   mm(G, W, gx2, false, false, 1.0f, 0.0f);       // dX = dY W
                   Tensor gw = EmptyLike(W);
                   mm(G, X.Reshape({rows, in_f}), gw, true, false, 1.0f, 0.0f);  // dW = dYᵀ X
                   std::vector<Tensor> r = {gx, gw};
                   if (has_bias) {
                     Tensor gb = Tensor::Empty({out_f}, DType::kF32, G.device());
                     kernels::sum_rows.Get(G.device())(G, gb, 0.0f);
                     r.push_back(gb);
                   }
                   return r;
                 });
  return out;
}

Tensor LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  CheckF32("LayerNorm", x);
  int64_t c = x.size(-1);
  BRAID_CHECK(weight.ndim() == 1 && weight.size(0) == c && bias.defined() && bias.shape() == weight.shape())
      << "LayerNorm: weight " << weight.DescribeForError() << " and bias "
      << bias.DescribeForError() << " must both be [" << c << "] for input " << x.DescribeForError();
  int64_t n = x.numel() / c;
  Tensor out = EmptyLike(x);
  Tensor mean = Tensor::Empty({n}, DType::kF32, x.device());
  Tensor rstd = Tensor::Empty({n}, DType::kF32, x.device());
  Tensor x2 = x.Detach().Reshape({n, c}), o2 = out.Detach().Reshape({n, c});
  kernels::layernorm_forward.Get(x.device())(x2, weight, bias, eps, o2, mean, rstd);
  SavedTensor sx(x), sw(weight), sm(mean), sr(rstd);
  RecordFunction("LayerNorm", {x, weight, bias}, {&out},
                 [sx, sw, sm, sr, n, c](const std::vector<Tensor>& g) {
                   Tensor X = sx.Get(), W = sw.Get();
                   Tensor dx = EmptyLike(X);
                   Tensor dw = Tensor::Zeros({c}, DType::kF32, X.device());
                   Tensor db = Tensor::Zeros({c}, DType::kF32, X.device());
                   Tensor dx2 = dx.Reshape({n, c});
                   kernels::layernorm_backward.Get(X.device())(g[0].Reshape({n, c}),
                                                               X.Reshape({n, c}), W, sm.Get(),
                                                               sr.Get(), dx2, dw, db);
                   return std::vector<Tensor>{dx, dw, db};
                 });
  return out;
}

Tensor Softmax(const Tensor& x) {
  CheckF32("Softmax", x);
  int64_t c = x.size(-1), n = x.numel() / c;
  Tensor out = EmptyLike(x);
  Tensor o2 = out.Detach().Reshape({n, c});
  kernels::softmax_forward.Get(x.device())(x.Detach().Reshape({n, c}), o2);
  SavedTensor sy(out);
  RecordFunction("Softmax", {x}, {&out}, [sy, n, c](const std::vector<Tensor>& g) {
    Tensor y = sy.Get();
    Tensor dx = EmptyLike(y);
    Tensor dx2 = dx.Reshape({n, c});
    kernels::softmax_backward.Get(y.device())(y.Reshape({n, c}), g[0].Reshape({n, c}), dx2);
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor Embedding(const Tensor& weight, const Tensor& ids) {
  CheckF32("Embedding", weight);
  BRAID_CHECK(weight.ndim() == 2 && ids.dtype() == DType::kI32)
      << "Embedding wants weight [V, C] and i32 ids, got " << weight.DescribeForError() << " and "
      << ids.DescribeForError();
  CheckSameDevice("Embedding", weight, ids);
  int64_t c = weight.size(1), n = ids.numel();
  Shape os = ids.shape();
  os.push_back(c);
  Tensor out = Tensor::Empty(os, DType::kF32, weight.device());
  Tensor o2 = out.Detach().Reshape({n, c});
  Tensor flat_ids = ids.Detach().Reshape({n});
  kernels::embedding_forward.Get(weight.device())(weight, flat_ids, o2);
  Shape wshape = weight.shape();
  RecordFunction("Embedding", {weight}, {&out},
                 [flat_ids, wshape, n, c](const std::vector<Tensor>& g) {
                   Tensor dw = Tensor::Zeros(wshape, DType::kF32, g[0].device());
                   kernels::embedding_backward.Get(dw.device())(g[0].Reshape({n, c}), flat_ids, dw);
                   return std::vector<Tensor>{dw};
                 });
  return out;
}

Tensor CrossEntropy(const Tensor& logits, const Tensor& targets) {
  CheckF32("CrossEntropy", logits);
  int64_t v = logits.size(-1), n = logits.numel() / v;
  BRAID_CHECK(targets.dtype() == DType::kI32 && targets.numel() == n)
      << "CrossEntropy: targets " << targets.DescribeForError() << " must be i32 with one entry "
      << "per row of logits " << logits.DescribeForError();
  CheckSameDevice("CrossEntropy", logits, targets);
  Tensor losses = Tensor::Empty({n}, DType::kF32, logits.device());
  Tensor probs = Tensor::Empty({n, v}, DType::kF32, logits.device());
  Tensor t = targets.Detach().Reshape({n});
  kernels::cross_entropy_forward.Get(logits.device())(logits.Detach().Reshape({n, v}), t, losses, probs);
  // Mean over the positions that count (target >= 0).
  int64_t counted = 0;
  {
    std::vector<int32_t> tv = t.ToVector<int32_t>();
    for (int32_t x : tv) counted += x >= 0;
  }
  float inv = counted > 0 ? 1.0f / float(counted) : 0.0f;
  Tensor out = Tensor::Empty({}, DType::kF32, logits.device());
  kernels::sum_all.Get(logits.device())(losses, out);
  kernels::unary.Get(logits.device())(UnaryOp::kScale, out, inv, out);
  Shape lshape = logits.shape();
  SavedTensor sp(probs);
  RecordFunction("CrossEntropy", {logits}, {&out},
                 [sp, t, inv, n, v, lshape](const std::vector<Tensor>& g) {
                   Tensor P = sp.Get();
                   // Every row's loss gets d(mean)/d(loss_n) = g / counted.
                   Tensor dloss = Tensor::Empty({n}, DType::kF32, P.device());
                   float gs = g[0].item() * inv;
                   dloss.Fill(gs);
                   Tensor dl = Tensor::Empty(lshape, DType::kF32, P.device());
                   Tensor dl2 = dl.Reshape({n, v});
                   kernels::cross_entropy_backward.Get(P.device())(P, t, dloss, dl2);
                   return std::vector<Tensor>{dl};
                 });
  return out;
}

Tensor CausalSelfAttention(const Tensor& qkv, int n_head) {
  CheckF32("CausalSelfAttention", qkv);
  BRAID_CHECK(qkv.ndim() == 3 && qkv.size(2) % 3 == 0 && (qkv.size(2) / 3) % n_head == 0)
      << "CausalSelfAttention wants qkv [B, T, 3C] with C divisible by n_head=" << n_head
      << ", got " << qkv.DescribeForError();
  int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  Tensor out = Tensor::Empty({b, t, c}, DType::kF32, qkv.device());
  Tensor att = Tensor::Empty({b, n_head, t, t}, DType::kF32, qkv.device());
  kernels::attention_forward.Get(qkv.device())(qkv.Detach(), n_head, out, att);
  SavedTensor sq(qkv), sa(att);
  RecordFunction("CausalSelfAttention", {qkv}, {&out},
                 [sq, sa, n_head](const std::vector<Tensor>& g) {
                   Tensor Q = sq.Get();
                   Tensor dq = EmptyLike(Q);
                   kernels::attention_backward.Get(Q.device())(g[0], Q, sa.Get(), n_head, dq);
                   return std::vector<Tensor>{dq};
                 });
  return out;
}

}  // namespace braid::ops
