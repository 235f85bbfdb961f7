// The Llama-family CUDA kernels' math (backends/cuda/math/llama.h), compiled for the host, against
// the CPU backend's slots (backends/cpu/llama_kernels.cc) on the same inputs.
//
// Exactness: SiLU/SwiGLU and their derivatives, the rotary embedding and dropout are written as
// the CPU's portable paths, operation for operation, and the host compiler contracts nothing
// here, so against the portable path (SetSimdEnabled(false)) they must be bit-identical, NaN for
// NaN. RMSNorm's kernels add a row's squares in the GPU's tree order (kernels/reduce.h), not the
// CPU's eight lanes: composed in that order here its rstd is within 1e-6 relative of the CPU's;
// its outputs from the CPU's rstd are the CPU's bit for bit; its input gradient (the row's dot
// in another order) within 1e-5 absolute + 1e-5 relative, and the weight gradient (rows added in
// order, where the CPU adds 16 row slices) within 1e-5 + 1e-5. The grouped-query attention's
// kernels are checked against the CPU on a GPU (kernels/kernels_gpu_test.cc).
#include "backends/cuda/math/llama.h"

#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/test_util.h"
#include "backends/cuda/math/reduction_order.h"
#include "core/kernels.h"
#include "gtest/gtest.h"

namespace braid::cuda::math {
namespace {

using cpu::testing::RandomTensor;
using cpu::testing::SameFloatBits;

// [-12, 12], near 0, past exp's overflow for e^-g (g < -88.7), and specials.
std::vector<float> Gates() {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> wide(-12.f, 12.f), narrow(-1.f, 1.f);
  std::vector<float> v;
  for (int i = 0; i < 3000; ++i) v.push_back(wide(rng));
  for (int i = 0; i < 1000; ++i) v.push_back(narrow(rng));
  for (float s : {0.f, -0.f, 1e-30f, -1e-30f, 50.f, -50.f, 88.f, -88.f, 90.f, -90.f, 100.f,
                  -100.f, 1000.f, -1000.f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN}) {
    v.push_back(s);
  }
  return v;
}

std::vector<float> Uniform(size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

Tensor Vec(const std::vector<float>& v) { return Tensor::FromVector(v, {int64_t(v.size())}); }


bool Near(float got, float want, float atol, float rtol) {
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

using SimdOff = cpu::testing::PortablePathTest;

TEST_F(SimdOff, SwiGluAndSiluAreBitIdenticalToTheCpu) {
  const std::vector<float> g = Gates();
  const std::vector<float> u = Uniform(g.size(), 3, -3.f, 3.f), d = Uniform(g.size(), 4, -2.f, 2.f);
  const Tensor tg = Vec(g), tu = Vec(u), td = Vec(d);
  for (bool with_up : {true, false}) {
    const Tensor up = with_up ? tu : Tensor();
    Tensor out = Tensor::Empty({tg.numel()}), dgate = Tensor::Empty({tg.numel()});
    Tensor dup = with_up ? Tensor::Empty({tg.numel()}) : Tensor();
    kernels::swiglu_forward.Get(Device::CPU())(tg, up, out);
    kernels::swiglu_backward.Get(Device::CPU())(td, tg, up, dgate, dup);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_TRUE(SameFloatBits(SwiGlu(g[i], with_up ? &u[i] : nullptr), out.data<float>()[i]))
          << "forward, up " << with_up << ", g=" << g[i];
      ASSERT_TRUE(SameFloatBits(SwiGluDgate(d[i], g[i], with_up ? u[i] : 1.0f), dgate.data<float>()[i]))
          << "dgate, up " << with_up << ", g=" << g[i];
      if (with_up) {
        ASSERT_TRUE(SameFloatBits(SwiGluDup(d[i], g[i]), dup.data<float>()[i])) << g[i];
      }
    }
  }
}

TEST(LlamaMath, DropoutMaskIsCoresAndTheOutputTheCpus) {
  for (uint64_t seed : {0ull, 1ull, 1234ull, 0xFFFFFFFFFFFFFFFFull}) {
    for (float p : {0.f, 0.1f, 0.5f, 0.9f, 1.f}) {
      for (uint64_t i = 0; i < 20000; ++i) {
        ASSERT_EQ(DropoutKeep(seed, i, p), kernels::DropoutKeep(seed, i, p))
            << "seed " << seed << " i " << i << " p " << p;
      }
    }
  }
  const std::vector<float> x = Uniform(10007, 5, -4.f, 4.f);
  for (float p : {0.f, 0.25f, 1.f}) {
    Tensor out = Tensor::Empty({int64_t(x.size())});
    kernels::dropout.Get(Device::CPU())(Vec(x), p, 99, out);
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = DropoutKeep(99, i, p) ? x[i] * DropoutScale(p) : 0.0f;
      ASSERT_TRUE(SameFloatBits(want, out.data<float>()[i])) << "p " << p << " i " << i;
    }
  }
}

TEST(LlamaMath, RopeIsBitIdenticalToTheCpu) {
  const int64_t B = 2, T = 7, H = 3, D = 16, half = D / 2;
  std::mt19937 rng(6);
  const Tensor x = RandomTensor({B, T, H, D}, rng, -2.f, 2.f);
  for (kernels::RopeParams p : {kernels::RopeParams{10000.f, 1.f, 0, false},
                                kernels::RopeParams{500000.f, 2.f, 9000, false},
                                kernels::RopeParams{10000.f, 4.f, 31, true}}) {
    Tensor out = Tensor::Empty(x.shape());
    kernels::rope.Get(Device::CPU())(x, p, out);
    const float* px = x.data<float>();
    const float* po = out.data<float>();
    for (int64_t r = 0; r < B * T * H; ++r) {
      const int64_t t = (r / H) % T;
      const double pos = double(p.position_offset + t) / double(p.position_scale);
      for (int64_t i = 0; i < half; ++i) {
        float c, s, o1, o2;
        RopeCosSin(pos, i, D, double(p.theta), p.inverse, &c, &s);
        RopeRotate(px[r * D + i], px[r * D + i + half], c, s, &o1, &o2);
        ASSERT_TRUE(SameFloatBits(o1, po[r * D + i])) << "row " << r << " i " << i;
        ASSERT_TRUE(SameFloatBits(o2, po[r * D + i + half])) << "row " << r << " i " << i;
      }
    }
  }
}

// RMSNorm as the kernels compose it, against the CPU's slots; the kernels' threads per row are
// 32 (a warp, rows up to 1024 wide) or a block (wider rows): both orders.
TEST(LlamaMath, RmsNormInTheKernelsOrderMatchesTheCpu) {
  std::mt19937 rng(8);
  for (int64_t c : {96, 1500}) {
    const int64_t rows = 9;
    const int threads = c <= 1024 ? 32 : 256;
    const Tensor x = RandomTensor({rows, c}, rng, -3.f, 3.f);
    const Tensor w = RandomTensor({c}, rng, 0.5f, 1.5f);
    const Tensor g = RandomTensor({rows, c}, rng);
    Tensor out = Tensor::Empty({rows, c}), rstd = Tensor::Empty({rows});
    kernels::rmsnorm_forward.Get(Device::CPU())(x, w, 1e-5f, out, rstd);
    Tensor dx = Tensor::Empty({rows, c}), dw = Tensor::Zeros({c});
    kernels::rmsnorm_backward.Get(Device::CPU())(g, x, w, rstd, dx, dw);
    const float* px = x.data<float>();
    const float* pw = w.data<float>();
    const float* pg = g.data<float>();
    std::vector<float> dw_kernel(static_cast<size_t>(c), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = px + r * c;
      const float* gr = pg + r * c;
      const float rs_cpu = rstd.data<float>()[r];
      const float sq = order::TreeSum(c, threads, [&](int64_t i) { return xr[i] * xr[i]; });
      EXPECT_TRUE(Near(RmsNormRstd(sq, c, 1e-5f), rs_cpu, 0, 1e-6f)) << "row " << r << ", c " << c;
      const float dot =
          order::TreeSum(c, threads, [&](int64_t i) { return (gr[i] * pw[i]) * xr[i]; });
      const float k = RmsNormK(rs_cpu, dot, c);
      for (int64_t i = 0; i < c; ++i) {
        ASSERT_TRUE(SameFloatBits(RmsNormOut(xr[i], rs_cpu, pw[i]), out.data<float>()[r * c + i]));
        ASSERT_TRUE(Near(RmsNormDx(gr[i] * pw[i], xr[i], rs_cpu, k), dx.data<float>()[r * c + i],
                         1e-5f, 1e-5f))
            << "dx row " << r << " col " << i << ", c " << c;
        dw_kernel[size_t(i)] += RmsNormDwTerm(gr[i], xr[i], rs_cpu);
      }
    }
    for (int64_t i = 0; i < c; ++i) {
      ASSERT_TRUE(Near(dw_kernel[size_t(i)], dw.data<float>()[i], 1e-5f, 1e-5f)) << "dw col " << i;
    }
  }
}

}  // namespace
}  // namespace braid::cuda::math
