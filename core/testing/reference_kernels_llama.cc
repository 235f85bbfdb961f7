// Reference kernels of the Llama-family slots (RMSNorm, SiLU/SwiGLU, rotary embedding,
// grouped-query attention): the
// plainest loops over each slot's contract in core/kernels.h, accumulating in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/kernel_checks.h"
#include "core/testing/reference_kernels.h"

namespace braid::reference {
namespace {

namespace checks = kernels::checks;
constexpr const char* kRef = "reference";
constexpr DType kF32 = DType::kF32;

void CheckCpu(const char* kernel, const Tensor& t) {
  BRAID_CHECK(t.device().type == DeviceType::kCPU)
      << "reference kernel '" << kernel << "' runs on the host only, got " << t.DescribeForError();
}

double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                     Tensor& rstd) {
  CheckCpu("rmsnorm_forward", x);
  const auto d = checks::RmsNormForward(kRef, kF32, x, weight, out, rstd);
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  float* po = out.data<float>();
  float* pr = rstd.data<float>();
  for (int64_t r = 0; r < d.rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d.cols; ++i) ss += double(px[r * d.cols + i]) * px[r * d.cols + i];
    const double rs = 1.0 / std::sqrt(ss / double(d.cols) + double(eps));
    pr[r] = float(rs);
    for (int64_t i = 0; i < d.cols; ++i) {
      po[r * d.cols + i] = float(double(px[r * d.cols + i]) * rs * pw[i]);
    }
  }
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                      const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  CheckCpu("rmsnorm_backward", x);
  const auto d = checks::RmsNormBackward(kRef, kF32, dout, x, weight, rstd, dx, dweight);
  const int64_t c = d.cols;
  const float* pg = dout.data<float>();
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  float* pdx = dx.data<float>();
  std::vector<double> dw(static_cast<size_t>(c), 0.0);
  for (int64_t r = 0; r < d.rows; ++r) {
    const double rs = rstd.data<float>()[r];
    // y = x rs w with rs = (mean(x^2) + eps)^-1/2: dx = rs (g w - x rs^2 mean(g w x)).
    double dot = 0;
    for (int64_t i = 0; i < c; ++i) {
      dot += double(pg[r * c + i]) * pw[i] * px[r * c + i];
      dw[size_t(i)] += double(pg[r * c + i]) * px[r * c + i] * rs;
    }
    dot /= double(c);
    for (int64_t i = 0; i < c; ++i) {
      pdx[r * c + i] =
          float(rs * (double(pg[r * c + i]) * pw[i] - double(px[r * c + i]) * rs * rs * dot));
    }
  }
  float* pdw = dweight.data<float>();
  for (int64_t i = 0; i < c; ++i) pdw[i] = float(pdw[i] + dw[size_t(i)]);
}

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) {
  CheckCpu("swiglu_forward", gate);
  const int64_t n = checks::SwiGluForward(kRef, kF32, gate, up, out);
  const float* pg = gate.data<float>();
  const float* pu = up.defined() ? up.data<float>() : nullptr;
  float* po = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const double g = pg[i];
    po[i] = float(g * Sigmoid(g) * (pu != nullptr ? double(pu[i]) : 1.0));
  }
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate,
                     Tensor& dup) {
  CheckCpu("swiglu_backward", gate);
  const int64_t n = checks::SwiGluBackward(kRef, kF32, dout, gate, up, dgate, dup);
  const float* pd = dout.data<float>();
  const float* pg = gate.data<float>();
  const float* pu = up.defined() ? up.data<float>() : nullptr;
  float* pdg = dgate.data<float>();
  float* pdu = dup.defined() ? dup.data<float>() : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const double g = pg[i], s = Sigmoid(g), u = pu != nullptr ? double(pu[i]) : 1.0;
    pdg[i] = float(double(pd[i]) * u * s * (1.0 + g * (1.0 - s)));
    if (pdu != nullptr) pdu[i] = float(double(pd[i]) * g * s);
  }
}

void rope(const Tensor& x, const kernels::RopeParams& p, Tensor& out) {
  CheckCpu("rope", x);
  const auto d = checks::Rope(kRef, kF32, x, p, out);
  const int64_t half = d.d / 2;
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const double sign = p.inverse ? -1.0 : 1.0;
  for (int64_t b = 0; b < d.b; ++b) {
    for (int64_t t = 0; t < d.t; ++t) {
      const double pos = double(p.position_offset + t) / double(p.position_scale);
      for (int64_t h = 0; h < d.h; ++h) {
        const int64_t base = ((b * d.t + t) * d.h + h) * d.d;
        for (int64_t i = 0; i < half; ++i) {
          const double angle =
              pos * std::pow(double(p.theta), -2.0 * double(i) / double(d.d)) * sign;
          const double c = std::cos(angle), s = std::sin(angle);
          const double x1 = px[base + i], x2 = px[base + i + half];
          po[base + i] = float(x1 * c - x2 * s);
          po[base + i + half] = float(x2 * c + x1 * s);
        }
      }
    }
  }
}

}  // namespace braid::reference

namespace braid::reference {

void gqa_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& att) {
  CheckCpu("gqa_forward", q);
  const auto s = checks::GqaForward(kRef, kF32, q, k, v, out, att);
  const int64_t group = s.h / s.hkv;
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  float* po = out.data<float>();
  float* pa = att.data<float>();
  const double scale = 1.0 / std::sqrt(double(s.d));
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * s.t + t) * s.h + h) * s.d; };
  auto ki = [&](int64_t b, int64_t t, int64_t g) { return ((b * s.t + t) * s.hkv + g) * s.d; };
  std::vector<double> p(static_cast<size_t>(s.t));
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t g = h / group;
      float* A = pa + (b * s.h + h) * s.t * s.t;
      for (int64_t t = 0; t < s.t; ++t) {
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t i = 0; i < s.d; ++i) dot += double(pq[qi(b, t, h) + i]) * pk[ki(b, u, g) + i];
          p[size_t(u)] = dot * scale;
          mx = std::max(mx, p[size_t(u)]);
        }
        double sum = 0;
        for (int64_t u = 0; u <= t; ++u) sum += std::exp(p[size_t(u)] - mx);
        for (int64_t u = 0; u < s.t; ++u) {
          p[size_t(u)] = u <= t ? std::exp(p[size_t(u)] - mx) / sum : 0.0;
          A[t * s.t + u] = float(p[size_t(u)]);
        }
        for (int64_t i = 0; i < s.d; ++i) {
          double o = 0;
          for (int64_t u = 0; u <= t; ++u) o += p[size_t(u)] * pv[ki(b, u, g) + i];
          po[qi(b, t, h) + i] = float(o);
        }
      }
    }
  }
}

void gqa_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& att, Tensor& dq, Tensor& dk, Tensor& dv) {
  CheckCpu("gqa_backward", q);
  const auto s = checks::GqaBackward(kRef, kF32, dout, q, k, v, att, dq, dk, dv);
  const int64_t group = s.h / s.hkv;
  const float* pg = dout.data<float>();
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  const float* pa = att.data<float>();
  const double scale = 1.0 / std::sqrt(double(s.d));
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * s.t + t) * s.h + h) * s.d; };
  auto ki = [&](int64_t b, int64_t t, int64_t g) { return ((b * s.t + t) * s.hkv + g) * s.d; };
  std::vector<double> gq(size_t(q.numel()), 0.0), gk(size_t(k.numel()), 0.0),
      gv(size_t(v.numel()), 0.0), dA(static_cast<size_t>(s.t));
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t g = h / group;
      const float* A = pa + (b * s.h + h) * s.t * s.t;
      for (int64_t t = 0; t < s.t; ++t) {
        // out[t] = sum_u A[t,u] v[u]: dA[u] = <dout[t], v[u]>, dv[u] += A[t,u] dout[t].
        double dot_pa = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < s.d; ++i) {
            d += double(pg[qi(b, t, h) + i]) * pv[ki(b, u, g) + i];
            gv[size_t(ki(b, u, g) + i)] += double(A[t * s.t + u]) * pg[qi(b, t, h) + i];
          }
          dA[size_t(u)] = d;
          dot_pa += double(A[t * s.t + u]) * d;
        }
        // Softmax backward, then the scaled q.k products.
        for (int64_t u = 0; u <= t; ++u) {
          const double ds = double(A[t * s.t + u]) * (dA[size_t(u)] - dot_pa) * scale;
          for (int64_t i = 0; i < s.d; ++i) {
            gq[size_t(qi(b, t, h) + i)] += ds * pk[ki(b, u, g) + i];
            gk[size_t(ki(b, u, g) + i)] += ds * pq[qi(b, t, h) + i];
          }
        }
      }
    }
  }
  for (size_t i = 0; i < gq.size(); ++i) dq.data<float>()[i] = float(gq[i]);
  for (size_t i = 0; i < gk.size(); ++i) dk.data<float>()[i] = float(gk[i]);
  for (size_t i = 0; i < gv.size(); ++i) dv.data<float>()[i] = float(gv[i]);
}

}  // namespace braid::reference

namespace braid::reference {

void dropout(const Tensor& x, float p, uint64_t seed, Tensor& out) {
  CheckCpu("dropout", x);
  const int64_t n = checks::Dropout(kRef, kF32, x, p, out);
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    po[i] = kernels::DropoutKeep(seed, uint64_t(i), p) ? px[i] * scale : 0.0f;
  }
}

}  // namespace braid::reference
