// Each CUDA kernel-table slot against the CPU backend on the same inputs. Needs a GPU: Bazel runs
// it as kernels_gpu_test_gpu, SKIPPED without one; run by hand, every case skips, saying why,
// when CUDA has no usable device (BRAID_REQUIRE_GPU=1 makes that a failure). The program links
// //backends/cuda:backend, as training does: device tensors come from the runtime's caching
// allocator and the kernels run on its compute stream, so the allocator meets the real device
// here first, not in training.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/test_util.h"
#include "backends/cuda/gpu_test_env.h"
#include "backends/cuda/kernels/attention_plan.h"
#include "core/allocator.h"
#include "core/kernels.h"
#include "gtest/gtest.h"

namespace braid::cuda {
namespace {

using cpu::testing::AllClose;
using cpu::testing::RandomIds;
using cpu::testing::RandomTensor;

Tensor ToGpu(const Tensor& t) {
  Tensor d = Tensor::Empty(t.shape(), t.dtype(), Device::CUDA(0));
  EXPECT_EQ(cudaMemcpy(d.raw_data(), t.raw_data(), t.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

Tensor ToCpu(const Tensor& d) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Tensor t = Tensor::Empty(d.shape(), d.dtype());
  EXPECT_EQ(cudaMemcpy(t.raw_data(), d.raw_data(), d.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return t;
}

class CudaKernelsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      const std::string why = std::string("No usable CUDA device: ") + cudaGetErrorName(e);
      // Fails in kernels_gpu_test_gpu, which promises a GPU; skips in the binary run by hand.
      if (gpu_test::MustFailWithGpus(1, 0)) FAIL() << why;
      GTEST_SKIP() << why;
    }
  }
  std::mt19937 rng_{51};
};

// Tolerances. Elementwise ops: nvcc fuses multiply-adds and CUDA's expf/logf/tanhf are within
// 2 ulp of glibc's: 1e-6 absolute + 1e-5 relative. Reductions and row ops: the GPU's tree order
// (see backends/cuda/math/rows_math_test.cc, which bounds the same differences on the CPU):
// 1e-5 absolute + 1e-4 relative. Matmul: cuBLASLt's f32 GEMM vs OpenBLAS over k = 64: 1e-4
// absolute + 1e-4 relative.
constexpr float kEwAtol = 1e-6f, kEwRtol = 1e-5f, kRowAtol = 1e-5f, kRowRtol = 1e-4f;

TEST_F(CudaKernelsGpuTest, ElementwiseOps) {
  const Tensor a = RandomTensor({33, 65}, rng_, -4.f, 4.f), b = RandomTensor({65}, rng_, .5f, 2.f);
  const Tensor pos = RandomTensor({33, 65}, rng_, 0.1f, 4.f);
  for (auto op : {kernels::BinaryOp::kAdd, kernels::BinaryOp::kSub, kernels::BinaryOp::kMul,
                  kernels::BinaryOp::kDiv}) {
    Tensor want = Tensor::Empty(a.shape()), got = ToGpu(want);
    kernels::binary.Get(Device::CPU())(op, a, b, want);
    kernels::binary.Get(Device::CUDA(0))(op, ToGpu(a), ToGpu(b), got);
    EXPECT_TRUE(AllClose(ToCpu(got), want, 0, 0)) << "binary " << int(op);  // one IEEE op: exact
  }
  for (int o = 0; o <= int(kernels::UnaryOp::kTanh); ++o) {
    const auto op = kernels::UnaryOp(o);
    const Tensor& x = (op == kernels::UnaryOp::kLog || op == kernels::UnaryOp::kSqrt) ? pos : a;
    Tensor want = Tensor::Empty(x.shape()), got = ToGpu(want);
    kernels::unary.Get(Device::CPU())(op, x, 0.3f, want);
    kernels::unary.Get(Device::CUDA(0))(op, ToGpu(x), 0.3f, got);
    EXPECT_TRUE(AllClose(ToCpu(got), want, kEwAtol, kEwRtol)) << "unary " << o;
    if (op == kernels::UnaryOp::kScale) continue;
    Tensor gwant = Tensor::Empty(x.shape()), ggot = ToGpu(gwant);
    kernels::unary_backward.Get(Device::CPU())(op, x, a, gwant);
    kernels::unary_backward.Get(Device::CUDA(0))(op, ToGpu(x), ToGpu(a), ggot);
    EXPECT_TRUE(AllClose(ToCpu(ggot), gwant, kEwAtol, kEwRtol)) << "unary_backward " << o;
  }
  Tensor y = pos.Clone(), gy = ToGpu(y);
  kernels::axpby.Get(Device::CPU())(0.5f, a, -2.f, y);
  kernels::axpby.Get(Device::CUDA(0))(0.5f, ToGpu(a), -2.f, gy);
  EXPECT_TRUE(AllClose(ToCpu(gy), y, kEwAtol, kEwRtol));
  Tensor f = ToGpu(Tensor::Empty({1001}, DType::kBF16));
  kernels::fill.Get(Device::CUDA(0))(f, 1.5f);
  EXPECT_TRUE(AllClose(ToCpu(f), Tensor::Full({1001}, 1.5f), 0, 0));
}

TEST_F(CudaKernelsGpuTest, ReductionsAndMatmul) {
  const Tensor a = RandomTensor({300, 70}, rng_);
  Tensor s = Tensor::Empty({1}), gs = ToGpu(s);
  kernels::sum_all.Get(Device::CPU())(a, s);
  kernels::sum_all.Get(Device::CUDA(0))(ToGpu(a), gs);
  EXPECT_TRUE(AllClose(ToCpu(gs), s, kRowAtol, kRowRtol));
  Tensor r = RandomTensor({70}, rng_), gr = ToGpu(r);
  kernels::sum_rows.Get(Device::CPU())(a, r, 0.5f);
  kernels::sum_rows.Get(Device::CUDA(0))(ToGpu(a), gr, 0.5f);
  EXPECT_TRUE(AllClose(ToCpu(gr), r, kRowAtol, kRowRtol));
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Tensor x = RandomTensor(ta ? Shape{3, 64, 17} : Shape{3, 17, 64}, rng_);
      const Tensor w = RandomTensor(tb ? Shape{3, 9, 64} : Shape{3, 64, 9}, rng_);
      Tensor o = RandomTensor({3, 17, 9}, rng_), go = ToGpu(o);
      kernels::matmul.Get(Device::CPU())(x, w, o, ta, tb, 0.5f, 1.f);
      kernels::matmul.Get(Device::CUDA(0))(ToGpu(x), ToGpu(w), go, ta, tb, 0.5f, 1.f);
      EXPECT_TRUE(AllClose(ToCpu(go), o, 1e-4f, 1e-4f)) << "ta=" << ta << " tb=" << tb;
    }
  }
}

// sum_all's per-block partials come from the device's allocator (the caching allocator, linked
// here as in training), not cudaMallocAsync: each call makes exactly one allocation through it
// (the scratch; the input and output are made before counting), and the sums still match.
TEST_F(CudaKernelsGpuTest, SumAllScratchComesFromTheCachingAllocator) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor a = RandomTensor({1000, 37}, rng_).To(dt);  // 37,000 elements: 37 blocks
    Tensor s = Tensor::Empty({1}, dt);
    kernels::sum_all.Get(Device::CPU(), dt)(a, s);
    const Tensor ga = ToGpu(a);
    Tensor gs = ToGpu(s);
    const int64_t before = GetMemoryStats(Device::CUDA(0)).num_allocs;
    kernels::sum_all.Get(Device::CUDA(0), dt)(ga, gs);
    EXPECT_EQ(GetMemoryStats(Device::CUDA(0)).num_allocs, before + 1) << DTypeName(dt);
    const float tol = dt == DType::kBF16 ? 2e-2f : kRowRtol;
    EXPECT_TRUE(AllClose(ToCpu(gs).To(DType::kF32), s.To(DType::kF32), kRowAtol, tol))
        << DTypeName(dt);
  }
}

TEST_F(CudaKernelsGpuTest, RowOps) {
  for (int64_t c : {96, 1500}) {  // a warp per row, and a block per row
    const Tensor x = RandomTensor({13, c}, rng_, -3.f, 3.f), dy = RandomTensor({13, c}, rng_);
    const Tensor w = RandomTensor({c}, rng_), b = RandomTensor({c}, rng_);
    Tensor o = Tensor::Empty({13, c}), m = Tensor::Empty({13}), rs = Tensor::Empty({13});
    Tensor go = ToGpu(o), gm = ToGpu(m), grs = ToGpu(rs);
    kernels::layernorm_forward.Get(Device::CPU())(x, w, b, 1e-5f, o, m, rs);
    kernels::layernorm_forward.Get(Device::CUDA(0))(ToGpu(x), ToGpu(w), ToGpu(b), 1e-5f, go, gm, grs);
    EXPECT_TRUE(AllClose(ToCpu(go), o, kRowAtol, kRowRtol)) << c;
    Tensor dx = Tensor::Empty({13, c}), dw = Tensor::Zeros({c}), db = Tensor::Zeros({c});
    Tensor gdx = ToGpu(dx), gdw = ToGpu(dw), gdb = ToGpu(db);
    kernels::layernorm_backward.Get(Device::CPU())(dy, x, w, m, rs, dx, dw, db);
    kernels::layernorm_backward.Get(Device::CUDA(0))(ToGpu(dy), ToGpu(x), ToGpu(w), ToGpu(m),
                                                    ToGpu(rs), gdx, gdw, gdb);
    EXPECT_TRUE(AllClose(ToCpu(gdx), dx, kRowAtol, kRowRtol)) << c;
    EXPECT_TRUE(AllClose(ToCpu(gdw), dw, kRowAtol, kRowRtol)) << c;
    EXPECT_TRUE(AllClose(ToCpu(gdb), db, kRowAtol, kRowRtol)) << c;
    Tensor p = Tensor::Empty({13, c}), gp = ToGpu(p);
    kernels::softmax_forward.Get(Device::CPU())(x, p);
    kernels::softmax_forward.Get(Device::CUDA(0))(ToGpu(x), gp);
    EXPECT_TRUE(AllClose(ToCpu(gp), p, 1e-7f, kRowRtol)) << c;
    Tensor sdx = Tensor::Empty({13, c}), gsdx = ToGpu(sdx);
    kernels::softmax_backward.Get(Device::CPU())(p, dy, sdx);
    kernels::softmax_backward.Get(Device::CUDA(0))(ToGpu(p), ToGpu(dy), gsdx);
    EXPECT_TRUE(AllClose(ToCpu(gsdx), sdx, kRowAtol, kRowRtol)) << c;
    const Tensor t = RandomIds(13, c, rng_, 4), dl = RandomTensor({13}, rng_);
    Tensor l = Tensor::Empty({13}), gl = ToGpu(l), gp2 = ToGpu(p);
    kernels::cross_entropy_forward.Get(Device::CPU())(x, t, l, p);
    kernels::cross_entropy_forward.Get(Device::CUDA(0))(ToGpu(x), ToGpu(t), gl, gp2);
    EXPECT_TRUE(AllClose(ToCpu(gl), l, kRowAtol, kRowRtol)) << c;
    EXPECT_TRUE(AllClose(ToCpu(gp2), p, 1e-7f, kRowRtol)) << c;
    Tensor dlog = Tensor::Empty({13, c}), gdlog = ToGpu(dlog);
    kernels::cross_entropy_backward.Get(Device::CPU())(p, t, dl, dlog);
    kernels::cross_entropy_backward.Get(Device::CUDA(0))(ToGpu(p), ToGpu(t), ToGpu(dl), gdlog);
    EXPECT_TRUE(AllClose(ToCpu(gdlog), dlog, 0, 0)) << c;  // same formula on the same probs
  }
  const Tensor wt = RandomTensor({50, 40}, rng_), ids = RandomIds(77, 50, rng_);
  Tensor e = Tensor::Empty({77, 40}), ge = ToGpu(e);
  kernels::embedding_forward.Get(Device::CPU())(wt, ids, e);
  kernels::embedding_forward.Get(Device::CUDA(0))(ToGpu(wt), ToGpu(ids), ge);
  EXPECT_TRUE(AllClose(ToCpu(ge), e, 0, 0));
  const Tensor de = RandomTensor({77, 40}, rng_);
  Tensor dwt = RandomTensor({50, 40}, rng_), gdwt = ToGpu(dwt);
  kernels::embedding_backward.Get(Device::CPU())(de, ids, dwt);
  kernels::embedding_backward.Get(Device::CUDA(0))(ToGpu(de), ToGpu(ids), gdwt);
  EXPECT_TRUE(AllClose(ToCpu(gdwt), dwt, 0, 0));  // positions in order per column, as the CPU
}

TEST_F(CudaKernelsGpuTest, AttentionAndOptimizers) {
  const int64_t B = 2, T = 37, H = 4, C = 64;
  const Tensor qkv = RandomTensor({B, T, 3 * C}, rng_, -2.f, 2.f), dout = RandomTensor({B, T, C}, rng_);
  Tensor o = Tensor::Empty({B, T, C}), att = Tensor::Empty({B, H, T, T});
  Tensor go = ToGpu(o), gatt = ToGpu(att);
  kernels::attention_forward.Get(Device::CPU())(qkv, int(H), o, att);
  kernels::attention_forward.Get(Device::CUDA(0))(ToGpu(qkv), int(H), go, gatt);
  EXPECT_TRUE(AllClose(ToCpu(gatt), att, 1e-6f, kRowRtol));
  EXPECT_TRUE(AllClose(ToCpu(go), o, kRowAtol, kRowRtol));
  Tensor d = Tensor::Empty({B, T, 3 * C}), gd = ToGpu(d);
  kernels::attention_backward.Get(Device::CPU())(dout, qkv, att, int(H), d);
  kernels::attention_backward.Get(Device::CUDA(0))(ToGpu(dout), ToGpu(qkv), ToGpu(att), int(H), gd);
  EXPECT_TRUE(AllClose(ToCpu(gd), d, kRowAtol, kRowRtol));
  Tensor w = RandomTensor({999}, rng_), m = Tensor::Zeros({999}), v = Tensor::Zeros({999});
  Tensor gw = ToGpu(w), gm = ToGpu(m), gv = ToGpu(v);
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor g = RandomTensor({999}, rng_);
    const kernels::AdamWParams p{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
    kernels::adamw.Get(Device::CPU())(w, g, m, v, p);
    kernels::adamw.Get(Device::CUDA(0))(gw, ToGpu(g), gm, gv, p);
  }
  EXPECT_TRUE(AllClose(ToCpu(gw), w, kEwAtol, kEwRtol));
  Tensor buf = Tensor::Zeros({999}), gbuf = ToGpu(buf);
  for (int step = 0; step < 3; ++step) {
    const Tensor g = RandomTensor({999}, rng_);
    const kernels::SgdParams p{0.05f, 0.9f, 0.f, 0.01f, true, step == 0};
    kernels::sgd.Get(Device::CPU())(w, g, buf, p);
    kernels::sgd.Get(Device::CUDA(0))(gw, ToGpu(g), gbuf, p);
  }
  EXPECT_TRUE(AllClose(ToCpu(gw), w, kEwAtol, kEwRtol));
}

// The fused attention (flash_attention_* slots, attention_flash.cu) against the CPU backend's
// probability-saving attention on the same inputs: the inputs are rounded to the dtype first and
// the CPU computes in f32 on the rounded values, so only the kernel's f32 arithmetic order and
// the rounding of its half outputs differ. lse against a double-precision log-sum-exp.
// Tolerances: f32, 1e-4 absolute + 1e-4 relative (sums over up to 2048 terms in another order,
// as the matmul's); f16 outputs round to 11 bits (4.9e-4 relative) and the backward's delta uses
// the rounded output: 5e-3 + 5e-3; bf16 to 8 bits (3.9e-3): 3e-2 + 3e-2.
struct FlashTolerance {
  float atol, rtol;
};
FlashTolerance FlashTol(DType dt) {
  if (dt == DType::kBF16) return {3e-2f, 3e-2f};
  if (dt == DType::kF16) return {5e-3f, 5e-3f};
  return {1e-4f, 1e-4f};
}

void CheckFlash(DType dt, int64_t B, int64_t T, int64_t H, int64_t C, std::mt19937& rng) {
  SCOPED_TRACE(std::string(DTypeName(dt)) + " B=" + std::to_string(B) + " T=" +
               std::to_string(T) + " H=" + std::to_string(H) + " C=" + std::to_string(C));
  const Tensor qkv = RandomTensor({B, T, 3 * C}, rng, -2.f, 2.f).To(dt);
  const Tensor dout = RandomTensor({B, T, C}, rng).To(dt);
  const Tensor qkv32 = qkv.To(DType::kF32), dout32 = dout.To(DType::kF32);
  Tensor o = Tensor::Empty({B, T, C}), att = Tensor::Empty({B, H, T, T});
  kernels::attention_forward.Get(Device::CPU())(qkv32, int(H), o, att);
  Tensor d = Tensor::Empty({B, T, 3 * C});
  kernels::attention_backward.Get(Device::CPU())(dout32, qkv32, att, int(H), d);

  const Tensor gqkv = ToGpu(qkv);
  Tensor go = ToGpu(Tensor::Zeros({B, T, C}, dt)), glse = ToGpu(Tensor::Zeros({B, H, T}));
  kernels::flash_attention_forward.Get(Device::CUDA(0), dt)(gqkv, int(H), go, glse);
  Tensor gd = ToGpu(Tensor::Full({B, T, 3 * C}, 7.f, dt));  // every element must be written
  kernels::flash_attention_backward.Get(Device::CUDA(0), dt)(ToGpu(dout), gqkv, go, glse, int(H),
                                                             gd);
  const FlashTolerance tol = FlashTol(dt);
  EXPECT_TRUE(AllClose(ToCpu(go).To(DType::kF32), o, tol.atol, tol.rtol)) << "out";
  EXPECT_TRUE(AllClose(ToCpu(gd).To(DType::kF32), d, tol.atol, tol.rtol)) << "dqkv";
  // lse_i = log sum_{j <= i} exp(scale q_i . k_j), in double.
  const int64_t D = C / H;
  const double scale = 1.0 / std::sqrt(double(D));
  const float* q = qkv32.data<float>();
  Tensor want_lse = Tensor::Empty({B, H, T});
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(size_t(i + 1));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) {
            dot += double(q[(b * T + i) * 3 * C + h * D + e]) * q[(b * T + j) * 3 * C + C + h * D + e];
          }
          s[size_t(j)] = dot * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        for (double x : s) sum += std::exp(x - mx);
        want_lse.data<float>()[(b * H + h) * T + i] = float(mx + std::log(sum));
      }
    }
  }
  EXPECT_TRUE(AllClose(ToCpu(glse), want_lse, 1e-4f, 1e-5f)) << "lse";
}

TEST_F(CudaKernelsGpuTest, FusedAttentionMatchesTheCpuInEveryDtype) {
  CheckFlash(DType::kF32, 2, 37, 4, 64, rng_);    // D = 16, T not a multiple of the tile
  CheckFlash(DType::kF32, 1, 300, 2, 256, rng_);  // D = 128
  CheckFlash(DType::kF32, 1, 70, 1, 200, rng_);   // D = 200: 8 registers, shared memory > 48 KiB
  CheckFlash(DType::kBF16, 2, 130, 3, 192, rng_); // GPT-2's D = 64
  CheckFlash(DType::kF16, 2, 130, 3, 192, rng_);
  CheckFlash(DType::kF32, 1, 1, 2, 64, rng_);     // a single token
}

TEST_F(CudaKernelsGpuTest, FusedAttentionMemoryIsLinearInT) {
  // At T = 2048 one head-batch's T x T f32 scores alone are 16 MiB; everything the fused forward
  // and backward hold here (qkv, dqkv, out, dout, lse, delta) is ~8.4 MB, all from the caching
  // allocator, whose peak counts every live tensor of the process.
  const int64_t B = 1, H = 2, T = 2048, C = 128;
  CheckFlash(DType::kF32, B, T, H, C, rng_);
  const MemoryStats st = GetMemoryStats(Device::CUDA(0));
  EXPECT_LT(st.peak_bytes, B * H * T * T * 4) << "peak " << st.peak_bytes;
  EXPECT_EQ(FlashAttentionMemory(B, H, T).workspace, B * H * T * 4);
}

// cuBLASLt (matmul.cc): native bf16/f16 GEMMs against the CPU's half matmul on the same
// rounded inputs (both accumulate in f32 and round once: 2 ulp of the output's type, 2e-2 for
// bf16 and 2e-3 for f16, relative and absolute); an operand that is a view 1 float into a flat
// buffer (4-byte aligned, as ZeRO's shards can be), run twice so the cached plan is reused;
// Linear's forward with the BIAS epilogue against matmul + add on the CPU.
TEST_F(CudaKernelsGpuTest, MatmulHalfMisalignedViewsAndBiasEpilogue) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const float tol = dt == DType::kBF16 ? 2e-2f : 2e-3f;
    const Tensor x = RandomTensor({3, 17, 64}, rng_).To(dt), w = RandomTensor({3, 64, 9}, rng_).To(dt);
    Tensor o = RandomTensor({3, 17, 9}, rng_).To(dt), go = ToGpu(o);
    kernels::matmul.Get(Device::CPU(), dt)(x, w, o, false, false, 0.5f, 1.f);
    kernels::matmul.Get(Device::CUDA(0), dt)(ToGpu(x), ToGpu(w), go, false, false, 0.5f, 1.f);
    EXPECT_TRUE(AllClose(ToCpu(go).To(DType::kF32), o.To(DType::kF32), tol, tol)) << DTypeName(dt);
  }
  const int64_t rows = 33, k = 64, n = 40;
  const Tensor flat = RandomTensor({1 + rows * k}, rng_), w = RandomTensor({k, n}, rng_);
  const Tensor a = flat.FlatRange(1, rows * k, {rows, k});
  Tensor want = Tensor::Empty({rows, n});
  kernels::matmul.Get(Device::CPU())(a, w, want, false, false, 1.f, 0.f);
  const Tensor gflat = ToGpu(flat), gw = ToGpu(w);
  const Tensor ga = gflat.FlatRange(1, rows * k, {rows, k});
  ASSERT_EQ(reinterpret_cast<uintptr_t>(ga.raw_data()) % 8, 4u);  // really misaligned
  for (int rep = 0; rep < 2; ++rep) {
    Tensor got = ToGpu(Tensor::Zeros({rows, n}));
    kernels::matmul.Get(Device::CUDA(0))(ga, gw, got, false, false, 1.f, 0.f);
    EXPECT_TRUE(AllClose(ToCpu(got), want, 1e-4f, 1e-4f)) << "offset view, call " << rep;
  }
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const float tol = dt == DType::kBF16 ? 2e-2f : 1e-4f;
    const Tensor x = RandomTensor({50, 64}, rng_).To(dt), wt = RandomTensor({96, 64}, rng_).To(dt);
    const Tensor b = RandomTensor({96}, rng_).To(dt);
    Tensor ref = Tensor::Empty({50, 96}, dt);
    kernels::matmul.Get(Device::CPU(), dt)(x, wt, ref, false, true, 1.f, 0.f);
    kernels::binary.Get(Device::CPU(), dt)(kernels::BinaryOp::kAdd, ref, b, ref);
    Tensor got = ToGpu(Tensor::Zeros({50, 96}, dt));
    kernels::linear_forward.Get(Device::CUDA(0), dt)(ToGpu(x), ToGpu(wt), ToGpu(b), got);
    EXPECT_TRUE(AllClose(ToCpu(got).To(DType::kF32), ref.To(DType::kF32), tol, tol))
        << "linear_forward " << DTypeName(dt);
  }
}

// Linear + tanh-GELU (linear_gelu_forward, cuBLASLt's GELU_AUX_BIAS epilogue) against the CPU:
// pre (the aux output) against matmul + bias (the matmul bound: f32 1e-4 absolute + 1e-4
// relative; bf16 2e-2, f16 2e-3: 2 ulp), and out against the CPU's GeluTanh of the GPU's own
// pre, which isolates the epilogue's GELU from the GEMM's rounding: f32 within 1e-4 absolute +
// 1e-4 relative. The biases spread pre over [-5, 5], so an erf GELU, 4.7e-4 from the tanh one at
// |x| = 2.7, would fail. Out = [50, 96] takes the fused epilogue; [50, 90] (an aux leading
// dimension not a multiple of 8) takes the bias epilogue then the GELU kernel; both are checked.
// The second round reuses the cached plans.
TEST_F(CudaKernelsGpuTest, LinearGeluEpilogueMatchesTheCpu) {
  for (int round = 0; round < 2; ++round) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t n : {96, 90}) {
        const float tol = dt == DType::kBF16 ? 2e-2f : dt == DType::kF16 ? 2e-3f : 1e-4f;
        const Tensor x = RandomTensor({50, 64}, rng_, -.25f, .25f).To(dt);
        const Tensor wt = RandomTensor({n, 64}, rng_, -.25f, .25f).To(dt);
        const Tensor b = RandomTensor({n}, rng_, -4.f, 4.f).To(dt);
        Tensor ref = Tensor::Empty({50, n}, dt);
        kernels::matmul.Get(Device::CPU(), dt)(x, wt, ref, false, true, 1.f, 0.f);
        kernels::binary.Get(Device::CPU(), dt)(kernels::BinaryOp::kAdd, ref, b, ref);
        Tensor pre = ToGpu(Tensor::Zeros({50, n}, dt)), out = ToGpu(Tensor::Zeros({50, n}, dt));
        kernels::linear_gelu_forward.Get(Device::CUDA(0), dt)(ToGpu(x), ToGpu(wt), ToGpu(b), pre,
                                                              out);
        const Tensor got_pre = ToCpu(pre).To(DType::kF32);
        const std::string what = std::string(DTypeName(dt)) + " n=" + std::to_string(n) +
                                 " round " + std::to_string(round);
        EXPECT_TRUE(AllClose(got_pre, ref.To(DType::kF32), tol, tol)) << "pre " << what;
        Tensor want = Tensor::Empty({50, n}, dt);
        kernels::unary.Get(Device::CPU(), dt)(kernels::UnaryOp::kGeluTanh, ToCpu(pre), 0.f, want);
        EXPECT_TRUE(AllClose(ToCpu(out).To(DType::kF32), want.To(DType::kF32), tol, tol))
            << "gelu " << what;
      }
    }
  }
}

// LinearGeluTanh's GELU backward in one pass (linear_gelu_backward: dpre and the bias gradient)
// against the unfused path on the same GPU (unary_backward's GELU derivative, then sum_rows):
// within 1e-5 relative (0 absolute) in every dtype: the kernel is built to give the same bits
// (the same per-element math, the same per-column order, one rounding), and a half's unit is
// ~4e-3 (bf16) or ~1e-3 (f16) relative, so any rounding apart fails. And against the CPU's
// kernels (another GELU-derivative evaluation and summation): f32 1e-4 absolute + 1e-4
// relative, bf16 2e-2, f16 2e-3 on dpre, and for the sums over up to 300 rows 1e-3 (f32), 5e-2
// (bf16), 1e-2 (f16) absolute + relative. pre spans [-5, 5], over GELU's curved part and its
// tails; the shapes include one row, a column count not a multiple of 32, and more rows than
// columns.
TEST_F(CudaKernelsGpuTest, LinearGeluBackwardMatchesTheUnfusedPath) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{50, 96}, {37, 90}, {1, 45}, {300, 17}};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [rows, cols] : shapes) {
      const std::string what = std::string(DTypeName(dt)) + " " + std::to_string(rows) + "x" +
                               std::to_string(cols);
      const Tensor pre = RandomTensor({rows, cols}, rng_, -5.f, 5.f).To(dt);
      const Tensor dout = RandomTensor({rows, cols}, rng_, -1.f, 1.f).To(dt);
      const Tensor gpre = ToGpu(pre), gdout = ToGpu(dout);
      Tensor dpre = ToGpu(Tensor::Zeros({rows, cols}, dt)), db = ToGpu(Tensor::Zeros({cols}, dt));
      kernels::linear_gelu_backward.Get(Device::CUDA(0), dt)(gpre, gdout, dpre, db);
      Tensor dpre_u = ToGpu(Tensor::Zeros({rows, cols}, dt));
      Tensor db_u = ToGpu(Tensor::Zeros({cols}, dt));
      kernels::unary_backward.Get(Device::CUDA(0), dt)(kernels::UnaryOp::kGeluTanh, gpre, gdout,
                                                       dpre_u);
      kernels::sum_rows.Get(Device::CUDA(0), dt)(dpre_u, db_u, 0.0f);
      const Tensor got_dpre = ToCpu(dpre).To(DType::kF32), got_db = ToCpu(db).To(DType::kF32);
      EXPECT_TRUE(AllClose(got_dpre, ToCpu(dpre_u).To(DType::kF32), 0.f, 1e-5f)) << "dpre " << what;
      EXPECT_TRUE(AllClose(got_db, ToCpu(db_u).To(DType::kF32), 0.f, 1e-5f)) << "dbias " << what;

      Tensor want_dpre = Tensor::Empty({rows, cols}, dt), want_db = Tensor::Empty({cols}, dt);
      kernels::unary_backward.Get(Device::CPU(), dt)(kernels::UnaryOp::kGeluTanh, pre, dout,
                                                     want_dpre);
      kernels::sum_rows.Get(Device::CPU(), dt)(want_dpre, want_db, 0.0f);
      const float tol = dt == DType::kBF16 ? 2e-2f : dt == DType::kF16 ? 2e-3f : 1e-4f;
      const float sum_tol = dt == DType::kBF16 ? 5e-2f : dt == DType::kF16 ? 1e-2f : 1e-3f;
      EXPECT_TRUE(AllClose(got_dpre, want_dpre.To(DType::kF32), tol, tol)) << "dpre cpu " << what;
      EXPECT_TRUE(AllClose(got_db, want_db.To(DType::kF32), sum_tol, sum_tol))
          << "dbias cpu " << what;
    }
  }
}


// The Llama-family slots (llama.cu) against the CPU backend. Elementwise ones (SwiGLU, RoPE) to
// the elementwise tolerance, dropout exactly (the same mask, one multiply); RMSNorm to the row
// tolerance (its sums in the GPU's tree order); the grouped-query attention (4 query heads over
// 2 K/V heads, T = 37) to the row tolerance, its probabilities to 1e-6 absolute.
TEST_F(CudaKernelsGpuTest, LlamaOpsMatchTheCpu) {
  for (int64_t c : {96, 1500}) {
    const Tensor x = RandomTensor({13, c}, rng_, -3.f, 3.f), w = RandomTensor({c}, rng_, .5f, 1.5f);
    const Tensor dy = RandomTensor({13, c}, rng_);
    Tensor o = Tensor::Empty({13, c}), rs = Tensor::Empty({13}), go = ToGpu(o), grs = ToGpu(rs);
    kernels::rmsnorm_forward.Get(Device::CPU())(x, w, 1e-5f, o, rs);
    kernels::rmsnorm_forward.Get(Device::CUDA(0))(ToGpu(x), ToGpu(w), 1e-5f, go, grs);
    EXPECT_TRUE(AllClose(ToCpu(go), o, kRowAtol, kRowRtol)) << c;
    EXPECT_TRUE(AllClose(ToCpu(grs), rs, 0, kRowRtol)) << c;
    Tensor dx = Tensor::Empty({13, c}), dw = Tensor::Full({c}, 0.5f);
    Tensor gdx = ToGpu(dx), gdw = ToGpu(dw);
    kernels::rmsnorm_backward.Get(Device::CPU())(dy, x, w, rs, dx, dw);
    kernels::rmsnorm_backward.Get(Device::CUDA(0))(ToGpu(dy), ToGpu(x), ToGpu(w), ToGpu(rs), gdx,
                                                   gdw);
    EXPECT_TRUE(AllClose(ToCpu(gdx), dx, kRowAtol, kRowRtol)) << c;
    EXPECT_TRUE(AllClose(ToCpu(gdw), dw, kRowAtol, kRowRtol)) << c;  // added into 0.5
  }
  const Tensor gate = RandomTensor({33, 65}, rng_, -12.f, 12.f), up = RandomTensor({33, 65}, rng_);
  const Tensor d = RandomTensor({33, 65}, rng_);
  for (bool with_up : {true, false}) {
    const Tensor u = with_up ? up : Tensor(), gu = with_up ? ToGpu(up) : Tensor();
    Tensor o = Tensor::Empty(gate.shape()), go = ToGpu(o);
    kernels::swiglu_forward.Get(Device::CPU())(gate, u, o);
    kernels::swiglu_forward.Get(Device::CUDA(0))(ToGpu(gate), gu, go);
    EXPECT_TRUE(AllClose(ToCpu(go), o, kEwAtol, kEwRtol)) << with_up;
    Tensor dg = Tensor::Empty(gate.shape()), du = with_up ? Tensor::Empty(gate.shape()) : Tensor();
    Tensor gdg = ToGpu(dg), gdu = with_up ? ToGpu(du) : Tensor();
    kernels::swiglu_backward.Get(Device::CPU())(d, gate, u, dg, du);
    kernels::swiglu_backward.Get(Device::CUDA(0))(ToGpu(d), ToGpu(gate), gu, gdg, gdu);
    EXPECT_TRUE(AllClose(ToCpu(gdg), dg, kEwAtol, kEwRtol)) << with_up;
    if (with_up) {
      EXPECT_TRUE(AllClose(ToCpu(gdu), du, kEwAtol, kEwRtol));
    }
  }
  const Tensor rx = RandomTensor({2, 9, 3, 16}, rng_, -2.f, 2.f);
  for (kernels::RopeParams p : {kernels::RopeParams{10000.f, 1.f, 0, false},
                                kernels::RopeParams{500000.f, 2.f, 9000, true}}) {
    Tensor o = Tensor::Empty(rx.shape()), go = ToGpu(o);
    kernels::rope.Get(Device::CPU())(rx, p, o);
    kernels::rope.Get(Device::CUDA(0))(ToGpu(rx), p, go);
    EXPECT_TRUE(AllClose(ToCpu(go), o, kEwAtol, kEwRtol)) << p.inverse;
  }
  Tensor dr = Tensor::Empty({10007}), gdr = ToGpu(dr);
  const Tensor dx = RandomTensor({10007}, rng_);
  kernels::dropout.Get(Device::CPU())(dx, 0.3f, 42, dr);
  kernels::dropout.Get(Device::CUDA(0))(ToGpu(dx), 0.3f, 42, gdr);
  EXPECT_TRUE(AllClose(ToCpu(gdr), dr, 0, 0));

  const int64_t B = 2, T = 37, H = 4, Hkv = 2, D = 16;
  const Tensor q = RandomTensor({B, T, H, D}, rng_, -2.f, 2.f);
  const Tensor k = RandomTensor({B, T, Hkv, D}, rng_, -2.f, 2.f);
  const Tensor v = RandomTensor({B, T, Hkv, D}, rng_), dout = RandomTensor({B, T, H, D}, rng_);
  Tensor o = Tensor::Empty({B, T, H, D}), att = Tensor::Empty({B, H, T, T});
  Tensor go = ToGpu(o), gatt = ToGpu(att);
  kernels::gqa_forward.Get(Device::CPU())(q, k, v, o, att);
  kernels::gqa_forward.Get(Device::CUDA(0))(ToGpu(q), ToGpu(k), ToGpu(v), go, gatt);
  EXPECT_TRUE(AllClose(ToCpu(gatt), att, 1e-6f, kRowRtol));
  EXPECT_TRUE(AllClose(ToCpu(go), o, kRowAtol, kRowRtol));
  Tensor dq = Tensor::Empty(q.shape()), dk = Tensor::Empty(k.shape());
  Tensor dv = Tensor::Empty(v.shape());
  Tensor gdq = ToGpu(dq), gdk = ToGpu(dk), gdv = ToGpu(dv);
  kernels::gqa_backward.Get(Device::CPU())(dout, q, k, v, att, dq, dk, dv);
  kernels::gqa_backward.Get(Device::CUDA(0))(ToGpu(dout), ToGpu(q), ToGpu(k), ToGpu(v), ToGpu(att),
                                             gdq, gdk, gdv);
  EXPECT_TRUE(AllClose(ToCpu(gdq), dq, kRowAtol, kRowRtol));
  EXPECT_TRUE(AllClose(ToCpu(gdk), dk, kRowAtol, kRowRtol));
  EXPECT_TRUE(AllClose(ToCpu(gdv), dv, kRowAtol, kRowRtol));
}

}  // namespace
}  // namespace braid::cuda
