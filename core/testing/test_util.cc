#include "core/testing/test_util.h"

#include <cmath>
#include <sstream>

#include "core/autograd.h"

namespace braid::test {

Tensor RandomTensor(const Shape& shape, std::mt19937& rng, float lo, float hi, Device device) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(size_t(NumElements(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::FromVector(v, shape, device);
}

Tensor RandomTensorAwayFromZero(const Shape& shape, std::mt19937& rng, float min_abs,
                                float max_abs) {
  std::uniform_real_distribution<float> mag(min_abs, max_abs);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(size_t(NumElements(shape)));
  for (float& x : v) x = neg(rng) ? -mag(rng) : mag(rng);
  return Tensor::FromVector(v, shape);
}

std::vector<double> ToDoubles(const Tensor& t) {
  std::vector<float> f = t.ToFloatVector();
  return std::vector<double>(f.begin(), f.end());
}

::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<double>& want,
                                    double rtol, double atol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: got " << got.size() << " values, want " << want.size();
  }
  size_t worst = 0, bad = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(double(got[i]) - want[i]);
    double allowed = atol + rtol * std::fabs(want[i]);
    if (!(err <= allowed)) {  // NaN fails too
      ++bad;
      double excess = std::isnan(err) ? INFINITY : err - allowed;
      if (bad == 1 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " values differ; worst at [" << worst << "]: got "
         << got[worst] << ", want " << want[worst] << " (rtol " << rtol << ", atol " << atol
         << ")";
}

::testing::AssertionResult AllClose(const Tensor& got, const std::vector<double>& want,
                                    double rtol, double atol) {
  return AllClose(got.ToFloatVector(), want, rtol, atol);
}

namespace {
double Project(const Tensor& out, const std::vector<float>& r) {
  std::vector<float> o = out.ToFloatVector();
  double s = 0;
  for (size_t i = 0; i < o.size(); ++i) s += double(o[i]) * r[i];
  return s;
}
}  // namespace

::testing::AssertionResult GradCheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                     const std::vector<Tensor>& inputs,
                                     const GradCheckOptions& opts) {
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) Tensor(t).ZeroGrad();
  }
  Tensor out = fn(inputs);
  if (!out.requires_grad()) {
    return ::testing::AssertionFailure() << "the output does not require grad: nothing recorded";
  }
  std::mt19937 rng(opts.seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> r(size_t(out.numel()));
  for (float& x : r) x = dist(rng);
  out.Backward(Tensor::FromVector(r, out.shape(), out.device()));

  autograd::NoGradGuard no_grad;
  std::ostringstream failures;
  int num_failures = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& in = inputs[k];
    if (!in.defined() || !in.requires_grad() || in.dtype() != DType::kF32) continue;
    if (in.device().type != DeviceType::kCPU) {
      return ::testing::AssertionFailure()
             << "GradCheck perturbs inputs in place on the host; input " << k << " is "
             << in.DescribeForError();
    }
    if (!in.grad().defined()) {
      failures << "input " << k << " " << in.DescribeForError() << " got no gradient; ";
      ++num_failures;
      continue;
    }
    std::vector<float> analytic = in.grad().ToFloatVector();
    bool any_nonzero = false;
    float* p = in.data<float>();
    for (int64_t i = 0; i < in.numel(); ++i) {
      const float saved = p[i];
      p[i] = saved + opts.eps;
      double plus = Project(fn(inputs), r);
      p[i] = saved - opts.eps;
      double minus = Project(fn(inputs), r);
      p[i] = saved;
      // The step actually taken, as float arithmetic rounded it.
      double step = double(saved + opts.eps) - double(saved - opts.eps);
      double numeric = (plus - minus) / step;
      double a = analytic[size_t(i)];
      any_nonzero = any_nonzero || a != 0.0;
      double allowed = opts.atol + opts.rtol * std::max(std::fabs(a), std::fabs(numeric));
      if (!(std::fabs(a - numeric) <= allowed)) {
        if (num_failures < 8) {
          failures << "input " << k << " " << in.DescribeForError() << " element " << i
                   << ": analytic " << a << " vs numeric " << numeric << "; ";
        }
        ++num_failures;
      }
    }
    if (opts.require_nonzero && !any_nonzero) {
      failures << "input " << k << " " << in.DescribeForError() << " has an all-zero gradient; ";
      ++num_failures;
    }
  }
  if (num_failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << num_failures << " gradient mismatches: "
                                       << failures.str();
}

}  // namespace braid::test
