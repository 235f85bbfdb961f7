#include "core/testing/reference_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/kernel_checks.h"

namespace braid::reference {

namespace {

void CheckCpu(const char* kernel, const Tensor& t) {
  BRAID_CHECK(t.device().type == DeviceType::kCPU)
      << "reference kernel '" << kernel << "' runs on the host only, got " << t.DescribeForError();
}

namespace checks = kernels::checks;

// One row's softmax in double, written to `out` in f32 (softmax_forward and the probabilities
// cross_entropy_forward keeps); returns the row's max and the sum of exp(x - max), from which
// the loss takes its log-sum-exp.
std::pair<double, double> SoftmaxRow(const float* row, int64_t c, float* out) {
  double mx = row[0];
  for (int64_t i = 1; i < c; ++i) mx = std::max(mx, double(row[i]));
  double s = 0;
  for (int64_t i = 0; i < c; ++i) s += std::exp(row[i] - mx);
  for (int64_t i = 0; i < c; ++i) out[i] = float(std::exp(row[i] - mx) / s);
  return {mx, s};
}

constexpr const char* kRef = "reference";
constexpr DType kF32 = DType::kF32;  // the reference kernels are the f32 ones

double Load(const Tensor& t, int64_t i) {
  const void* p = t.raw_data();
  switch (t.dtype()) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return BF16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI64: return double(static_cast<const int64_t*>(p)[i]);
    case DType::kU8: return static_cast<const uint8_t*>(p)[i];
    case DType::kI8: return static_cast<const int8_t*>(p)[i];
  }
  return 0;
}

void Store(Tensor& t, int64_t i, double v) {
  void* p = t.raw_data();
  switch (t.dtype()) {
    case DType::kF32: static_cast<float*>(p)[i] = float(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = FloatToBF16(float(v)); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = FloatToF16(float(v)); break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = uint8_t(v); break;
    case DType::kI8: static_cast<int8_t*>(p)[i] = int8_t(v); break;
  }
}

// GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

double Gelu(double x) { return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + kGeluA * x * x * x))); }

double GeluGrad(double x) {
  double u = kGeluC * (x + kGeluA * x * x * x);
  double t = std::tanh(u);
  double du = kGeluC * (1.0 + 3.0 * kGeluA * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

}  // namespace

// ---- Memory -------------------------------------------------------------------------------

void copy(const Tensor& src, Tensor& dst) {
  CheckCpu("copy", src);
  CheckCpu("copy", dst);
  checks::Copy(kRef, src, dst);
  if (src.dtype() == dst.dtype()) {
    if (src.raw_data() != dst.raw_data()) {
      std::memmove(dst.raw_data(), src.raw_data(), src.nbytes());
    }
    return;
  }
  // The slot promises only f32/bf16/f16 conversions; integer ones are accepted too (as core's
  // own host fallback does) so registering the reference never takes a conversion away.
  // Floats go through float, not double: a double->bf16 path would round twice.
  const bool floats = IsFloating(src.dtype()) && IsFloating(dst.dtype());
  for (int64_t i = 0, n = src.numel(); i < n; ++i) {
    double x = Load(src, i);
    Store(dst, i, floats ? double(float(x)) : x);
  }
}

void fill(Tensor& dst, float value) {
  CheckCpu("fill", dst);
  for (int64_t i = 0, n = dst.numel(); i < n; ++i) Store(dst, i, value);
}

// ---- Elementwise --------------------------------------------------------------------------

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  CheckCpu("binary", a);
  checks::Binary(kRef, kF32, a, b, out);
  const int64_t n = a.numel(), nb = b.numel();
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    double x = pa[i], y = pb[i % nb], r = 0;
    switch (op) {
      case BinaryOp::kAdd: r = x + y; break;
      case BinaryOp::kSub: r = x - y; break;
      case BinaryOp::kMul: r = x * y; break;
      case BinaryOp::kDiv: r = x / y; break;
    }
    po[i] = float(r);
  }
}

void unary(UnaryOp op, const Tensor& a, float scalar, Tensor& out) {
  CheckCpu("unary", a);
  checks::Unary(kRef, kF32, a, out);
  const float* pa = a.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0, n = a.numel(); i < n; ++i) {
    double x = pa[i], r = 0;
    switch (op) {
      case UnaryOp::kScale: r = x * double(scalar); break;
      case UnaryOp::kAddScalar: r = x + double(scalar); break;
      case UnaryOp::kRelu: r = x > 0 ? x : 0.0; break;
      case UnaryOp::kGeluTanh: r = Gelu(x); break;
      case UnaryOp::kExp: r = std::exp(x); break;
      case UnaryOp::kLog: r = std::log(x); break;
      case UnaryOp::kNeg: r = -x; break;
      case UnaryOp::kSquare: r = x * x; break;
      case UnaryOp::kSqrt: r = std::sqrt(x); break;
      case UnaryOp::kTanh: r = std::tanh(x); break;
    }
    po[i] = float(r);
  }
}

void unary_backward(UnaryOp op, const Tensor& a, const Tensor& grad_out, Tensor& grad_in) {
  CheckCpu("unary_backward", a);
  checks::UnaryBackward(kRef, kF32, op, a, grad_out, grad_in);
  const float* pa = a.data<float>();
  const float* pg = grad_out.data<float>();
  float* pi = grad_in.data<float>();
  for (int64_t i = 0, n = a.numel(); i < n; ++i) {
    double x = pa[i], d = 0;
    switch (op) {
      case UnaryOp::kScale: break;  // rejected above
      case UnaryOp::kAddScalar: d = 1.0; break;
      case UnaryOp::kRelu: d = x > 0 ? 1.0 : 0.0; break;  // 0 at 0, as PyTorch
      case UnaryOp::kGeluTanh: d = GeluGrad(x); break;
      case UnaryOp::kExp: d = std::exp(x); break;
      case UnaryOp::kLog: d = 1.0 / x; break;
      case UnaryOp::kNeg: d = -1.0; break;
      case UnaryOp::kSquare: d = 2.0 * x; break;
      case UnaryOp::kSqrt: d = 0.5 / std::sqrt(x); break;
      case UnaryOp::kTanh: {
        double t = std::tanh(x);
        d = 1.0 - t * t;
        break;
      }
    }
    pi[i] = float(double(pg[i]) * d);
  }
}

void axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  CheckCpu("axpby", x);
  checks::Axpby(kRef, kF32, x, y);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    double prev = beta == 0.0f ? 0.0 : double(beta) * py[i];
    py[i] = float(double(alpha) * px[i] + prev);
  }
}

// ---- Reductions ---------------------------------------------------------------------------

void sum_all(const Tensor& a, Tensor& out) {
  CheckCpu("sum_all", a);
  checks::SumAll(kRef, kF32, a, out);
  const float* pa = a.data<float>();
  double s = 0;
  for (int64_t i = 0, n = a.numel(); i < n; ++i) s += pa[i];
  out.data<float>()[0] = float(s);
}

void sum_rows(const Tensor& a, Tensor& out, float beta) {
  CheckCpu("sum_rows", a);
  const auto dims = checks::SumRows(kRef, kF32, a, out);
  const int64_t rows = dims.rows, cols = dims.cols;
  const float* pa = a.data<float>();
  float* po = out.data<float>();
  for (int64_t c = 0; c < cols; ++c) {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) s += pa[r * cols + c];
    po[c] = float((beta == 0.0f ? 0.0 : double(beta) * po[c]) + s);
  }
}

// ---- Matrix products ----------------------------------------------------------------------

void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
            float alpha, float beta) {
  CheckCpu("matmul", a);
  const auto dims = checks::Matmul(kRef, kF32, a, b, out, trans_a, trans_b);
  const int64_t batch = dims.batch, m = dims.m, n = dims.n, k = dims.k;
  // Stored shapes of one batch entry: a is [ar, ac], b is [br, bc].
  const int64_t ar = dims.a_rows, ac = dims.a_cols, br = dims.b_rows, bc = dims.b_cols;
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  // out may alias an operand: compute a whole product before writing it.
  std::vector<double> acc(static_cast<size_t>(m * n));
  for (int64_t bi = 0; bi < batch; ++bi) {
    const float* A = pa + bi * ar * ac;
    const float* B = pb + bi * br * bc;
    float* C = po + bi * m * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          double x = trans_a ? A[p * ac + i] : A[i * ac + p];
          double y = trans_b ? B[j * bc + p] : B[p * bc + j];
          s += x * y;
        }
        acc[size_t(i * n + j)] = s;
      }
    }
    for (int64_t i = 0; i < m * n; ++i) {
      double prev = beta == 0.0f ? 0.0 : double(beta) * C[i];
      C[i] = float(double(alpha) * acc[size_t(i)] + prev);
    }
  }
}

// ---- Fused neural-network ops --------------------------------------------------------------

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       Tensor& out, Tensor& mean, Tensor& rstd) {
  CheckCpu("layernorm_forward", x);
  const auto dims = checks::LayerNormForward(kRef, kF32, x, weight, bias, out, mean, rstd);
  const int64_t rows = dims.rows, c = dims.cols;
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  const float* pb = bias.data<float>();
  float* po = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = px + r * c;
    double mu = 0;
    for (int64_t i = 0; i < c; ++i) mu += row[i];
    mu /= double(c);
    double var = 0;  // biased, as PyTorch's LayerNorm
    for (int64_t i = 0; i < c; ++i) var += (row[i] - mu) * (row[i] - mu);
    var /= double(c);
    double rs = 1.0 / std::sqrt(var + double(eps));
    for (int64_t i = 0; i < c; ++i) {
      po[r * c + i] = float((row[i] - mu) * rs * pw[i] + pb[i]);
    }
    mean.data<float>()[r] = float(mu);
    rstd.data<float>()[r] = float(rs);
  }
}

void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                        Tensor& dbias) {
  CheckCpu("layernorm_backward", x);
  const auto dims =
      checks::LayerNormBackward(kRef, kF32, dout, x, weight, mean, rstd, dx, dweight, dbias);
  const int64_t rows = dims.rows, c = dims.cols;
  const float* pg = dout.data<float>();
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  float* pdx = dx.data<float>();
  std::vector<double> dw(static_cast<size_t>(c), 0.0), db(static_cast<size_t>(c), 0.0);
  std::vector<double> xhat(static_cast<size_t>(c)), dxhat(static_cast<size_t>(c));
  for (int64_t r = 0; r < rows; ++r) {
    const double mu = mean.data<float>()[r], rs = rstd.data<float>()[r];
    double mean_dxhat = 0, mean_dxhat_xhat = 0;
    for (int64_t i = 0; i < c; ++i) {
      xhat[size_t(i)] = (px[r * c + i] - mu) * rs;
      dxhat[size_t(i)] = double(pg[r * c + i]) * pw[i];
      mean_dxhat += dxhat[size_t(i)];
      mean_dxhat_xhat += dxhat[size_t(i)] * xhat[size_t(i)];
      dw[size_t(i)] += double(pg[r * c + i]) * xhat[size_t(i)];
      db[size_t(i)] += pg[r * c + i];
    }
    mean_dxhat /= double(c);
    mean_dxhat_xhat /= double(c);
    for (int64_t i = 0; i < c; ++i) {
      pdx[r * c + i] =
          float(rs * (dxhat[size_t(i)] - mean_dxhat - xhat[size_t(i)] * mean_dxhat_xhat));
    }
  }
  float* pdw = dweight.data<float>();
  float* pdb = dbias.data<float>();
  for (int64_t i = 0; i < c; ++i) {
    pdw[i] = float(pdw[i] + dw[size_t(i)]);
    pdb[i] = float(pdb[i] + db[size_t(i)]);
  }
}

void softmax_forward(const Tensor& x, Tensor& out) {
  CheckCpu("softmax_forward", x);
  const auto dims = checks::SoftmaxForward(kRef, kF32, x, out);
  const int64_t rows = dims.rows, c = dims.cols;
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) SoftmaxRow(px + r * c, c, po + r * c);
}

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  CheckCpu("softmax_backward", y);
  const auto dims = checks::SoftmaxBackward(kRef, kF32, y, dy, dx);
  const int64_t rows = dims.rows, c = dims.cols;
  const float* py = y.data<float>();
  const float* pg = dy.data<float>();
  float* pd = dx.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int64_t i = 0; i < c; ++i) dot += double(pg[r * c + i]) * py[r * c + i];
    for (int64_t i = 0; i < c; ++i) {
      pd[r * c + i] = float(py[r * c + i] * (pg[r * c + i] - dot));
    }
  }
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                           Tensor& probs) {
  CheckCpu("cross_entropy_forward", logits);
  const auto dims = checks::CrossEntropyForward(kRef, kF32, logits, targets, losses, probs);
  const int64_t n = dims.rows, v = dims.cols;
  const float* pl = logits.data<float>();
  const int32_t* pt = targets.data<int32_t>();
  float* pp = probs.data<float>();
  float* ploss = losses.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    const float* row = pl + r * v;
    const auto [mx, s] = SoftmaxRow(row, v, pp + r * v);
    const int32_t t = pt[r];
    if (t < 0) {
      ploss[r] = 0.0f;
      continue;
    }
    BRAID_CHECK(t < v) << "reference cross_entropy_forward: target " << t << " at row " << r
                       << " is outside the vocabulary of " << v;
    // -log softmax[t] = log(sum exp(x - mx)) - (x_t - mx).
    ploss[r] = float(std::log(s) - (row[t] - mx));
  }
}

void inverse_count_nonnegative(const Tensor& ids, Tensor& out) {
  CheckCpu("inverse_count_nonnegative", ids);
  BRAID_CHECK(ids.dtype() == DType::kI32 && out.dtype() == kF32 && out.numel() == 1)
      << "reference inverse_count_nonnegative wants i32 ids and one f32 output, got "
      << ids.DescribeForError() << " and " << out.DescribeForError();
  int64_t counted = 0;
  for (int64_t i = 0; i < ids.numel(); ++i) counted += ids.data<int32_t>()[i] >= 0;
  out.data<float>()[0] = counted > 0 ? 1.0f / float(counted) : 0.0f;
}

void cross_entropy_backward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                            Tensor& dlogits) {
  CheckCpu("cross_entropy_backward", probs);
  const auto dims = checks::CrossEntropyBackward(kRef, kF32, probs, targets, dloss, dlogits);
  const int64_t n = dims.rows, v = dims.cols;
  const float* pp = probs.data<float>();
  const int32_t* pt = targets.data<int32_t>();
  const float* pdl = dloss.data<float>();
  float* pd = dlogits.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = pt[r];
    for (int64_t i = 0; i < v; ++i) {
      // An ignored row contributed nothing to the loss, so it gets no gradient.
      double g = t < 0 ? 0.0 : (double(pp[r * v + i]) - (i == t ? 1.0 : 0.0)) * pdl[r];
      pd[r * v + i] = float(g);
    }
  }
}

void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  CheckCpu("embedding_forward", weight);
  const auto dims = checks::EmbeddingForward(kRef, kF32, weight, ids, out);
  const int64_t v = dims.vocab, c = dims.cols, n = dims.n;
  const float* pw = weight.data<float>();
  const int32_t* pi = ids.data<int32_t>();
  float* po = out.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    BRAID_CHECK(pi[r] >= 0 && pi[r] < v) << "reference embedding_forward: id " << pi[r]
                                          << " at position " << r << " outside [0, " << v << ")";
    for (int64_t i = 0; i < c; ++i) po[r * c + i] = pw[pi[r] * c + i];
  }
}

void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dweight) {
  CheckCpu("embedding_backward", dout);
  const auto dims = checks::EmbeddingBackward(kRef, kF32, dout, ids, dweight);
  const int64_t v = dims.vocab, c = dims.cols, n = dims.n;
  const float* pg = dout.data<float>();
  const int32_t* pi = ids.data<int32_t>();
  float* pw = dweight.data<float>();
  std::vector<double> acc(pw, pw + v * c);
  for (int64_t r = 0; r < n; ++r) {
    BRAID_CHECK(pi[r] >= 0 && pi[r] < v) << "reference embedding_backward: id " << pi[r]
                                          << " at position " << r << " outside [0, " << v << ")";
    for (int64_t i = 0; i < c; ++i) acc[size_t(pi[r] * c + i)] += pg[r * c + i];
  }
  for (int64_t i = 0; i < v * c; ++i) pw[i] = float(acc[size_t(i)]);
}

void attention_forward(const Tensor& qkv, int n_head, Tensor& out, Tensor& att) {
  CheckCpu("attention_forward", qkv);
  const checks::AttentionDims s = checks::AttentionForward(kRef, kF32, qkv, n_head, out, att);
  const float* pq = qkv.data<float>();
  float* po = out.data<float>();
  float* pa = att.data<float>();
  const double scale = 1.0 / std::sqrt(double(s.d));
  // Element (b, t, part, h, i) of qkv: part 0 = q, 1 = k, 2 = v.
  auto at = [&](int64_t b, int64_t t, int part, int64_t h, int64_t i) -> double {
    return pq[(b * s.t + t) * 3 * s.c + part * s.c + h * s.d + i];
  };
  std::vector<double> scores(static_cast<size_t>(s.t));
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < s.h; ++h) {
      float* A = pa + (b * s.h + h) * s.t * s.t;
      for (int64_t t = 0; t < s.t; ++t) {
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t i = 0; i < s.d; ++i) dot += at(b, t, 0, h, i) * at(b, u, 1, h, i);
          scores[size_t(u)] = dot * scale;
          mx = std::max(mx, scores[size_t(u)]);
        }
        double sum = 0;
        for (int64_t u = 0; u <= t; ++u) sum += std::exp(scores[size_t(u)] - mx);
        for (int64_t u = 0; u < s.t; ++u) {
          scores[size_t(u)] = u <= t ? std::exp(scores[size_t(u)] - mx) / sum : 0.0;
          A[t * s.t + u] = float(scores[size_t(u)]);
        }
        for (int64_t i = 0; i < s.d; ++i) {
          double o = 0;
          for (int64_t u = 0; u <= t; ++u) o += scores[size_t(u)] * at(b, u, 2, h, i);
          po[(b * s.t + t) * s.c + h * s.d + i] = float(o);
        }
      }
    }
  }
}

void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int n_head,
                        Tensor& dqkv) {
  CheckCpu("attention_backward", qkv);
  const checks::AttentionDims s =
      checks::AttentionBackward(kRef, kF32, dout, qkv, att, n_head, dqkv);
  const float* pq = qkv.data<float>();
  const float* pg = dout.data<float>();
  const float* pa = att.data<float>();
  const double scale = 1.0 / std::sqrt(double(s.d));
  auto idx = [&](int64_t b, int64_t t, int part, int64_t h, int64_t i) {
    return (b * s.t + t) * 3 * s.c + part * s.c + h * s.d + i;
  };
  std::vector<double> grad(size_t(qkv.numel()), 0.0);
  std::vector<double> datt(static_cast<size_t>(s.t));
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < s.h; ++h) {
      const float* A = pa + (b * s.h + h) * s.t * s.t;
      for (int64_t t = 0; t < s.t; ++t) {
        const float* dO = pg + (b * s.t + t) * s.c + h * s.d;
        // out[t] = sum_u A[t,u] v[u]: gradients into A[t,:] and v.
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t i = 0; i < s.d; ++i) {
            dot += double(dO[i]) * pq[idx(b, u, 2, h, i)];
            grad[size_t(idx(b, u, 2, h, i))] += double(A[t * s.t + u]) * dO[i];
          }
          datt[size_t(u)] = dot;
        }
        // Through the softmax over u <= t.
        double inner = 0;
        for (int64_t u = 0; u <= t; ++u) inner += double(A[t * s.t + u]) * datt[size_t(u)];
        for (int64_t u = 0; u <= t; ++u) {
          double dscore = double(A[t * s.t + u]) * (datt[size_t(u)] - inner) * scale;
          // score[t,u] = q[t] . k[u] * scale.
          for (int64_t i = 0; i < s.d; ++i) {
            grad[size_t(idx(b, t, 0, h, i))] += dscore * pq[idx(b, u, 1, h, i)];
            grad[size_t(idx(b, u, 1, h, i))] += dscore * pq[idx(b, t, 0, h, i)];
          }
        }
      }
    }
  }
  float* pd = dqkv.data<float>();
  for (size_t i = 0; i < grad.size(); ++i) pd[i] = float(grad[i]);
}

// ---- Optimizer updates ----------------------------------------------------------------------

void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p) {
  CheckCpu("adamw", param);
  checks::AdamW(kRef, param, grad, m, v, p);
  const int64_t n = param.numel();
  float* w = param.data<float>();
  const float* g = grad.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  const double b1 = p.beta1, b2 = p.beta2, lr = p.lr;
  const double bc1 = 1.0 - std::pow(b1, double(p.step));
  const double bc2 = 1.0 - std::pow(b2, double(p.step));
  for (int64_t i = 0; i < n; ++i) {
    double mi = b1 * pm[i] + (1.0 - b1) * g[i];
    double vi = b2 * pv[i] + (1.0 - b2) * double(g[i]) * g[i];
    double mhat = mi / bc1, vhat = vi / bc2;
    double wi = w[i] * (1.0 - lr * double(p.weight_decay));  // decoupled decay first
    wi -= lr * mhat / (std::sqrt(vhat) + double(p.eps));
    pm[i] = float(mi);
    pv[i] = float(vi);
    w[i] = float(wi);
  }
}

void sgd(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p) {
  CheckCpu("sgd", param);
  checks::Sgd(kRef, param, grad, momentum_buf, p);
  const int64_t n = param.numel();
  const bool use_momentum = p.momentum != 0.0f;
  float* w = param.data<float>();
  const float* g = grad.data<float>();
  float* buf = use_momentum ? momentum_buf.data<float>() : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    double d = double(g[i]) + double(p.weight_decay) * w[i];
    if (use_momentum) {
      double b = p.first_step ? d
                              : double(p.momentum) * buf[i] + (1.0 - double(p.dampening)) * d;
      buf[i] = float(b);
      d = p.nesterov ? d + double(p.momentum) * b : b;
    }
    w[i] = float(w[i] - double(p.lr) * d);
  }
}

// ---- Registration ---------------------------------------------------------------------------

namespace {
template <typename Fn>
void RegisterIfEmpty(kernels::KernelSlot<Fn>& slot, Fn* fn) {
  if (slot.Find(DeviceType::kCPU) == nullptr) slot.Register(DeviceType::kCPU, fn);
}
}  // namespace

void RegisterReferenceKernels() {
  RegisterIfEmpty(kernels::copy, &copy);
  RegisterIfEmpty(kernels::fill, &fill);
  RegisterIfEmpty(kernels::binary, &binary);
  RegisterIfEmpty(kernels::unary, &unary);
  RegisterIfEmpty(kernels::unary_backward, &unary_backward);
  RegisterIfEmpty(kernels::axpby, &axpby);
  RegisterIfEmpty(kernels::sum_all, &sum_all);
  RegisterIfEmpty(kernels::sum_rows, &sum_rows);
  RegisterIfEmpty(kernels::matmul, &matmul);
  RegisterIfEmpty(kernels::layernorm_forward, &layernorm_forward);
  RegisterIfEmpty(kernels::layernorm_backward, &layernorm_backward);
  RegisterIfEmpty(kernels::softmax_forward, &softmax_forward);
  RegisterIfEmpty(kernels::softmax_backward, &softmax_backward);
  RegisterIfEmpty(kernels::cross_entropy_forward, &cross_entropy_forward);
  RegisterIfEmpty(kernels::cross_entropy_backward, &cross_entropy_backward);
  RegisterIfEmpty(kernels::inverse_count_nonnegative, &inverse_count_nonnegative);
  RegisterIfEmpty(kernels::embedding_forward, &embedding_forward);
  RegisterIfEmpty(kernels::embedding_backward, &embedding_backward);
  RegisterIfEmpty(kernels::attention_forward, &attention_forward);
  RegisterIfEmpty(kernels::attention_backward, &attention_backward);
  RegisterIfEmpty(kernels::rmsnorm_forward, &rmsnorm_forward);
  RegisterIfEmpty(kernels::rmsnorm_backward, &rmsnorm_backward);
  RegisterIfEmpty(kernels::swiglu_forward, &swiglu_forward);
  RegisterIfEmpty(kernels::swiglu_backward, &swiglu_backward);
  RegisterIfEmpty(kernels::rope, &rope);
  RegisterIfEmpty(kernels::gqa_forward, &gqa_forward);
  RegisterIfEmpty(kernels::gqa_backward, &gqa_backward);
  RegisterIfEmpty(kernels::dropout, &dropout);
  RegisterIfEmpty(kernels::adamw, &adamw);
  RegisterIfEmpty(kernels::sgd, &sgd);
}

}  // namespace braid::reference
