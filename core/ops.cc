#include "core/ops.h"

#include <cmath>

#include "core/autograd.h"
#include "core/kernels.h"
#include "core/ops_internal.h"

namespace braid::ops {

using autograd::RecordFunction;
using autograd::SavedTensor;
using kernels::BinaryOp;
using kernels::UnaryOp;
using internal::CheckFloat;
using internal::CheckSameDType;
using internal::CheckSameDevice;
using internal::EmptyLike;

namespace {

bool IsRowBroadcast(const Tensor& a, const Tensor& b) {
  if (b.ndim() == 0 || b.ndim() > a.ndim()) return false;
  for (int i = 1; i <= b.ndim(); ++i) {
    if (a.size(-i) != b.size(-i)) return false;
  }
  return true;
}

Tensor Binary(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  CheckSameDevice(name, a, b);
  CheckFloat(name, a);
  CheckSameDType(name, a, b);
  bool same = a.shape() == b.shape();
  BRAID_CHECK(same || (op != BinaryOp::kMul && op != BinaryOp::kDiv && IsRowBroadcast(a, b)))
      << name << ": shapes do not match: " << a.DescribeForError() << " and "
      << b.DescribeForError() << " (b must have a's shape, or be a's trailing dimensions)";
  Tensor out = EmptyLike(a);
  kernels::binary.Get(a.device(), a.dtype())(op, a, b, out);
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
      auto mul = kernels::binary.Get(go.device(), go.dtype());
      mul(BinaryOp::kMul, go, sb.Get(), ga);
      mul(BinaryOp::kMul, go, sa.Get(), gb);
      return std::vector<Tensor>{ga, gb};
    }
    ga = go;
    if (same) {
      gb = go;
    } else {
      gb = Tensor::Empty(bshape, go.dtype(), go.device());
      kernels::sum_rows.Get(go.device(), go.dtype())(go, gb, 0.0f);
    }
    if (op == BinaryOp::kSub) {
      Tensor neg = EmptyLike(gb);
      kernels::unary.Get(go.device(), gb.dtype())(UnaryOp::kScale, gb, -1.0f, neg);
      gb = neg;
    }
    return std::vector<Tensor>{ga, gb};
  });
  return out;
}

// Unary ops whose derivative the unary_backward kernel knows from the input.
Tensor Unary(const char* name, UnaryOp op, const Tensor& a) {
  CheckFloat(name, a);
  Tensor out = EmptyLike(a);
  kernels::unary.Get(a.device(), a.dtype())(op, a, 0.0f, out);
  SavedTensor sa(a);
  RecordFunction(name, {a}, {&out}, [op, sa](const std::vector<Tensor>& g) {
    Tensor x = sa.Get();
    Tensor gi = EmptyLike(x);
    kernels::unary_backward.Get(x.device(), x.dtype())(op, x, g[0], gi);
    return std::vector<Tensor>{gi};
  });
  return out;
}

}  // namespace

Tensor Add(const Tensor& a, const Tensor& b) { return Binary("Add", BinaryOp::kAdd, a, b); }
Tensor Sub(const Tensor& a, const Tensor& b) { return Binary("Sub", BinaryOp::kSub, a, b); }
Tensor Mul(const Tensor& a, const Tensor& b) { return Binary("Mul", BinaryOp::kMul, a, b); }

Tensor Scale(const Tensor& a, float s) {
  CheckFloat("Scale", a);
  Tensor out = EmptyLike(a);
  kernels::unary.Get(a.device(), a.dtype())(UnaryOp::kScale, a, s, out);
  RecordFunction("Scale", {a}, {&out}, [s](const std::vector<Tensor>& g) {
    Tensor gi = EmptyLike(g[0]);
    kernels::unary.Get(gi.device(), gi.dtype())(UnaryOp::kScale, g[0], s, gi);
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
  CheckFloat("Sum", a);
  // The sum keeps a's dtype (accumulated in f32 by the kernel, rounded once).
  Tensor out = Tensor::Empty({}, a.dtype(), a.device());
  kernels::sum_all.Get(a.device(), a.dtype())(a, out);
  Shape shape = a.shape();
  RecordFunction("Sum", {a}, {&out}, [shape](const std::vector<Tensor>& g) {
    const DType dt = g[0].dtype();
    Tensor gi = Tensor::Empty(shape, dt, g[0].device());
    Tensor zero = Tensor::Zeros(shape, dt, g[0].device());
    // Broadcast the scalar gradient: zeros + g (as a 1-element row vector).
    kernels::binary.Get(gi.device(), dt)(BinaryOp::kAdd, zero, g[0].Reshape({1}), gi);
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
  CheckFloat("MatMul", a);
  CheckSameDType("MatMul", a, b);
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
  Tensor out = Tensor::Empty(os, a.dtype(), a.device());
  kernels::matmul.Get(a.device(), a.dtype())(a, b, out, trans_a, trans_b, 1.0f, 0.0f);
  SavedTensor sa(a), sb(b);
  RecordFunction("MatMul", {a, b}, {&out},
                 [sa, sb, trans_a, trans_b](const std::vector<Tensor>& g) {
                   Tensor A = sa.Get(), B = sb.Get();
                   const Tensor& G = g[0];
                   auto mm = kernels::matmul.Get(G.device(), G.dtype());
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

namespace {

void CheckLinear(const char* name, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  CheckSameDevice(name, x, weight);
  CheckFloat(name, x);
  CheckSameDType(name, x, weight);
  BRAID_CHECK(weight.ndim() == 2 && x.ndim() >= 1 && x.size(-1) == weight.size(1))
      << name << ": input " << x.DescribeForError() << " does not fit weight "
      << weight.DescribeForError() << " (weight is [out, in]; input's last dimension must be in)";
  if (bias.defined()) {
    BRAID_CHECK(bias.ndim() == 1 && bias.size(0) == weight.size(0))
        << name << ": bias " << bias.DescribeForError() << " does not fit weight "
        << weight.DescribeForError();
    CheckSameDType(name, x, bias);
  }
}

// Records the backward of out = act(x weightᵀ + bias): act is the identity (Linear) or, when
// `pre` is defined, tanh-GELU of pre (LinearGeluTanh), whose gradient is taken first.
void RecordLinearBackward(const char* name, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, const Tensor& pre, Tensor* out) {
  const int64_t out_f = weight.size(0), in_f = weight.size(1);
  const int64_t rows = x.numel() / in_f;
  SavedTensor sx(x), sw(weight), sp;
  const bool gelu = pre.defined();
  if (gelu) sp = SavedTensor(pre);
  bool has_bias = bias.defined();
  std::vector<Tensor> inputs = {x, weight};
  if (has_bias) inputs.push_back(bias);
  // Where the weight's and bias' gradients go when they are put off (WeightGradQueue): only
  // into leaves, whose accumulators need nothing else of the graph.
  std::shared_ptr<autograd::Node> w_acc, b_acc;
  if (autograd::GradEnabled()) {
    autograd::Edge we = autograd::GradientEdge(weight);
    autograd::Edge be = has_bias ? autograd::GradientEdge(bias) : autograd::Edge{};
    const bool leaves = dynamic_cast<autograd::AccumulateGrad*>(we.node.get()) != nullptr &&
                        (be.node == nullptr || dynamic_cast<autograd::AccumulateGrad*>(be.node.get()));
    if (leaves) w_acc = we.node, b_acc = be.node;
  }
  RecordFunction(
      name, inputs, {out},
      [sx, sw, sp, gelu, has_bias, rows, in_f, out_f, w_acc, b_acc](const std::vector<Tensor>& g) {
        Tensor X = sx.Get(), W = sw.Get();
        Tensor dy = g[0];
        Tensor fused_gb;  // the bias gradient, where the GELU backward's slot summed it already
        if (gelu) {  // through the GELU first: d pre = dy * gelu'(pre)
          Tensor P = sp.Get();
          Tensor dpre = EmptyLike(P);
          auto* fused = has_bias ? kernels::linear_gelu_backward.Find(P.device().type, P.dtype())
                                 : nullptr;
          if (fused != nullptr) {  // one pass over dy: dpre and its column sums (CUDA)
            fused_gb = Tensor::Empty({out_f}, P.dtype(), P.device());
            Tensor p2 = P.Reshape({rows, out_f}), d2 = dpre.Reshape({rows, out_f});
            fused(p2, dy.Reshape({rows, out_f}), d2, fused_gb);
          } else {
            kernels::unary_backward.Get(P.device(), P.dtype())(UnaryOp::kGeluTanh, P, dy, dpre);
          }
          dy = dpre;
        }
        Tensor G = dy.Reshape({rows, out_f});
        auto mm = kernels::matmul.Get(G.device(), G.dtype());
        Tensor gx = EmptyLike(X);
        Tensor gx2 = gx.Reshape({rows, in_f});
        mm(G, W, gx2, false, false, 1.0f, 0.0f);  // dX = dY W
        auto weight_grads = [=] {
          Tensor gw = EmptyLike(W);
          mm(G, X.Reshape({rows, in_f}), gw, true, false, 1.0f, 0.0f);  // dW = dYᵀ X
          Tensor gb = fused_gb;
          if (has_bias && !gb.defined()) {
            gb = Tensor::Empty({out_f}, G.dtype(), G.device());
            kernels::sum_rows.Get(G.device(), G.dtype())(G, gb, 0.0f);
          }
          return std::make_pair(gw, gb);
        };
        if (autograd::WeightGradQueue* q = autograd::WeightGradQueue::Active(); q != nullptr && w_acc != nullptr) {
          q->Push([weight_grads, w_acc, b_acc] {
            auto [gw, gb] = weight_grads();
            w_acc->Apply({gw});
            if (b_acc != nullptr) b_acc->Apply({gb});
          });
          std::vector<Tensor> r = {gx, Tensor()};
          if (has_bias) r.push_back(Tensor());
          return r;
        }
        auto [gw, gb] = weight_grads();
        std::vector<Tensor> r = {gx, gw};
        if (has_bias) r.push_back(gb);
        return r;
      });
}

}  // namespace

Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  CheckLinear("Linear", x, weight, bias);
  int64_t out_f = weight.size(0), in_f = weight.size(1);
  int64_t rows = x.numel() / in_f;
  Shape os = x.shape();
  os.back() = out_f;
  Tensor out = Tensor::Empty(os, x.dtype(), x.device());
  Tensor x2 = x.Detach().Reshape({rows, in_f});
  Tensor o2 = out.Detach().Reshape({rows, out_f});
  if (auto* fused = bias.defined() ? kernels::linear_forward.Find(x.device().type, x.dtype())
                                   : nullptr) {
    fused(x2, weight, bias, o2);  // the bias added in the GEMM's epilogue
  } else {
    kernels::matmul.Get(x.device(), x.dtype())(x2, weight, o2, false, true, 1.0f, 0.0f);
    if (bias.defined()) kernels::binary.Get(x.device(), x.dtype())(BinaryOp::kAdd, o2, bias, o2);
  }
  RecordLinearBackward("Linear", x, weight, bias, Tensor(), &out);
  return out;
}

Tensor LinearGeluTanh(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  CheckLinear("LinearGeluTanh", x, weight, bias);
  auto* fused =
      bias.defined() ? kernels::linear_gelu_forward.Find(x.device().type, x.dtype()) : nullptr;
  // Unfused: the very ops a model wrote before this one existed, so results are unchanged.
  if (fused == nullptr) return GeluTanh(Linear(x, weight, bias));
  int64_t out_f = weight.size(0), in_f = weight.size(1);
  int64_t rows = x.numel() / in_f;
  Shape os = x.shape();
  os.back() = out_f;
  Tensor pre = Tensor::Empty(os, x.dtype(), x.device());
  Tensor out = Tensor::Empty(os, x.dtype(), x.device());
  Tensor p2 = pre.Reshape({rows, out_f}), o2 = out.Detach().Reshape({rows, out_f});
  // One GEMM whose epilogue adds the bias, writes pre and applies GELU (CUDA: GELU_AUX_BIAS).
  fused(x.Detach().Reshape({rows, in_f}), weight, bias, p2, o2);
  RecordLinearBackward("LinearGeluTanh", x, weight, bias, pre, &out);
  return out;
}

Tensor LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  CheckFloat("LayerNorm", x);
  int64_t c = x.size(-1);
  BRAID_CHECK(weight.ndim() == 1 && weight.size(0) == c && bias.defined() && bias.shape() == weight.shape())
      << "LayerNorm: weight " << weight.DescribeForError() << " and bias "
      << bias.DescribeForError() << " must both be [" << c << "] for input " << x.DescribeForError();
  CheckSameDType("LayerNorm", x, weight);
  CheckSameDType("LayerNorm", x, bias);
  int64_t n = x.numel() / c;
  Tensor out = EmptyLike(x);
  // mean and rstd stay f32 whatever x's dtype: they are per row (small) and rstd rounded to
  // half would scale every element of the row's gradient by the same rounding error.
  Tensor mean = Tensor::Empty({n}, DType::kF32, x.device());
  Tensor rstd = Tensor::Empty({n}, DType::kF32, x.device());
  Tensor x2 = x.Detach().Reshape({n, c}), o2 = out.Detach().Reshape({n, c});
  kernels::layernorm_forward.Get(x.device(), x.dtype())(x2, weight, bias, eps, o2, mean, rstd);
  SavedTensor sx(x), sw(weight), sm(mean), sr(rstd);
  RecordFunction("LayerNorm", {x, weight, bias}, {&out},
                 [sx, sw, sm, sr, n, c](const std::vector<Tensor>& g) {
                   Tensor X = sx.Get(), W = sw.Get();
                   Tensor dx = EmptyLike(X);
                   Tensor dw = Tensor::Zeros({c}, W.dtype(), X.device());
                   Tensor db = Tensor::Zeros({c}, W.dtype(), X.device());
                   Tensor dx2 = dx.Reshape({n, c});
                   kernels::layernorm_backward.Get(X.device(), X.dtype())(g[0].Reshape({n, c}),
                                                               X.Reshape({n, c}), W, sm.Get(),
                                                               sr.Get(), dx2, dw, db);
                   return std::vector<Tensor>{dx, dw, db};
                 });
  return out;
}

Tensor Softmax(const Tensor& x) {
  CheckFloat("Softmax", x);
  int64_t c = x.size(-1), n = x.numel() / c;
  Tensor out = EmptyLike(x);
  Tensor o2 = out.Detach().Reshape({n, c});
  kernels::softmax_forward.Get(x.device(), x.dtype())(x.Detach().Reshape({n, c}), o2);
  SavedTensor sy(out);
  RecordFunction("Softmax", {x}, {&out}, [sy, n, c](const std::vector<Tensor>& g) {
    Tensor y = sy.Get();
    Tensor dx = EmptyLike(y);
    Tensor dx2 = dx.Reshape({n, c});
    kernels::softmax_backward.Get(y.device(), y.dtype())(y.Reshape({n, c}), g[0].Reshape({n, c}), dx2);
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor Embedding(const Tensor& weight, const Tensor& ids) {
  CheckFloat("Embedding", weight);
  BRAID_CHECK(weight.ndim() == 2 && ids.dtype() == DType::kI32)
      << "Embedding wants weight [V, C] and i32 ids, got " << weight.DescribeForError() << " and "
      << ids.DescribeForError();
  CheckSameDevice("Embedding", weight, ids);
  int64_t c = weight.size(1), n = ids.numel();
  Shape os = ids.shape();
  os.push_back(c);
  const DType dt = weight.dtype();
  Tensor out = Tensor::Empty(os, dt, weight.device());
  Tensor o2 = out.Detach().Reshape({n, c});
  Tensor flat_ids = ids.Detach().Reshape({n});
  kernels::embedding_forward.Get(weight.device(), dt)(weight, flat_ids, o2);
  Shape wshape = weight.shape();
  RecordFunction("Embedding", {weight}, {&out},
                 [flat_ids, wshape, n, c, dt](const std::vector<Tensor>& g) {
                   Tensor dw = Tensor::Zeros(wshape, dt, g[0].device());
                   kernels::embedding_backward.Get(dw.device(), dt)(g[0].Reshape({n, c}), flat_ids, dw);
                   return std::vector<Tensor>{dw};
                 });
  return out;
}

Tensor CrossEntropy(const Tensor& logits, const Tensor& targets) {
  CheckFloat("CrossEntropy", logits);
  const DType dt = logits.dtype();
  int64_t v = logits.size(-1), n = logits.numel() / v;
  BRAID_CHECK(targets.dtype() == DType::kI32 && targets.numel() == n)
      << "CrossEntropy: targets " << targets.DescribeForError() << " must be i32 with one entry "
      << "per row of logits " << logits.DescribeForError();
  CheckSameDevice("CrossEntropy", logits, targets);
  // The loss and the saved probabilities are f32 for any logits dtype: the loss is what training
  // reports and loss scaling multiplies, and probs - onehot cancels (see kernels.h).
  Tensor losses = Tensor::Empty({n}, DType::kF32, logits.device());
  Tensor probs = Tensor::Empty({n, v}, DType::kF32, logits.device());
  Tensor t = targets.Detach().Reshape({n});
  kernels::cross_entropy_forward.Get(logits.device(), dt)(logits.Detach().Reshape({n, v}), t, losses, probs);
  // Mean over the positions that count (target >= 0). 1 / count stays where the targets are
  // (on a GPU the host never reads them), and so does every factor below.
  Tensor inv = Tensor::Empty({}, DType::kF32, logits.device());
  kernels::inverse_count_nonnegative.Get(logits.device())(t, inv);
  Tensor out = Tensor::Empty({}, DType::kF32, logits.device());
  kernels::sum_all.Get(logits.device())(losses, out);
  kernels::binary.Get(logits.device())(BinaryOp::kMul, out, inv, out);
  Shape lshape = logits.shape();
  SavedTensor sp(probs);
  RecordFunction("CrossEntropy", {logits}, {&out},
                 [sp, t, inv, n, v, lshape, dt](const std::vector<Tensor>& g) {
                   Tensor P = sp.Get();
                   // Every row's loss gets d(mean)/d(loss_n) = g / counted, on the device.
                   Tensor gs = Tensor::Empty({}, DType::kF32, P.device());
                   kernels::binary.Get(P.device())(BinaryOp::kMul, g[0], inv, gs);
                   Tensor dloss = Tensor::Zeros({n}, DType::kF32, P.device());
                   kernels::binary.Get(P.device())(BinaryOp::kAdd, dloss, gs, dloss);
                   Tensor dl = Tensor::Empty(lshape, dt, P.device());
                   Tensor dl2 = dl.Reshape({n, v});
                   kernels::cross_entropy_backward.Get(P.device(), dt)(P, t, dloss, dl2);
                   return std::vector<Tensor>{dl};
                 });
  return out;
}

Tensor CausalSelfAttention(const Tensor& qkv, int n_head) {
  CheckFloat("CausalSelfAttention", qkv);
  BRAID_CHECK(qkv.ndim() == 3 && qkv.size(2) % 3 == 0 && (qkv.size(2) / 3) % n_head == 0)
      << "CausalSelfAttention wants qkv [B, T, 3C] with C divisible by n_head=" << n_head
      << ", got " << qkv.DescribeForError();
  int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  // The saved probabilities take qkv's dtype: half the memory of f32 for half inputs (see
  // kernels.h for why their rounding is harmless).
  Tensor out = Tensor::Empty({b, t, c}, qkv.dtype(), qkv.device());
  if (auto* fused = kernels::flash_attention_forward.Find(qkv.device().type, qkv.dtype())) {
    // The fused kernel keeps one f32 statistic per row instead of the T x T probabilities, and
    // its backward recomputes them from q, k and the output.
    Tensor lse = Tensor::Empty({b, n_head, t}, DType::kF32, qkv.device());
    fused(qkv.Detach(), n_head, out, lse);
    SavedTensor sq(qkv), so(out), sl(lse);
    RecordFunction("CausalSelfAttention", {qkv}, {&out},
                   [sq, so, sl, n_head](const std::vector<Tensor>& g) {
                     Tensor Q = sq.Get();
                     Tensor dq = EmptyLike(Q);
                     kernels::flash_attention_backward.Get(Q.device(), Q.dtype())(
                         g[0], Q, so.Get(), sl.Get(), n_head, dq);
                     return std::vector<Tensor>{dq};
                   });
    return out;
  }
  Tensor att = Tensor::Empty({b, n_head, t, t}, qkv.dtype(), qkv.device());
  kernels::attention_forward.Get(qkv.device(), qkv.dtype())(qkv.Detach(), n_head, out, att);
  SavedTensor sq(qkv), sa(att);
  RecordFunction("CausalSelfAttention", {qkv}, {&out},
                 [sq, sa, n_head](const std::vector<Tensor>& g) {
                   Tensor Q = sq.Get();
                   Tensor dq = EmptyLike(Q);
                   kernels::attention_backward.Get(Q.device(), Q.dtype())(g[0], Q, sa.Get(), n_head, dq);
                   return std::vector<Tensor>{dq};
                 });
  return out;
}

Tensor Cast(const Tensor& a, DType t) {
  BRAID_CHECK(IsFloating(a.dtype()) && IsFloating(t))
      << "Cast converts between f32, bf16 and f16, got " << a.DescribeForError() << " to "
      << DTypeName(t);
  if (a.dtype() == t) return a;
  Tensor out = Tensor::Empty(a.shape(), t, a.device());
  kernels::copy.Get(a.device())(a.Detach(), out);
  const DType from = a.dtype();
  RecordFunction("Cast", {a}, {&out}, [from](const std::vector<Tensor>& g) {
    Tensor gi = Tensor::Empty(g[0].shape(), from, g[0].device());
    kernels::copy.Get(gi.device())(g[0], gi);
    return std::vector<Tensor>{gi};
  });
  return out;
}

Tensor ScaleGrad(const Tensor& a, float s) {
  CheckFloat("ScaleGrad", a);
  // A copy rather than a view: the output needs its own autograd node, and a view of a would
  // share a's history.
  Tensor out = EmptyLike(a);
  kernels::copy.Get(a.device())(a.Detach(), out);
  RecordFunction("ScaleGrad", {a}, {&out}, [s](const std::vector<Tensor>& g) {
    Tensor gi = EmptyLike(g[0]);
    kernels::unary.Get(gi.device(), gi.dtype())(UnaryOp::kScale, g[0], s, gi);
    return std::vector<Tensor>{gi};
  });
  return out;
}

}  // namespace braid::ops
