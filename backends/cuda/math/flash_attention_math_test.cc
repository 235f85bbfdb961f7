// The fused attention's tile math (flash_attention.h) run on the host in the CUDA kernel's
// order (attention_flash.cu: a warp per row, one key or query per lane and tile, the tile's max
// and sum by xor butterflies, the output accumulated over the tile's lanes in order) against a
// naive causal attention in double precision: forward output, the kept log-sum-exp, and the
// backward's dq, dk, dv. Sequence lengths that are not a multiple of the tile, a single token,
// and scores large enough that exp() overflows without the running maximum.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/math/flash_attention.h"
#include "gtest/gtest.h"

namespace braid::cuda::math {
namespace {

constexpr int kLanes = kFlashTile;

// A warp's xor butterfly (offsets 16 .. 1), every lane ending with the same result.
template <typename Op>
float Butterfly(std::vector<float> v, Op op) {
  for (int off = kLanes / 2; off >= 1; off /= 2) {
    std::vector<float> w(kLanes);
    for (int l = 0; l < kLanes; ++l) w[size_t(l)] = op(v[size_t(l)], v[size_t(l ^ off)]);
    v = w;
  }
  return v[0];
}
float WarpSum(const std::vector<float>& v) {
  return Butterfly(v, [](float a, float b) { return a + b; });
}
float WarpMax(const std::vector<float>& v) {
  return Butterfly(v, [](float a, float b) { return a > b ? a : b; });
}

struct Problem {
  int64_t B, H, T, D;
  int64_t C() const { return H * D; }
  float Scale() const { return float(1.0 / std::sqrt(double(D))); }
};

// qkv [B, T, 3C], out/dout [B, T, C], lse [B, H, T], dqkv [B, T, 3C].
struct Tensors {
  std::vector<float> out, lse, dqkv;
};

int64_t Q(const Problem& p, int64_t b, int64_t t, int64_t w, int64_t h, int64_t d) {
  return FlashQkvIndex(b, t, w, h, d, p.T, p.C(), p.D);
}
int64_t O(const Problem& p, int64_t b, int64_t t, int64_t h, int64_t d) {
  return FlashOutIndex(b, t, h, d, p.T, p.C(), p.D);
}

// The reference: causal softmax attention and its gradient, in double, two passes per row.
struct Reference {
  std::vector<double> out, lse, dqkv;
};
Reference Naive(const Problem& p, const std::vector<float>& qkv, const std::vector<float>& dout) {
  Reference r;
  r.out.assign(size_t(p.B * p.T * p.C()), 0);
  r.lse.assign(size_t(p.B * p.H * p.T), 0);
  r.dqkv.assign(qkv.size(), 0);
  const double scale = 1.0 / std::sqrt(double(p.D));
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.H; ++h) {
      std::vector<double> P(size_t(p.T * p.T), 0), dS(size_t(p.T * p.T), 0);
      for (int64_t i = 0; i < p.T; ++i) {
        std::vector<double> s(size_t(i + 1));
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < p.D; ++d) dot += double(qkv[Q(p, b, i, 0, h, d)]) * qkv[Q(p, b, j, 1, h, d)];
          s[size_t(j)] = dot * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[size_t(j)] - mx);
        r.lse[size_t((b * p.H + h) * p.T + i)] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) P[size_t(i * p.T + j)] = std::exp(s[size_t(j)] - mx) / sum;
        for (int64_t d = 0; d < p.D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += P[size_t(i * p.T + j)] * qkv[Q(p, b, j, 2, h, d)];
          r.out[size_t(O(p, b, i, h, d))] = acc;
        }
      }
      for (int64_t i = 0; i < p.T; ++i) {
        std::vector<double> dp(size_t(i + 1));
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double v = 0;
          for (int64_t d = 0; d < p.D; ++d) v += double(dout[size_t(O(p, b, i, h, d))]) * qkv[Q(p, b, j, 2, h, d)];
          dp[size_t(j)] = v;
          dot += P[size_t(i * p.T + j)] * v;
        }
        for (int64_t j = 0; j <= i; ++j) {
          dS[size_t(i * p.T + j)] = P[size_t(i * p.T + j)] * (dp[size_t(j)] - dot) * scale;
        }
      }
      for (int64_t i = 0; i < p.T; ++i) {
        for (int64_t d = 0; d < p.D; ++d) {
          double dq = 0, dk = 0, dv = 0;
          for (int64_t j = 0; j <= i; ++j) dq += dS[size_t(i * p.T + j)] * qkv[Q(p, b, j, 1, h, d)];
          for (int64_t k = i; k < p.T; ++k) {  // i as a key: the queries k >= i that see it
            dk += dS[size_t(k * p.T + i)] * qkv[Q(p, b, k, 0, h, d)];
            dv += P[size_t(k * p.T + i)] * dout[size_t(O(p, b, k, h, d))];
          }
          r.dqkv[size_t(Q(p, b, i, 0, h, d))] = dq;
          r.dqkv[size_t(Q(p, b, i, 1, h, d))] = dk;
          r.dqkv[size_t(Q(p, b, i, 2, h, d))] = dv;
        }
      }
    }
  }
  return r;
}

// The last key tile the kernel's block holding query row i runs (its last row's).
int64_t BlockLastTile(const Problem& p, int64_t i) {
  const int64_t last_row = std::min(p.T - 1, (i / kFlashRowsPerBlock + 1) * kFlashRowsPerBlock - 1);
  return last_row / kLanes;
}

// The kernel's order. Forward: per query row, key tiles of kLanes; lane l scores key
// tile * kLanes + l (a sequential dot over d), the tile's max and sum by butterflies, then each
// output element accumulates the tile's lanes in order.
Tensors Flash(const Problem& p, const std::vector<float>& qkv, const std::vector<float>& dout) {
  Tensors r;
  r.out.assign(size_t(p.B * p.T * p.C()), 0);
  r.lse.assign(size_t(p.B * p.H * p.T), 0);
  r.dqkv.assign(qkv.size(), 0);
  const float scale = p.Scale();
  const int64_t tiles = (p.T + kLanes - 1) / kLanes;
  auto score = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    float dot = 0;
    if (FlashVisible(i, j, p.T)) {
      for (int64_t d = 0; d < p.D; ++d) dot += qkv[size_t(Q(p, b, i, 0, h, d))] * qkv[size_t(Q(p, b, j, 1, h, d))];
    }
    return FlashScore(dot, scale, FlashVisible(i, j, p.T));
  };
  auto dp_of = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    float dp = 0;
    if (FlashVisible(i, j, p.T)) {
      for (int64_t d = 0; d < p.D; ++d) dp += dout[size_t(O(p, b, i, h, d))] * qkv[size_t(Q(p, b, j, 2, h, d))];
    }
    return dp;
  };
  std::vector<float> delta(size_t(p.B * p.H * p.T));
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t bh = b * p.H + h;
      for (int64_t i = 0; i < p.T; ++i) {
        FlashRow row = FlashRowStart();
        std::vector<float> acc(size_t(p.D), 0.f);
        // Tiles past row i's diagonal (its block's later rows') are fully masked for it.
        const int64_t last_tile = BlockLastTile(p, i);
        for (int64_t t = 0; t <= last_tile; ++t) {
          std::vector<float> s(kLanes), e(kLanes);
          for (int l = 0; l < kLanes; ++l) s[size_t(l)] = score(b, h, i, t * kLanes + l);
          const float alpha = FlashRescale(&row, WarpMax(s));
          for (int l = 0; l < kLanes; ++l) e[size_t(l)] = FlashTileProb(s[size_t(l)], row);
          FlashAddMass(&row, WarpSum(e));
          for (int64_t d = 0; d < p.D; ++d) {
            float a = acc[size_t(d)] * alpha;
            for (int l = 0; l < kLanes; ++l) {
              const int64_t j = std::min(t * kLanes + l, p.T - 1);  // zero-weighted when masked
              a += e[size_t(l)] * qkv[size_t(Q(p, b, j, 2, h, d))];
            }
            acc[size_t(d)] = a;
          }
        }
        for (int64_t d = 0; d < p.D; ++d) r.out[size_t(O(p, b, i, h, d))] = FlashOutput(acc[size_t(d)], row);
        r.lse[size_t(bh * p.T + i)] = FlashLogSumExp(row);
      }
      // delta_i = dout_i . out_i: per-lane strided partials over d, then a butterfly.
      for (int64_t i = 0; i < p.T; ++i) {
        std::vector<float> part(kLanes, 0.f);
        for (int64_t d = 0; d < p.D; ++d) {
          part[size_t(d % kLanes)] += dout[size_t(O(p, b, i, h, d))] * r.out[size_t(O(p, b, i, h, d))];
        }
        delta[size_t(bh * p.T + i)] = WarpSum(part);
      }
      // dq: per query row, key tiles (as the forward).
      for (int64_t i = 0; i < p.T; ++i) {
        const float lse = r.lse[size_t(bh * p.T + i)], dl = delta[size_t(bh * p.T + i)];
        std::vector<float> dq(size_t(p.D), 0.f);
        for (int64_t t = 0; t <= BlockLastTile(p, i); ++t) {
          std::vector<float> ds(kLanes);
          for (int l = 0; l < kLanes; ++l) {
            const int64_t j = t * kLanes + l;
            const float pr = FlashRecomputedProb(score(b, h, i, j), lse);
            ds[size_t(l)] = FlashDScore(pr, dp_of(b, h, i, j), dl, scale);
          }
          for (int64_t d = 0; d < p.D; ++d) {
            for (int l = 0; l < kLanes; ++l) {
              const int64_t j = std::min(t * kLanes + l, p.T - 1);
              dq[size_t(d)] += ds[size_t(l)] * qkv[size_t(Q(p, b, j, 1, h, d))];
            }
          }
        }
        for (int64_t d = 0; d < p.D; ++d) r.dqkv[size_t(Q(p, b, i, 0, h, d))] = dq[size_t(d)];
      }
      // dk, dv: per key row j, query tiles from j's.
      for (int64_t j = 0; j < p.T; ++j) {
        std::vector<float> dk(size_t(p.D), 0.f), dv(size_t(p.D), 0.f);
        for (int64_t t = j / kLanes; t < tiles; ++t) {
          std::vector<float> pr(kLanes), ds(kLanes);
          for (int l = 0; l < kLanes; ++l) {
            const int64_t i = t * kLanes + l;
            const int64_t ic = std::min(i, p.T - 1);
            pr[size_t(l)] = FlashRecomputedProb(score(b, h, i, j), r.lse[size_t(bh * p.T + ic)]);
            ds[size_t(l)] = FlashDScore(pr[size_t(l)], dp_of(b, h, i, j), delta[size_t(bh * p.T + ic)], scale);
          }
          for (int64_t d = 0; d < p.D; ++d) {
            for (int l = 0; l < kLanes; ++l) {
              const int64_t i = std::min(t * kLanes + l, p.T - 1);
              dk[size_t(d)] += ds[size_t(l)] * qkv[size_t(Q(p, b, i, 0, h, d))];
              dv[size_t(d)] += pr[size_t(l)] * dout[size_t(O(p, b, i, h, d))];
            }
          }
        }
        for (int64_t d = 0; d < p.D; ++d) {
          r.dqkv[size_t(Q(p, b, j, 1, h, d))] = dk[size_t(d)];
          r.dqkv[size_t(Q(p, b, j, 2, h, d))] = dv[size_t(d)];
        }
      }
    }
  }
  return r;
}

// |got - want| <= atol + rtol |want|, written so that a NaN fails.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double atol,
                 double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::abs(want[i])) && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::vector<float> Uniform(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Tolerances: the f32 tile order against exact double sums over at most T = 70 terms of O(1)
// with D <= 64 products per dot: forward 2e-5 absolute + 1e-4 relative, the log-sum-exp 1e-5
// relative, gradients (one more product chain, ds's cancellation dp - delta) 1e-4 + 1e-4.
void Check(const Problem& p, float qk_range, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> qkv = Uniform(size_t(p.B * p.T * 3 * p.C()), -1.f, 1.f, rng);
  // Queries and keys spread over +-qk_range: large ranges make the scores exceed exp()'s f32
  // range (88), which only the running maximum survives.
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t t = 0; t < p.T; ++t) {
      for (int64_t c = 0; c < 2 * p.C(); ++c) qkv[size_t((b * p.T + t) * 3 * p.C() + c)] *= qk_range;
    }
  }
  const std::vector<float> dout = Uniform(size_t(p.B * p.T * p.C()), -1.f, 1.f, rng);
  const Reference want = Naive(p, qkv, dout);
  const Tensors got = Flash(p, qkv, dout);
  const std::string tag = "B=" + std::to_string(p.B) + " H=" + std::to_string(p.H) +
                          " T=" + std::to_string(p.T) + " D=" + std::to_string(p.D) +
                          " range=" + std::to_string(qk_range) + " ";
  ExpectClose(got.out, want.out, 2e-5, 1e-4, tag + "out");
  ExpectClose(got.lse, want.lse, 0, 1e-5, tag + "lse");
  // Gradients scale with the scores' range (ds ~ p dp scale, dk ~ ds q).
  const double g = std::max(1.0, double(qk_range) * qk_range);
  ExpectClose(got.dqkv, want.dqkv, 1e-4 * g, 1e-4, tag + "dqkv");
}

TEST(FlashAttentionMath, MatchesNaiveDoubleAttentionForwardAndBackward) {
  Check({2, 3, 37, 16}, 1.f, 1);   // T not a multiple of the tile, two tiles
  Check({1, 2, 70, 64}, 1.f, 2);   // three tiles, the last one with 6 keys; GPT-2's head size
  Check({1, 1, 1, 8}, 1.f, 3);     // a single token
  Check({1, 2, 32, 24}, 1.f, 4);   // exactly one tile
  Check({1, 2, 33, 24}, 1.f, 5);   // one key into the second tile
}

TEST(FlashAttentionMath, LargeScoresStayFiniteAndExact) {
  // q.k up to 9^2 * 16 / 4 = 324 after scaling: exp() of that overflows f32.
  Check({1, 2, 45, 16}, 9.f, 6);
}

TEST(FlashAttentionMath, RescaleAndMaskingEdgeCases) {
  FlashRow r = FlashRowStart();
  // A tile with nothing visible leaves an empty state empty (no NaN from -inf - -inf).
  EXPECT_EQ(FlashRescale(&r, -INFINITY), 0.f);
  EXPECT_EQ(r.m, -INFINITY);
  EXPECT_EQ(r.l, 0.f);
  EXPECT_EQ(FlashTileProb(FlashScore(3.f, 1.f, false), r), 0.f);
  EXPECT_EQ(FlashRescale(&r, 2.f), 0.f);
  FlashAddMass(&r, FlashTileProb(2.f, r));  // exp(0) = 1
  EXPECT_EQ(r.l, 1.f);
  // A larger maximum rescales what is there: l = exp(2 - 5) (+ 1 for the new max itself).
  const float alpha = FlashRescale(&r, 5.f);
  EXPECT_FLOAT_EQ(alpha, std::exp(-3.f));
  FlashAddMass(&r, FlashTileProb(5.f, r));
  EXPECT_FLOAT_EQ(FlashLogSumExp(r), std::log(std::exp(2.f) + std::exp(5.f)));
  // A later, fully masked tile changes nothing.
  const FlashRow before = r;
  EXPECT_EQ(FlashRescale(&r, -INFINITY), 1.f);
  EXPECT_EQ(r.m, before.m);
  EXPECT_EQ(r.l, before.l);
  EXPECT_EQ(FlashRecomputedProb(-INFINITY, 0.f), 0.f);
  EXPECT_TRUE(FlashVisible(4, 4, 5));
  EXPECT_FALSE(FlashVisible(4, 5, 9));
  EXPECT_FALSE(FlashVisible(6, 5, 5));  // a query past the sequence (the last tile's padding)
}

}  // namespace
}  // namespace braid::cuda::math
