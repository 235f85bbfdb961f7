// The bf16/f16 row math of backends/cuda/math/rows.h (what kernels/nn.cu runs on half storage)
// against the CPU backend's bf16 and f16 kernels (backends/cpu/half_kernels.cc) on the same half
// inputs, NaN and infinities included:
//  - composed in the CPU's portable order (SIMD off): bit-identical, NaN matching NaN only;
//  - in the CUDA kernels' tree order (reduction_order.h; 32 threads a row, as for rows of up to
//    1024 columns, and 256), against both CPU paths (portable and AVX2): within the f32 kernels'
//    tolerance of rows_math_test.cc plus one unit in the last place of the format for a stored
//    output (two f32 values that far apart, each rounded to nearest, end at most one unit apart).
// The LayerNorm column sums and the embedding scatter-add run the CPU's own order on the GPU too,
// so they are compared bit for bit in every case.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
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
using cpu::testing::RandomIds;
using cpu::testing::RandomTensor;
using order::SeqSum;
using order::Term;
using order::TreeSum;

template <Format F>
const Stored<F>* In(const Tensor& t) {
  return static_cast<const Stored<F>*>(t.raw_data());
}
template <Format F>
Stored<F>* Out(Tensor& t) {
  return static_cast<Stored<F>*>(t.raw_data());
}

// Equal bits, where a NaN matches a NaN only (its payload depends on the operand order of the
// operation that made it); a NaN or an infinity on one side only is a difference.
::testing::AssertionResult SameValues(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.numel() != want.numel()) {
    return ::testing::AssertionFailure() << got.DescribeForError() << " vs "
                                         << want.DescribeForError();
  }
  const std::vector<float> g = got.ToFloatVector(), w = want.ToFloatVector();
  int64_t nans = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) && std::isnan(w[i])) {
      ++nans;
      continue;
    }
    if (FloatBits(g[i]) != FloatBits(w[i])) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << g[i] << ", want "
                                           << w[i];
    }
  }
  return ::testing::AssertionSuccess() << nans << " NaN";
}

// Stored outputs in the tree order: the f32 tolerance (atol + rtol |want|) plus one unit in the
// last place of the format, at most 2^-7 |want| for bf16 (8 significant bits) and 2^-10 |want|
// for f16 (11), or f16's subnormal spacing 2^-24. Non-finite values must match (AllClose).
::testing::AssertionResult CloseInFormat(DType dt, const Tensor& got, const Tensor& want,
                                         float atol, float rtol) {
  const bool bf16 = dt == DType::kBF16;
  return AllClose(got, want, atol + (bf16 ? 0.0f : 0x1p-24f), rtol + (bf16 ? 0x1p-7f : 0x1p-10f));
}

class RowsHalfMath : public ::testing::Test {
 protected:
  void TearDown() override { cpu::SetSimdEnabled(true); }
  std::mt19937 rng_{28};
};

std::string Where(DType dt, bool simd, int threads) {
  return std::string(DTypeName(dt)) + " simd=" + (simd ? "on" : "off") +
         " threads=" + std::to_string(threads);
}

// ---- LayerNorm ------------------------------------------------------------------------------

struct Ln {
  Tensor out, mean, rstd;
};

// threads == 0: the CPU's sequential sums; otherwise the kernels' tree over that many threads.
template <Format F>
Ln LayerNormMath(DType dt, const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                 int threads) {
  const int64_t c = w.numel(), rows = x.numel() / c;
  Ln r{Tensor::Empty(x.shape(), dt), Tensor::Empty({rows}), Tensor::Empty({rows})};
  const Stored<F>*px = In<F>(x), *pw = In<F>(w), *pb = In<F>(b);
  Stored<F>* po = Out<F>(r.out);
  for (int64_t row = 0; row < rows; ++row) {
    const Stored<F>* xr = px + row * c;
    auto sum = [&](const Term& f) { return threads ? TreeSum(c, threads, f) : SeqSum(c, f); };
    const float mu = LayerNormMean(sum([&](int64_t i) { return LoadF32<F>(xr[i]); }), c);
    const float rs = LayerNormRstd(
        sum([&](int64_t i) { return LayerNormCentredSquare(LoadF32<F>(xr[i]), mu); }), c, eps);
    for (int64_t i = 0; i < c; ++i) {
      po[row * c + i] = LayerNormOutStored<F>(xr[i], mu, rs, pw[i], pb[i]);
    }
    r.mean.data<float>()[row] = mu;
    r.rstd.data<float>()[row] = rs;
  }
  return r;
}

template <Format F>
void CheckLayerNormForward(DType dt, std::mt19937& rng) {
  const int64_t rows = 9, c = 200;
  // Rows offset from zero (mean 3) so that the centred second pass matters; row 1 holds a NaN,
  // row 2 an infinity (its mean is inf, x - mean NaN).
  Tensor xf = RandomTensor({rows, c}, rng, 2.f, 4.f);
  xf.data<float>()[1 * c + 17] = NAN;
  xf.data<float>()[2 * c + 5] = INFINITY;
  const Tensor x = xf.To(dt), w = RandomTensor({c}, rng).To(dt), b = RandomTensor({c}, rng).To(dt);
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    Ln cpu{Tensor::Empty({rows, c}, dt), Tensor::Empty({rows}), Tensor::Empty({rows})};
    kernels::layernorm_forward.Get(Device::CPU(), dt)(x, w, b, 1e-5f, cpu.out, cpu.mean, cpu.rstd);
    if (!simd) {
      const Ln seq = LayerNormMath<F>(dt, x, w, b, 1e-5f, 0);
      EXPECT_TRUE(SameValues(seq.out, cpu.out)) << DTypeName(dt);
      EXPECT_TRUE(SameValues(seq.mean, cpu.mean)) << DTypeName(dt);
      EXPECT_TRUE(SameValues(seq.rstd, cpu.rstd)) << DTypeName(dt);
    }
    // rows_math_test.cc's f32 bounds (mean, rstd 2e-6 relative; out 2e-5 + 1e-5 relative),
    // plus the format's unit on the stored out.
    for (int threads : {32, 256}) {
      const Ln tree = LayerNormMath<F>(dt, x, w, b, 1e-5f, threads);
      EXPECT_TRUE(AllClose(tree.mean, cpu.mean, 0.f, 2e-6f)) << Where(dt, simd, threads);
      EXPECT_TRUE(AllClose(tree.rstd, cpu.rstd, 0.f, 2e-6f)) << Where(dt, simd, threads);
      EXPECT_TRUE(CloseInFormat(dt, tree.out, cpu.out, 2e-5f, 1e-5f)) << Where(dt, simd, threads);
    }
  }
}

TEST_F(RowsHalfMath, LayerNormForward) {
  CheckLayerNormForward<Format::kBF16>(DType::kBF16, rng_);
  CheckLayerNormForward<Format::kF16>(DType::kF16, rng_);
}

// dweight/dbias as nn.cu's LayerNormDwDbKernel computes them: blocks of 32 columns by 16 row
// slices, pass 1 writing each (slice, column) sum into the block's shared array, pass 2 adding
// a column's slices in order.
template <Format F>
void LayerNormDwDbBlocked(const Stored<F>* g, const Stored<F>* x, const float* mean,
                          const float* rstd, int64_t rows, int64_t c, Stored<F>* dw,
                          Stored<F>* db) {
  constexpr int64_t kColumns = 32;
  const int64_t slices = LayerNormSliceCount(rows);
  for (int64_t block = 0; block * kColumns < c; ++block) {
    float pw[kLayerNormSlices][kColumns], pb[kLayerNormSlices][kColumns];
    for (int64_t s = 0; s < kLayerNormSlices; ++s) {  // the block's warps
      for (int64_t lane = 0; lane < kColumns; ++lane) {
        const int64_t i = block * kColumns + lane;
        if (i < c && s < slices) {
          LayerNormDwDbSlice<F>(g, x, mean, rstd, rows, c, i, s, slices, &pw[s][lane], &pb[s][lane]);
        }
      }
    }
    for (int64_t lane = 0; lane < kColumns; ++lane) {  // warp 0, after the barrier
      const int64_t i = block * kColumns + lane;
      if (i >= c) continue;
      dw[i] = AddSlicesStored<F>(dw[i], &pw[0][lane], slices, kColumns);
      db[i] = AddSlicesStored<F>(db[i], &pb[0][lane], slices, kColumns);
    }
  }
}

// rows 37: 16 uneven row slices for dweight/dbias; rows 5: fewer rows than slices; columns 96
// (three blocks of 32) and 45 (a partial block).
template <Format F>
void CheckLayerNormBackward(DType dt, std::mt19937& rng, int64_t rows = 37, int64_t c = 96) {
  SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(c));
  const Tensor x = RandomTensor({rows, c}, rng, -2.f, 2.f).To(dt);
  Tensor gf = RandomTensor({rows, c}, rng);
  gf.data<float>()[(5 % rows) * c + 7] = NAN;  // row 5's dx and column 7's dweight, dbias: NaN
  gf.data<float>()[(9 % rows) * c + 3] = INFINITY;
  const Tensor g = gf.To(dt);
  const Tensor w = RandomTensor({c}, rng).To(dt), b = RandomTensor({c}, rng).To(dt);
  // dweight and dbias are added into: start from values already there.
  const Tensor dw0 = RandomTensor({c}, rng).To(dt), db0 = RandomTensor({c}, rng).To(dt);
  Tensor out = Tensor::Empty({rows, c}, dt), mean = Tensor::Empty({rows}),
         rstd = Tensor::Empty({rows});
  kernels::layernorm_forward.Get(Device::CPU(), dt)(x, w, b, 1e-5f, out, mean, rstd);
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  const Stored<F>*px = In<F>(x), *pg = In<F>(g), *pw = In<F>(w);
  // The column sums: the same function the kernel's threads run.
  Tensor mdw = dw0.Clone(), mdb = db0.Clone();
  for (int64_t i = 0; i < c; ++i) {
    LayerNormDwDbColumn<F>(pg, px, pm, pr, rows, c, i, Out<F>(mdw), Out<F>(mdb));
  }
  // The GPU's blocked two passes: the same sums in the same order, so the same bits.
  Tensor bdw = dw0.Clone(), bdb = db0.Clone();
  LayerNormDwDbBlocked<F>(pg, px, pm, pr, rows, c, Out<F>(bdw), Out<F>(bdb));
  EXPECT_TRUE(SameValues(bdw, mdw)) << DTypeName(dt);
  EXPECT_TRUE(SameValues(bdb, mdb)) << DTypeName(dt);
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    Tensor dx = Tensor::Empty({rows, c}, dt), dw = dw0.Clone(), db = db0.Clone();
    kernels::layernorm_backward.Get(Device::CPU(), dt)(g, x, w, mean, rstd, dx, dw, db);
    for (int threads : {0, 32, 256}) {
      Tensor mdx = Tensor::Empty({rows, c}, dt);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r * c;
        const Term dn = [&](int64_t i) { return LayerNormDn<F>(pg[o + i], pw[i]); };
        const Term dnx = [&](int64_t i) {
          return LayerNormDnXhat<F>(pg[o + i], pw[i], px[o + i], pm[r], pr[r]);
        };
        const float sdn = threads ? TreeSum(c, threads, dn) : SeqSum(c, dn);
        const float sdnx = threads ? TreeSum(c, threads, dnx) : SeqSum(c, dnx);
        for (int64_t i = 0; i < c; ++i) {
          Out<F>(mdx)[o + i] = LayerNormDxStored<F>(pg[o + i], pw[i], px[o + i], pm[r], pr[r],
                                                    sdn / float(c), sdnx / float(c));
        }
      }
      if (!simd && threads == 0) {
        EXPECT_TRUE(SameValues(mdx, dx)) << DTypeName(dt);
      }
      // rows_math_test.cc's f32 bound on dx (1e-5 + 1e-5 relative), plus the format's unit.
      EXPECT_TRUE(CloseInFormat(dt, mdx, dx, 1e-5f, 1e-5f)) << Where(dt, simd, threads);
    }
    if (!simd) {
      EXPECT_TRUE(SameValues(mdw, dw)) << DTypeName(dt);
      EXPECT_TRUE(SameValues(mdb, db)) << DTypeName(dt);
    }
    // AVX2 contracts the products into FMAs: the f32 bound, plus the unit.
    EXPECT_TRUE(CloseInFormat(dt, mdw, dw, 1e-5f, 1e-5f)) << Where(dt, simd, 0);
    EXPECT_TRUE(CloseInFormat(dt, mdb, db, 1e-5f, 1e-5f)) << Where(dt, simd, 0);
  }
}

TEST_F(RowsHalfMath, LayerNormBackward) {
  CheckLayerNormBackward<Format::kBF16>(DType::kBF16, rng_);
  CheckLayerNormBackward<Format::kF16>(DType::kF16, rng_);
  CheckLayerNormBackward<Format::kBF16>(DType::kBF16, rng_, 5, 45);
  CheckLayerNormBackward<Format::kF16>(DType::kF16, rng_, 5, 45);
}

// ---- sum_rows (a Linear's bias gradient) ------------------------------------------------------

// SumRowsColumn, what the native half sum_rows runs per column, against the CPU's bf16/f16
// sum_rows (up-cast, the f32 kernel, one rounding): bit-identical with SIMD off; with AVX2 on,
// beta * out + sum is one FMA there (one rounding fewer), so within a unit of the format.
template <Format F>
void CheckSumRows(DType dt, std::mt19937& rng) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 96}, {1, 45}, {300, 17}}) {
    Tensor af = RandomTensor({rows, cols}, rng, -3.f, 3.f);
    af.data<float>()[(rows / 2) * cols + 3] = NAN;  // column 3 is NaN
    if (cols > 5) af.data<float>()[5] = -INFINITY;  // column 5 is -inf
    const Tensor a = af.To(dt);
    const Tensor out0 = RandomTensor({cols}, rng).To(dt);
    for (float beta : {0.0f, 0.5f, 1.0f}) {
      Tensor mine = out0.Clone();
      for (int64_t i = 0; i < cols; ++i) {
        Out<F>(mine)[i] = SumRowsColumn<F>(In<F>(a), rows, cols, i, In<F>(mine)[i], beta);
      }
      for (bool simd : {false, true}) {
        cpu::SetSimdEnabled(simd);
        Tensor want = out0.Clone();
        kernels::sum_rows.Get(Device::CPU(), dt)(a, want, beta);
        const std::string where = Where(dt, simd, 0) + " beta=" + std::to_string(beta) + " " +
                                  std::to_string(rows) + "x" + std::to_string(cols);
        if (!simd || beta == 0.0f) {
          EXPECT_TRUE(SameValues(mine, want)) << where;
        } else {
          EXPECT_TRUE(CloseInFormat(dt, mine, want, 0.f, 0.f)) << where;
        }
      }
      // The NaN column and the -inf column came through, so the comparison above could fail.
      const std::vector<float> v = mine.ToFloatVector();
      EXPECT_TRUE(std::isnan(v[3]));
      if (cols > 5) {
        EXPECT_EQ(v[5], -INFINITY);
      }
    }
  }
}

TEST_F(RowsHalfMath, SumRows) {
  CheckSumRows<Format::kBF16>(DType::kBF16, rng_);
  CheckSumRows<Format::kF16>(DType::kF16, rng_);
}

// ---- Softmax and cross-entropy ---------------------------------------------------------------

// The row's state: two passes (max, then the sum of exp) in sequential order, as the CPU, or the
// kernels' online state in tree order.
template <Format F>
MaxSum RowState(const Stored<F>* xr, int64_t c, int threads) {
  const Term v = [&](int64_t i) { return LoadF32<F>(xr[i]); };
  if (threads) return order::TreeMaxSum(c, threads, v);
  MaxSum st{-INFINITY, 0.0f};
  for (int64_t i = 0; i < c; ++i) st.m = v(i) > st.m ? v(i) : st.m;
  st.s = SeqSum(c, [&](int64_t i) { return expf(v(i) - st.m); });
  return st;
}

// A row of NaN (row 1), of +inf (row 2: every probability NaN, as the CPU's sum is), of -inf
// among finite values (row 3: probability 0, the first element included), all -inf (row 4).
Tensor LogitsWithNonFinite(int64_t rows, int64_t c, float range, std::mt19937& rng) {
  Tensor x = RandomTensor({rows, c}, rng, -range, range);
  float* p = x.data<float>();
  p[1 * c + 3] = NAN;
  p[2 * c + c / 2] = INFINITY;
  for (int64_t i : {int64_t(0), int64_t(10), c - 1}) p[3 * c + i] = -INFINITY;
  for (int64_t i = 0; i < c; ++i) p[4 * c + i] = -INFINITY;
  return x;
}

template <Format F>
void CheckSoftmax(DType dt, std::mt19937& rng) {
  const int64_t rows = 7, c = 1000;
  const Tensor x = LogitsWithNonFinite(rows, c, 8.f, rng).To(dt);
  const Tensor dy = RandomTensor({rows, c}, rng).To(dt);
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    Tensor y = Tensor::Empty({rows, c}, dt), dx = Tensor::Empty({rows, c}, dt);
    kernels::softmax_forward.Get(Device::CPU(), dt)(x, y);
    kernels::softmax_backward.Get(Device::CPU(), dt)(y, dy, dx);
    for (int threads : {0, 32, 256}) {
      Tensor my = Tensor::Empty({rows, c}, dt), mdx = Tensor::Empty({rows, c}, dt);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = r * c;
        const MaxSum st = RowState<F>(In<F>(x) + o, c, threads);
        for (int64_t i = 0; i < c; ++i) {
          Out<F>(my)[o + i] = SoftmaxProbStored<F>(In<F>(x)[o + i], st, 1.0f / st.s);
        }
        // The backward from the CPU's y, as the kernel would get it.
        const Term term = [&](int64_t i) {
          return SoftmaxDotTerm<F>(In<F>(y)[o + i], In<F>(dy)[o + i]);
        };
        const float dot = threads ? TreeSum(c, threads, term) : SeqSum(c, term);
        for (int64_t i = 0; i < c; ++i) {
          Out<F>(mdx)[o + i] = SoftmaxGradStored<F>(In<F>(y)[o + i], In<F>(dy)[o + i], dot);
        }
      }
      if (!simd && threads == 0) {
        EXPECT_TRUE(SameValues(my, y)) << DTypeName(dt);
        EXPECT_TRUE(SameValues(mdx, dx)) << DTypeName(dt);
      }
      // rows_math_test.cc's f32 bounds (probabilities 1e-12 + 2e-6 relative; dx 1e-6 + 1e-5
      // relative), plus the format's unit.
      EXPECT_TRUE(CloseInFormat(dt, my, y, 1e-12f, 2e-6f)) << Where(dt, simd, threads);
      EXPECT_TRUE(CloseInFormat(dt, mdx, dx, 1e-6f, 1e-5f)) << Where(dt, simd, threads);
    }
  }
}

TEST_F(RowsHalfMath, SoftmaxForwardAndBackward) {
  CheckSoftmax<Format::kBF16>(DType::kBF16, rng_);
  CheckSoftmax<Format::kF16>(DType::kF16, rng_);
}

template <Format F>
void CheckCrossEntropy(DType dt, std::mt19937& rng) {
  const int64_t n = 11, v = 777;
  const Tensor logits = LogitsWithNonFinite(n, v, 6.f, rng).To(dt);
  Tensor targets = RandomIds(n, v, rng, 4);
  // The non-finite rows count (a target >= 0, not on a -inf logit), so their losses are NaN.
  for (int64_t r : {1, 2, 3, 4}) targets.data<int32_t>()[r] = int32_t(5 + r);
  targets.data<int32_t>()[6] = -1;
  const Tensor dloss = RandomTensor({n}, rng);
  const int32_t* pt = targets.data<int32_t>();
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    Tensor losses = Tensor::Empty({n}), probs = Tensor::Empty({n, v});
    Tensor dl = Tensor::Empty({n, v}, dt);
    kernels::cross_entropy_forward.Get(Device::CPU(), dt)(logits, targets, losses, probs);
    kernels::cross_entropy_backward.Get(Device::CPU(), dt)(probs, targets, dloss, dl);
    for (int threads : {0, 32, 256}) {
      Tensor ml = Tensor::Empty({n}), mp = Tensor::Empty({n, v}), mdl = Tensor::Empty({n, v}, dt);
      for (int64_t r = 0; r < n; ++r) {
        const Stored<F>* xr = In<F>(logits) + r * v;
        const MaxSum st = RowState<F>(xr, v, threads);
        for (int64_t i = 0; i < v; ++i) {
          mp.data<float>()[r * v + i] = SoftmaxProb(LoadF32<F>(xr[i]), st, 1.0f / st.s);
          Out<F>(mdl)[r * v + i] = CrossEntropyGradStored<F>(probs.data<float>()[r * v + i], i,
                                                             pt[r], dloss.data<float>()[r]);
        }
        ml.data<float>()[r] = CrossEntropyLoss(st, pt[r] < 0 ? 0.f : LoadF32<F>(xr[pt[r]]), pt[r]);
      }
      if (!simd && threads == 0) {
        EXPECT_TRUE(SameValues(ml, losses)) << DTypeName(dt);
        EXPECT_TRUE(SameValues(mp, probs)) << DTypeName(dt);
      }
      // The gradient takes the CPU's probabilities: the same product, rounded once: exact.
      EXPECT_TRUE(SameValues(mdl, dl)) << Where(dt, simd, threads);
      // f32 outputs: rows_math_test.cc's bounds (losses 1e-6 + 1e-5 relative; probabilities
      // 1e-12 + 2e-6 relative).
      EXPECT_TRUE(AllClose(ml, losses, 1e-6f, 1e-5f)) << Where(dt, simd, threads);
      EXPECT_TRUE(AllClose(mp, probs, 1e-12f, 2e-6f)) << Where(dt, simd, threads);
    }
  }
  // The NaN rows are NaN, not skipped: rows 1 (NaN), 2 (+inf) and 4 (all -inf).
  Tensor losses = Tensor::Empty({n}), probs = Tensor::Empty({n, v});
  kernels::cross_entropy_forward.Get(Device::CPU(), dt)(logits, targets, losses, probs);
  for (int64_t r : {1, 2, 4}) EXPECT_TRUE(std::isnan(losses.data<float>()[r])) << r;
  EXPECT_TRUE(std::isfinite(losses.data<float>()[3]));
}

TEST_F(RowsHalfMath, CrossEntropyForwardAndBackward) {
  CheckCrossEntropy<Format::kBF16>(DType::kBF16, rng_);
  CheckCrossEntropy<Format::kF16>(DType::kF16, rng_);
}

// ---- Embedding -----------------------------------------------------------------------------

template <Format F>
void CheckEmbedding(DType dt, std::mt19937& rng) {
  const int64_t vocab = 40, c = 24, n = 300;  // every id repeated several times
  const Tensor weight = RandomTensor({vocab, c}, rng).To(dt);
  const Tensor ids = RandomIds(n, vocab, rng);
  Tensor doutf = RandomTensor({n, c}, rng);
  doutf.data<float>()[17 * c + 2] = NAN;
  doutf.data<float>()[40 * c + 9] = INFINITY;
  const Tensor dout = doutf.To(dt);
  const int32_t* pi = ids.data<int32_t>();
  for (bool simd : {false, true}) {
    cpu::SetSimdEnabled(simd);
    // Forward: a gather of the stored rows.
    Tensor out = Tensor::Empty({n, c}, dt), mout = Tensor::Empty({n, c}, dt);
    kernels::embedding_forward.Get(Device::CPU(), dt)(weight, ids, out);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < c; ++i) Out<F>(mout)[r * c + i] = In<F>(weight)[pi[r] * c + i];
    }
    EXPECT_TRUE(SameValues(mout, out)) << DTypeName(dt);
    // Backward into a table that already holds values: positions stably sorted by id (as the
    // kernel's radix sort), each id's run through EmbeddingGradColumn.
    Tensor dw = weight.Clone(), mdw = weight.Clone();
    kernels::embedding_backward.Get(Device::CPU(), dt)(dout, ids, dw);
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pi[a] < pi[b]; });
    for (int64_t begin = 0; begin < n;) {
      const int32_t id = pi[order[size_t(begin)]];
      int64_t end = begin;
      while (end < n && pi[order[size_t(end)]] == id) ++end;
      for (int64_t i = 0; i < c; ++i) {
        Stored<F>& w = Out<F>(mdw)[id * c + i];
        w = EmbeddingGradColumn<F>(w, In<F>(dout), order.data(), begin, end, c, i);
      }
      begin = end;
    }
    EXPECT_TRUE(SameValues(mdw, dw)) << DTypeName(dt) << " simd=" << simd;
  }
}

TEST_F(RowsHalfMath, EmbeddingForwardAndBackward) {
  CheckEmbedding<Format::kBF16>(DType::kBF16, rng_);
  CheckEmbedding<Format::kF16>(DType::kF16, rng_);
}

// ---- The online state on non-finite values ---------------------------------------------------

TEST(OnlineState, NonFiniteValuesGiveTheTwoPassResult) {
  // -inf first: skipped, not exp(-inf - -inf) = NaN.
  MaxSum st = MaxSumPush(MaxSumPush(MaxSumEmpty(), -INFINITY), 0.f);
  EXPECT_EQ(st.m, 0.f);
  EXPECT_EQ(st.s, 1.f);
  // +inf: the two-pass sum has exp(inf - inf) = NaN, whichever lane holds it.
  EXPECT_TRUE(std::isnan(MaxSumPush(MaxSumPush(MaxSumEmpty(), 1.f), INFINITY).s));
  EXPECT_TRUE(std::isnan(MaxSumPush(MaxSumPush(MaxSumEmpty(), INFINITY), 1.f).s));
  EXPECT_TRUE(std::isnan(MaxSumMerge(MaxSumPush(MaxSumEmpty(), 2.f),
                                     MaxSumPush(MaxSumEmpty(), INFINITY)).s));
  EXPECT_TRUE(std::isnan(MaxSumPush(MaxSumPush(MaxSumEmpty(), 1.f), NAN).s));
  // All -inf: the state stays empty, and the probability exp(-inf - -inf) / 0 is NaN, as the
  // two passes give.
  st = MaxSumPush(MaxSumPush(MaxSumEmpty(), -INFINITY), -INFINITY);
  EXPECT_TRUE(std::isnan(SoftmaxProb(-INFINITY, st, 1.0f / st.s)));
}

}  // namespace
}  // namespace braid::cuda::math
