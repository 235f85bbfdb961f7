// The row-wise math of backends/cuda/math/rows.h composed on the host two ways, against the CPU
// backend's kernels through the kernel table on the same inputs:
//  - in the CPU backend's portable order (sequential sums): bit-identical, proving the
//    per-element formulas are the CPU's;
//  - in the order the CUDA kernels use (reduction_order.h's TreeSum: per-thread strided partial
//    sums, warp xor-butterflies, then warp 0 over the warp sums, as kernels/reduce.h), within a
//    quoted tolerance: only the summation order differs.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/test_util.h"
#include "backends/cuda/math/reduction_order.h"
#include "backends/cuda/math/rows.h"
#include "core/kernels.h"
#include "gtest/gtest.h"

namespace braid::cuda::math {
namespace {

using cpu::testing::AllClose;
using cpu::testing::BitEqual;
using cpu::testing::RandomIds;
using cpu::testing::RandomTensor;

using order::SeqSum;
using order::Term;
using order::TreeSum;

MaxSum TreeMaxSum(const float* x, int64_t n, int threads) {
  return order::TreeMaxSum(n, threads, [&](int64_t i) { return x[i]; });
}

class RowsMath : public ::testing::Test {
 protected:
  void TearDown() override { cpu::SetSimdEnabled(true); }
  std::mt19937 rng_{31};
};

// ---- LayerNorm ------------------------------------------------------------------------------

struct LnOut {
  Tensor out, mean, rstd;
};

LnOut LayerNormMath(const Tensor& x, const Tensor& w, const Tensor& b, float eps, bool tree) {
  const int64_t c = w.numel(), rows = x.numel() / c;
  LnOut r{Tensor::Empty(x.shape()), Tensor::Empty({rows}), Tensor::Empty({rows})};
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x.data<float>() + row * c;
    auto sum = [&](const Term& f) { return tree ? TreeSum(c, 256, f) : SeqSum(c, f); };
    const float mu = LayerNormMean(sum([&](int64_t i) { return xr[i]; }), c);
    const float rs =
        LayerNormRstd(sum([&](int64_t i) { return LayerNormCentredSquare(xr[i], mu); }), c, eps);
    for (int64_t i = 0; i < c; ++i) {
      r.out.data<float>()[row * c + i] =
          LayerNormOut(xr[i], mu, rs, w.data<float>()[i], b.data<float>()[i]);
    }
    r.mean.data<float>()[row] = mu;
    r.rstd.data<float>()[row] = rs;
  }
  return r;
}

TEST_F(RowsMath, LayerNormForward) {
  // Rows offset from zero (mean 3) so that the centred second pass matters.
  const Tensor x = RandomTensor({9, 200}, rng_, 2.f, 4.f);
  const Tensor w = RandomTensor({200}, rng_), b = RandomTensor({200}, rng_);
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    LnOut cpu{Tensor::Empty({9, 200}), Tensor::Empty({9}), Tensor::Empty({9})};
    kernels::layernorm_forward.Get(Device::CPU())(x, w, b, 1e-5f, cpu.out, cpu.mean, cpu.rstd);
    if (!simd) {
      const LnOut seq = LayerNormMath(x, w, b, 1e-5f, false);
      EXPECT_TRUE(BitEqual(seq.out, cpu.out));
      EXPECT_TRUE(BitEqual(seq.mean, cpu.mean));
      EXPECT_TRUE(BitEqual(seq.rstd, cpu.rstd));
    }
    // Tree order vs either CPU path: the sums of 200 values of ~3 differ by a few ulp of the
    // sum, i.e. ~1e-6 relative in mean and rstd; outputs (|out| ~ 2) then by ~1e-5 absolute
    // (xhat's error is the mean's absolute error, 3e-6, times rstd ~ 1.7, times |w| <= 1).
    // Enforced: mean, rstd 2e-6 relative; out 2e-5 absolute + 1e-5 relative.
    const LnOut tree = LayerNormMath(x, w, b, 1e-5f, true);
    EXPECT_TRUE(AllClose(tree.mean, cpu.mean, 0.f, 2e-6f)) << "simd=" << simd;
    EXPECT_TRUE(AllClose(tree.rstd, cpu.rstd, 0.f, 2e-6f)) << "simd=" << simd;
    EXPECT_TRUE(AllClose(tree.out, cpu.out, 2e-5f, 1e-5f)) << "simd=" << simd;
  }
}

TEST_F(RowsMath, LayerNormBackward) {
  const int64_t rows = 37, c = 96;
  const Tensor x = RandomTensor({rows, c}, rng_, -2.f, 2.f), g = RandomTensor({rows, c}, rng_);
  const Tensor w = RandomTensor({c}, rng_), b = RandomTensor({c}, rng_);
  LnOut fwd{Tensor::Empty({rows, c}), Tensor::Empty({rows}), Tensor::Empty({rows})};
  kernels::layernorm_forward.Get(Device::CPU())(x, w, b, 1e-5f, fwd.out, fwd.mean, fwd.rstd);
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    Tensor dx = Tensor::Empty({rows, c}), dw = Tensor::Zeros({c}), db = Tensor::Zeros({c});
    kernels::layernorm_backward.Get(Device::CPU())(g, x, w, fwd.mean, fwd.rstd, dx, dw, db);
    for (bool tree : {false, true}) {
      Tensor mdx = Tensor::Empty({rows, c}), mdw = Tensor::Zeros({c}), mdb = Tensor::Zeros({c});
      for (int64_t r = 0; r < rows; ++r) {
        const float* gr = g.data<float>() + r * c;
        const float* xr = x.data<float>() + r * c;
        const float mu = fwd.mean.data<float>()[r], rs = fwd.rstd.data<float>()[r];
        const float* pw = w.data<float>();
        const Term dn = [&](int64_t i) { return gr[i] * pw[i]; };
        const Term dnx = [&](int64_t i) { return gr[i] * pw[i] * LayerNormXhat(xr[i], mu, rs); };
        const float sdn = tree ? TreeSum(c, 32, dn) : SeqSum(c, dn);
        const float sdnx = tree ? TreeSum(c, 32, dnx) : SeqSum(c, dnx);
        for (int64_t i = 0; i < c; ++i) {
          mdx.data<float>()[r * c + i] = LayerNormDx(gr[i], pw[i], LayerNormXhat(xr[i], mu, rs),
                                                     sdn / float(c), sdnx / float(c), rs);
        }
      }
      // dweight, dbias: the CPU's 16 row slices, each summed in row order, then added in order
      // (the kernels sum all rows of a column in order instead; compared with tolerance).
      const int64_t slices = std::min<int64_t>(16, rows);
      for (int64_t i = 0; i < c; ++i) {
        float acc_w = 0, acc_b = 0;
        for (int64_t s = 0; s < slices; ++s) {
          float pw = 0, pb = 0;
          for (int64_t r = rows * s / slices; r < rows * (s + 1) / slices; ++r) {
            const float gi = g.data<float>()[r * c + i];
            pw += gi * LayerNormXhat(x.data<float>()[r * c + i], fwd.mean.data<float>()[r],
                                     fwd.rstd.data<float>()[r]);
            pb += gi;
          }
          acc_w += pw;
          acc_b += pb;
        }
        mdw.data<float>()[i] = acc_w;
        mdb.data<float>()[i] = acc_b;
      }
      if (!simd && !tree) {
        EXPECT_TRUE(BitEqual(mdx, dx));
        EXPECT_TRUE(BitEqual(mdw, dw));
        EXPECT_TRUE(BitEqual(mdb, db));
      }
      // dx = (dn - mean(dn) - xhat mean(dn xhat)) rstd, where the row means of O(1) terms over
      // 96 elements differ by a few ulp of their O(10) sums between orders (and AVX2's FMAs);
      // dx ~ 1, so 1e-5 absolute + 1e-5 relative (~100 ulp of the sums' error after / C).
      EXPECT_TRUE(AllClose(mdx, dx, 1e-5f, 1e-5f)) << "simd=" << simd << " tree=" << tree;
      EXPECT_TRUE(AllClose(mdw, dw, 1e-5f, 1e-5f)) << "simd=" << simd << " tree=" << tree;
      EXPECT_TRUE(AllClose(mdb, db, 1e-5f, 1e-5f)) << "simd=" << simd << " tree=" << tree;
    }
  }
}

// ---- Softmax and cross-entropy ---------------------------------------------------------------

// probs of each row of x [n, c]: two passes (max, then sum of exp) in sequential order, or the
// kernels' online state in tree order; both then exp(x - m) * (1 / s).
Tensor SoftmaxMath(const Tensor& x, bool tree, std::vector<MaxSum>* states = nullptr) {
  const int64_t c = x.size(-1), n = x.numel() / c;
  Tensor p = Tensor::Empty(x.shape());
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.data<float>() + r * c;
    MaxSum st;
    if (tree) {
      st = TreeMaxSum(xr, c, 256);
    } else {
      st.m = *std::max_element(xr, xr + c);
      st.s = SeqSum(c, [&](int64_t i) { return expf(xr[i] - st.m); });
    }
    for (int64_t i = 0; i < c; ++i) p.data<float>()[r * c + i] = SoftmaxProb(xr[i], st, 1.0f / st.s);
    if (states) states->push_back(st);
  }
  return p;
}

TEST_F(RowsMath, SoftmaxForwardAndBackward) {
  const Tensor x = RandomTensor({7, 1000}, rng_, -8.f, 8.f), dy = RandomTensor({7, 1000}, rng_);
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    Tensor y = Tensor::Empty({7, 1000}), dx = Tensor::Empty({7, 1000});
    kernels::softmax_forward.Get(Device::CPU())(x, y);
    kernels::softmax_backward.Get(Device::CPU())(y, dy, dx);
    Tensor mdx = Tensor::Empty({7, 1000});
    for (int64_t r = 0; r < 7; ++r) {
      const float* yr = y.data<float>() + r * 1000;
      const float* gr = dy.data<float>() + r * 1000;
      const float dot = SeqSum(1000, [&](int64_t i) { return gr[i] * yr[i]; });
      for (int64_t i = 0; i < 1000; ++i) mdx.data<float>()[r * 1000 + i] = SoftmaxGrad(yr[i], gr[i], dot);
    }
    if (!simd) {
      EXPECT_TRUE(BitEqual(SoftmaxMath(x, false), y));
      EXPECT_TRUE(BitEqual(mdx, dx));
    }
    // The online state rescales partial sums by exp(m_old - m_new): each probability differs
    // from the two-pass one by a few roundings of s (and AVX2's exp by ~2 ulp). Enforced: 2e-6
    // relative + 1e-12 absolute on probabilities (<= 1), 1e-6 absolute + 1e-5 relative on dx.
    EXPECT_TRUE(AllClose(SoftmaxMath(x, true), y, 1e-12f, 2e-6f)) << "simd=" << simd;
    EXPECT_TRUE(AllClose(mdx, dx, 1e-6f, 1e-5f)) << "simd=" << simd;
  }
}

TEST_F(RowsMath, OnlineStateMergesInAnyOrder) {
  // Known answer: values 0 and log(3) have max log(3) and sum 1 + 1/3, whichever comes first.
  const float l3 = std::log(3.0f);
  for (MaxSum st : {MaxSumPush(MaxSumPush(MaxSumEmpty(), 0.f), l3),
                    MaxSumPush(MaxSumPush(MaxSumEmpty(), l3), 0.f),
                    MaxSumMerge(MaxSumPush(MaxSumEmpty(), 0.f), MaxSumPush(MaxSumEmpty(), l3)),
                    MaxSumMerge(MaxSumEmpty(), MaxSumPush(MaxSumPush(MaxSumEmpty(), l3), 0.f))}) {
    EXPECT_EQ(st.m, l3);
    EXPECT_NEAR(st.s, 4.0f / 3.0f, 2e-7f);  // one rounding of exp and of the add
  }
  EXPECT_EQ(MaxSumMerge(MaxSumEmpty(), MaxSumEmpty()).m, -INFINITY);
}

TEST_F(RowsMath, CrossEntropyForwardAndBackward) {
  const int64_t n = 11, v = 777;
  const Tensor logits = RandomTensor({n, v}, rng_, -6.f, 6.f);
  const Tensor targets = RandomIds(n, v, rng_, 4);
  const Tensor dloss = RandomTensor({n}, rng_);
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    Tensor losses = Tensor::Empty({n}), probs = Tensor::Empty({n, v}), dl = Tensor::Empty({n, v});
    kernels::cross_entropy_forward.Get(Device::CPU())(logits, targets, losses, probs);
    kernels::cross_entropy_backward.Get(Device::CPU())(probs, targets, dloss, dl);
    for (bool tree : {false, true}) {
      std::vector<MaxSum> states;
      const Tensor p = SoftmaxMath(logits, tree, &states);
      Tensor ml = Tensor::Empty({n}), mdl = Tensor::Empty({n, v});
      for (int64_t r = 0; r < n; ++r) {
        const int32_t t = targets.data<int32_t>()[r];
        ml.data<float>()[r] =
            CrossEntropyLoss(states[size_t(r)], t < 0 ? 0.f : logits.data<float>()[r * v + t], t);
        for (int64_t i = 0; i < v; ++i) {
          mdl.data<float>()[r * v + i] =
              CrossEntropyGrad(probs.data<float>()[r * v + i], i, t, dloss.data<float>()[r]);
        }
      }
      if (!simd && !tree) {
        EXPECT_TRUE(BitEqual(ml, losses));
        EXPECT_TRUE(BitEqual(p, probs));
      }
      // The gradient takes the CPU's probabilities: same formula, same inputs, exact.
      EXPECT_TRUE(BitEqual(mdl, dl)) << "simd=" << simd;
      // Losses ~ log(777) ~ 7: the log of a sum off by a few roundings, 1e-5 relative.
      EXPECT_TRUE(AllClose(ml, losses, 1e-6f, 1e-5f)) << "simd=" << simd << " tree=" << tree;
      EXPECT_TRUE(AllClose(p, probs, 1e-12f, 2e-6f)) << "simd=" << simd << " tree=" << tree;
    }
  }
}

// ---- Attention -----------------------------------------------------------------------------

// The documented CUDA attention (kernels/attention.cu), per (batch, head, query row): scores by
// sequential dot products over D, the softmax's max and sum by `sum` (sequential or tree), the
// output and gradients by sequential sums over keys or queries; dk and dv per (K/V head, key
// row), adding the group's query heads in order. Operands as the kernels take them: element
// (b, t, head, d) of q/dq at q[(b T + t) q_ld + head D + d], of k/v/dk/dv with kv_ld, of
// out/dout with o_ld; query head h reads K/V head h / (H / Hkv).
struct AttnLayout {
  int64_t B, T, H, Hkv, D, q_ld, kv_ld, o_ld;
};

void AttentionKernelMath(const AttnLayout& l, const float* q_all, const float* k_all,
                         const float* v_all, const float* dout, bool tree, float* out, float* att,
                         float* dq, float* dk_all, float* dv_all) {
  const int64_t T = l.T, D = l.D, group = l.H / l.Hkv;
  const float scale = float(1.0 / std::sqrt(double(D)));
  auto sum = [&](int64_t n, const Term& f) { return tree ? TreeSum(n, 128, f) : SeqSum(n, f); };
  std::vector<float> ds(size_t(l.B * l.H * T * T));
  for (int64_t b = 0; b < l.B; ++b) {
    for (int64_t h = 0; h < l.H; ++h) {
      const int64_t g = h / group;
      auto q = [&](int64_t t, int64_t d) { return q_all[(b * T + t) * l.q_ld + h * D + d]; };
      auto k = [&](int64_t t, int64_t d) { return k_all[(b * T + t) * l.kv_ld + g * D + d]; };
      auto v = [&](int64_t t, int64_t d) { return v_all[(b * T + t) * l.kv_ld + g * D + d]; };
      auto go = [&](int64_t t, int64_t d) { return dout[(b * T + t) * l.o_ld + h * D + d]; };
      float* a = att + (b * l.H + h) * T * T;
      float* dsh = ds.data() + (b * l.H + h) * T * T;
      for (int64_t i = 0; i < T; ++i) {
        float* row = a + i * T;
        float m = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if (!AttentionVisible(i, j)) {
            row[j] = 0;
            continue;
          }
          row[j] = AttentionScore(SeqSum(D, [&](int64_t d) { return q(i, d) * k(j, d); }), scale);
          m = std::max(m, row[j]);
        }
        for (int64_t j = 0; j <= i; ++j) row[j] = expf(row[j] - m);
        const float s = sum(i + 1, [&](int64_t j) { return row[j]; });
        for (int64_t j = 0; j <= i; ++j) row[j] *= 1.0f / s;
        for (int64_t d = 0; d < D; ++d) {
          out[(b * T + i) * l.o_ld + h * D + d] =
              SeqSum(i + 1, [&](int64_t j) { return row[j] * v(j, d); });
        }
        // Backward, first kernel: ds row and dq.
        std::vector<float> dp(size_t(i + 1));
        for (int64_t j = 0; j <= i; ++j) {
          dp[size_t(j)] = SeqSum(D, [&](int64_t d) { return go(i, d) * v(j, d); });
        }
        const float dot = sum(i + 1, [&](int64_t j) { return row[j] * dp[size_t(j)]; });
        for (int64_t j = 0; j < T; ++j) {
          dsh[i * T + j] = j <= i ? AttentionDScore(row[j], dp[size_t(j)], dot, scale) : 0.f;
        }
        for (int64_t d = 0; d < D; ++d) {
          dq[(b * T + i) * l.q_ld + h * D + d] =
              SeqSum(i + 1, [&](int64_t j) { return dsh[i * T + j] * k(j, d); });
        }
      }
    }
    // Second kernel: dk and dv per (K/V head, key row j), over the group's heads, then queries
    // i >= j.
    for (int64_t g = 0; g < l.Hkv; ++g) {
      for (int64_t j = 0; j < T; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          float dk = 0, dv = 0;
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            const float* a = att + (b * l.H + h) * T * T;
            const float* dsh = ds.data() + (b * l.H + h) * T * T;
            for (int64_t i = j; i < T; ++i) {
              dk += dsh[i * T + j] * q_all[(b * T + i) * l.q_ld + h * D + d];
              dv += a[i * T + j] * dout[(b * T + i) * l.o_ld + h * D + d];
            }
          }
          dk_all[(b * T + j) * l.kv_ld + g * D + d] = dk;
          dv_all[(b * T + j) * l.kv_ld + g * D + d] = dv;
        }
      }
    }
  }
}

// GPT's packed qkv [B, T, 3C]: q, k, v at offsets 0, C, 2C, rows 3C apart.
void AttentionMath(const Tensor& qkv, int n_head, const Tensor& dout, bool tree, Tensor& out,
                   Tensor& att, Tensor& dqkv) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = n_head;
  const float* p = qkv.data<float>();
  float* d = dqkv.data<float>();
  AttentionKernelMath({B, T, H, H, C / H, 3 * C, 3 * C, C}, p, p + C, p + 2 * C,
                      dout.data<float>(), tree, out.data<float>(), att.data<float>(), d, d + C,
                      d + 2 * C);
}

TEST_F(RowsMath, AttentionForwardAndBackward) {
  const int64_t B = 2, T = 19, H = 3, D = 8, C = H * D;
  const Tensor qkv = RandomTensor({B, T, 3 * C}, rng_, -2.f, 2.f);
  const Tensor dout = RandomTensor({B, T, C}, rng_);
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    Tensor out = Tensor::Empty({B, T, C}), att = Tensor::Empty({B, H, T, T});
    Tensor dqkv = Tensor::Empty({B, T, 3 * C});
    kernels::attention_forward.Get(Device::CPU())(qkv, int(H), out, att);
    kernels::attention_backward.Get(Device::CPU())(dout, qkv, att, int(H), dqkv);
    for (bool tree : {false, true}) {
      Tensor mout = Tensor::Empty({B, T, C}), matt = Tensor::Empty({B, H, T, T});
      Tensor mdqkv = Tensor::Empty({B, T, 3 * C});
      AttentionMath(qkv, int(H), dout, tree, mout, matt, mdqkv);
      if (!simd && !tree) {
        EXPECT_TRUE(BitEqual(matt, att));
        EXPECT_TRUE(BitEqual(mout, out));
        // The CPU's blocked products add exact zeros above the diagonal; a zero added to a
        // sum can only change -0 to +0, which the tolerance check below covers.
      }
      // Probabilities: the softmax sum's order and AVX2's exp/FMA dot products, ~2 ulp each,
      // amplified by exp of scores ~ |q||k| scale ~ 3: 1e-6 absolute + 1e-5 relative. Outputs
      // and gradients are sums of up to 19 such terms of O(1): 1e-5 absolute + 1e-4 relative.
      EXPECT_TRUE(AllClose(matt, att, 1e-6f, 1e-5f)) << "simd=" << simd << " tree=" << tree;
      EXPECT_TRUE(AllClose(mout, out, 1e-5f, 1e-4f)) << "simd=" << simd << " tree=" << tree;
      EXPECT_TRUE(AllClose(mdqkv, dqkv, 1e-5f, 1e-4f)) << "simd=" << simd << " tree=" << tree;
    }
  }
}

// The same kernels as the gqa_* slots run them (4 query heads over 2 K/V heads, q [B, T, H, D],
// k and v [B, T, Hkv, D]) against the CPU's grouped-query attention, to the tolerances above.
TEST_F(RowsMath, GroupedQueryAttentionForwardAndBackward) {
  const int64_t B = 2, T = 19, H = 4, Hkv = 2, D = 8;
  const Tensor q = RandomTensor({B, T, H, D}, rng_, -2.f, 2.f);
  const Tensor k = RandomTensor({B, T, Hkv, D}, rng_, -2.f, 2.f);
  const Tensor v = RandomTensor({B, T, Hkv, D}, rng_);
  const Tensor dout = RandomTensor({B, T, H, D}, rng_);
  Tensor out = Tensor::Empty({B, T, H, D}), att = Tensor::Empty({B, H, T, T});
  Tensor dq = Tensor::Empty(q.shape()), dk = Tensor::Empty(k.shape());
  Tensor dv = Tensor::Empty(v.shape());
  kernels::gqa_forward.Get(Device::CPU())(q, k, v, out, att);
  kernels::gqa_backward.Get(Device::CPU())(dout, q, k, v, att, dq, dk, dv);
  for (bool tree : {false, true}) {
    Tensor mout = Tensor::Empty(out.shape()), matt = Tensor::Empty(att.shape());
    Tensor mdq = Tensor::Empty(q.shape()), mdk = Tensor::Empty(k.shape());
    Tensor mdv = Tensor::Empty(v.shape());
    AttentionKernelMath({B, T, H, Hkv, D, H * D, Hkv * D, H * D}, q.data<float>(),
                        k.data<float>(), v.data<float>(), dout.data<float>(), tree,
                        mout.data<float>(), matt.data<float>(), mdq.data<float>(),
                        mdk.data<float>(), mdv.data<float>());
    EXPECT_TRUE(AllClose(matt, att, 1e-6f, 1e-5f)) << "tree=" << tree;
    EXPECT_TRUE(AllClose(mout, out, 1e-5f, 1e-4f)) << "tree=" << tree;
    EXPECT_TRUE(AllClose(mdq, dq, 1e-5f, 1e-4f)) << "tree=" << tree;
    EXPECT_TRUE(AllClose(mdk, dk, 1e-5f, 1e-4f)) << "tree=" << tree;
    EXPECT_TRUE(AllClose(mdv, dv, 1e-5f, 1e-4f)) << "tree=" << tree;
  }
}

}  // namespace
}  // namespace braid::cuda::math
