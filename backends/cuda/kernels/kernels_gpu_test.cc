// Each CUDA kernel-table slot against the CPU backend on the same inputs. Needs a GPU: Bazel runs
// it as kernels_gpu_test_gpu, SKIPPED without one; run by hand, every case skips, saying why,
// when CUDA has no usable device (BRAID_REQUIRE_GPU=1 makes that a failure). Device tensors come from a plain cudaMalloc allocator registered here, so this test
// does not depend on the runtime's caching allocator.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/test_util.h"
#include "backends/cuda/gpu_test_env.h"
#include "core/allocator.h"
#include "core/kernels.h"
#include "gtest/gtest.h"

namespace braid::cuda {
namespace {

using cpu::testing::AllClose;
using cpu::testing::RandomIds;
using cpu::testing::RandomTensor;

class CudaMallocAllocator : public Allocator {
 public:
  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    BRAID_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes) == cudaSuccess) << "cudaMalloc " << bytes;
    RecordAlloc(bytes);
    return p;
  }
  void Deallocate(void* p, size_t bytes) override {
    cudaFree(p);
    RecordFree(bytes);
  }
};

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
    static bool registered = [] {
      RegisterAllocatorFactory(DeviceType::kCUDA, [](Device) {
        return std::unique_ptr<Allocator>(new CudaMallocAllocator);
      });
      return true;
    }();
    (void)registered;
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

}  // namespace
}  // namespace braid::cuda
