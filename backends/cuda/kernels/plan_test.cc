// Host-side decisions of the CUDA kernels, checked on the CPU: launch geometry, the cuBLASLt
// matmul plan (executed here by a naive column-major GEMM that reads exactly the plan's
// layouts, and compared with the CPU backend's matmul), and the attention path choice.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/test_util.h"
#include "backends/cuda/kernels/attention_plan.h"
#include "backends/cuda/kernels/geometry.h"
#include "backends/cuda/kernels/matmul_plan.h"
#include "core/kernels.h"
#include "gtest/gtest.h"

namespace braid::cuda {
namespace {

TEST(Geometry, ElementwiseCoversEveryElementWithABoundedGrid) {
  EXPECT_EQ(ElementwiseGeometry(0).grid, 0);
  for (int64_t n : {int64_t(1), int64_t(255), int64_t(256), int64_t(257), int64_t(1) << 20,
                    int64_t(1) << 34}) {
    const Launch1D g = ElementwiseGeometry(n);
    EXPECT_EQ(g.block, 256);
    EXPECT_GE(g.grid, 1);
    EXPECT_LE(g.grid, kMaxElementwiseGrid);
    // Grid-stride: every element is visited when the grid is smaller than n / block.
    EXPECT_TRUE(g.grid * g.block >= n || g.grid == kMaxElementwiseGrid) << n;
    EXPECT_LT((g.grid - 1) * g.block, n) << "an idle block for n=" << n;
  }
}

TEST(Geometry, RowsGetAWarpUpTo1024ColumnsThenABlock) {
  EXPECT_EQ(RowwiseGeometry(0, 10).grid, 0);
  RowGeometry g = RowwiseGeometry(17, 768);
  EXPECT_EQ(g.threads_per_row, 32);
  EXPECT_EQ(g.rows_per_block, 8);
  EXPECT_EQ(g.grid, 3);  // 17 rows, 8 per block
  g = RowwiseGeometry(5, 1025);
  EXPECT_EQ(g.threads_per_row, 256);
  EXPECT_EQ(g.rows_per_block, 1);
  EXPECT_EQ(g.grid, 5);
  EXPECT_EQ(RowwiseGeometry(2, 50257).threads_per_row, 1024);  // GPT-2's vocabulary
  EXPECT_EQ(RowwiseGeometry(2, 20000).threads_per_row, 512);
  for (int64_t cols : {1, 31, 1024, 1025, 8192, 8193, 32768, 32769, 1 << 20}) {
    const RowGeometry r = RowwiseGeometry(3, cols);
    EXPECT_EQ(r.threads_per_row % 32, 0) << cols;  // whole warps: the reductions assume it
    EXPECT_LE(r.threads_per_row * r.rows_per_block, 1024) << cols;
  }
}

TEST(Geometry, ReductionGridIsFixedByNOnly) {
  EXPECT_EQ(ReductionGeometry(0).grid, 1);
  EXPECT_EQ(ReductionGeometry(1).grid, 1);
  EXPECT_EQ(ReductionGeometry(1024).grid, 1);
  EXPECT_EQ(ReductionGeometry(1025).grid, 2);
  EXPECT_EQ(ReductionGeometry(int64_t(1) << 30).grid, kMaxReduceGrid);
  EXPECT_EQ(ColumnGeometry(768).grid, 3);
  EXPECT_EQ(ColumnGeometry(0).grid, 0);
}

// Executes a plan as cuBLASLt would, column-major: D[i + j ldd] = alpha sum_p opA(i, p) opB(p, j)
// + beta D, with opA(i, p) = A[i + p lda] (N) or A[p + i lda] (T), per batch entry at the plan's
// strides. Reads only what the plan says, so a wrong leading dimension or swap shows.
void RunPlan(const MatmulPlan& p, const float* a, const float* b, float* d, float alpha,
             float beta) {
  for (int64_t e = 0; e < p.batch; ++e) {
    const float* A = a + e * p.stride_a;
    const float* B = b + e * p.stride_b;
    float* D = d + e * p.stride_d;
    for (int64_t j = 0; j < p.n; ++j) {
      for (int64_t i = 0; i < p.m; ++i) {
        double s = 0;
        for (int64_t q = 0; q < p.k; ++q) {
          const float av = p.trans_a ? A[q + i * p.lda] : A[i + q * p.lda];
          const float bv = p.trans_b ? B[j + q * p.ldb] : B[q + j * p.ldb];
          s += double(av) * bv;
        }
        float& out = D[i + j * p.ldd];
        out = float(alpha * s + (beta == 0.f ? 0.0 : double(beta) * out));
      }
    }
  }
}

TEST(MatmulPlan, ColumnMajorExecutionOfThePlanMatchesCpuMatmul) {
  std::mt19937 rng(41);
  for (int64_t batch : {0, 1, 3}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const int64_t m = 5, k = 7, n = 3;
        const bool batched = batch != 0;
        const int64_t nb = batched ? batch : 1;
        Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{n, k} : Shape{k, n};
        Shape so{m, n};
        if (batched) {
          sa.insert(sa.begin(), batch);
          sb.insert(sb.begin(), batch);
          so.insert(so.begin(), batch);
        }
        const Tensor a = cpu::testing::RandomTensor(sa, rng), b = cpu::testing::RandomTensor(sb, rng);
        Tensor want = cpu::testing::RandomTensor(so, rng);
        Tensor got = want.Clone();
        kernels::matmul.Get(Device::CPU())(a, b, want, ta, tb, 0.5f, -1.25f);
        MatmulCall call;
        call.batch = nb;
        call.a_rows = a.size(-2), call.a_cols = a.size(-1);
        call.b_rows = b.size(-2), call.b_cols = b.size(-1);
        call.out_rows = m, call.out_cols = n;
        call.trans_a = ta, call.trans_b = tb;
        absl::StatusOr<MatmulPlan> plan = PlanMatmul(call);
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_EQ(plan->kind, MatmulPlan::Kind::kGemm);
        EXPECT_EQ(plan->epilogue, Epilogue::kDefault);
        RunPlan(*plan, b.data<float>(), a.data<float>(), got.data<float>(), 0.5f, -1.25f);
        // The naive GEMM sums in double and rounds once; OpenBLAS in float with FMAs, 7 terms
        // of O(1): 1e-5 absolute + 1e-5 relative.
        EXPECT_TRUE(cpu::testing::AllClose(got, want, 1e-5f, 1e-5f))
            << "batch=" << batch << " ta=" << ta << " tb=" << tb << " " << plan->ToString();
      }
    }
  }
}

TEST(MatmulPlan, LinearLayerShapesAndEpilogues) {
  // x [B*T, C] @ W^T with W [4C, C]: Linear's forward, with bias and GELU fused.
  MatmulCall c;
  c.a_rows = 64, c.a_cols = 768, c.b_rows = 3072, c.b_cols = 768;
  c.out_rows = 64, c.out_cols = 3072, c.trans_b = true;
  MatmulPlan p = *PlanMatmul(c);
  EXPECT_EQ(p.m, 3072);
  EXPECT_EQ(p.n, 64);
  EXPECT_EQ(p.k, 768);
  EXPECT_TRUE(p.trans_a);
  EXPECT_FALSE(p.trans_b);
  EXPECT_EQ(p.lda, 768);
  EXPECT_EQ(p.ldb, 768);
  EXPECT_EQ(p.ldd, 3072);
  EXPECT_EQ(p.epilogue, Epilogue::kDefault);
  c.bias = true;
  p = *PlanMatmul(c);
  EXPECT_EQ(p.epilogue, Epilogue::kBias);
  EXPECT_EQ(p.bias_len, 3072);  // one per output column: Linear's bias
  c.gelu = true;
  EXPECT_EQ(PlanMatmul(c)->epilogue, Epilogue::kGeluBias);
  c.save_pre_gelu = true;
  EXPECT_EQ(PlanMatmul(c)->epilogue, Epilogue::kGeluAuxBias);
  // An aux leading dimension that is not a multiple of 8: unfused, said so.
  c.b_rows = 3070, c.out_cols = 3070;
  p = *PlanMatmul(c);
  EXPECT_EQ(p.epilogue, Epilogue::kDefault);
  EXPECT_TRUE(p.unfused_bias && p.unfused_gelu);
  c.bias = false, c.save_pre_gelu = false;
  p = *PlanMatmul(c);
  EXPECT_TRUE(p.unfused_gelu);
  EXPECT_FALSE(p.unfused_bias);
}

TEST(MatmulPlan, EdgeCasesAndErrors) {
  MatmulCall c;
  c.a_rows = 4, c.a_cols = 0, c.b_rows = 0, c.b_cols = 3, c.out_rows = 4, c.out_cols = 3;
  EXPECT_EQ(PlanMatmul(c)->kind, MatmulPlan::Kind::kScaleOnly);
  c.a_rows = 0, c.out_rows = 0;
  EXPECT_EQ(PlanMatmul(c)->kind, MatmulPlan::Kind::kNothing);
  c.a_rows = 4, c.a_cols = 5, c.b_rows = 6, c.b_cols = 3, c.out_rows = 4;
  absl::StatusOr<MatmulPlan> bad = PlanMatmul(c);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("[4, 5] @ [6, 3]"), std::string::npos) << bad.status();
  // Aliasing: out inside a's bytes needs a temporary; disjoint does not.
  c.b_rows = 5;
  c.a_addr = 0x1000, c.b_addr = 0x9000, c.out_addr = 0x1000 + 16;
  EXPECT_TRUE(PlanMatmul(c)->needs_aside);
  c.out_addr = 0x1000 + 4 * 5 * 4;  // right after a's 80 bytes
  EXPECT_FALSE(PlanMatmul(c)->needs_aside);
}

TEST(AttentionPlan, FusedKernelOnlyWhereItApplies) {
  AttentionQuery q{16, 1024, 12, 64, AttentionDType::kBF16, false};
  EXPECT_EQ(ChooseAttention(q).path, AttentionPath::kFlashKernel);
  auto reference_because = [&](AttentionQuery v, const std::string& why) {
    const AttentionChoice c = ChooseAttention(v);
    EXPECT_EQ(c.path, AttentionPath::kReferenceKernel) << why;
    EXPECT_NE(c.reason.find(why), std::string::npos) << c.reason;
  };
  AttentionQuery v = q;
  v.need_probabilities = true;  // what the kernel table's attention_forward slot asks
  reference_because(v, "probabilities");
  v = q, v.head_dim = 257;
  reference_because(v, "head_dim 257");
  v = q, v.head_dim = 0;
  reference_because(v, "head_dim 0");
  v = q, v.seq = int64_t(8) * 65535 + 1;  // one row block past grid y
  reference_because(v, "grid");
  for (AttentionDType dt : {AttentionDType::kF32, AttentionDType::kF16}) {
    for (int64_t d : {1, 37, 64, 128, 256}) {  // any dtype, any head_dim up to 256
      v = q, v.dtype = dt, v.head_dim = d;
      EXPECT_EQ(ChooseAttention(v).path, AttentionPath::kFlashKernel) << d;
    }
  }
}

// What the fused kernel keeps (lse) and its backward allocates (delta) is linear in T; the
// reference kernel's probabilities and dS scratch are quadratic.
TEST(AttentionPlan, FusedMemoryIsLinearInSequenceLength) {
  const int64_t B = 16, H = 12, T = 1024;  // GPT-2 124M at B = 16
  const AttentionBytes flash = FlashAttentionMemory(B, H, T);
  EXPECT_EQ(flash.saved, B * H * T * 4);
  EXPECT_EQ(flash.workspace, B * H * T * 4);
  EXPECT_EQ(flash.workspace, 786432);  // 768 KiB
  const AttentionBytes ref = ReferenceAttentionMemory(B, H, T, 4);
  EXPECT_EQ(ref.workspace, int64_t(805306368));  // the 805 MB dS scratch of issue 28
  EXPECT_EQ(ref.saved, int64_t(805306368));
  EXPECT_EQ(ReferenceAttentionMemory(B, H, T, 2).saved, int64_t(402653184));  // bf16 probabilities
  for (int64_t t : {1, 37, 512, 1024, 4096}) {
    const AttentionBytes a = FlashAttentionMemory(B, H, t), b = FlashAttentionMemory(B, H, 2 * t);
    EXPECT_EQ(b.saved, 2 * a.saved) << t;
    EXPECT_EQ(b.workspace, 2 * a.workspace) << t;
    const AttentionBytes ra = ReferenceAttentionMemory(B, H, t, 2),
                         rb = ReferenceAttentionMemory(B, H, 2 * t, 2);
    EXPECT_EQ(rb.workspace, 4 * ra.workspace) << t;
  }
}

TEST(AttentionPlan, SharedMemoryFitsTheDevice) {
  // Up to D = 128 within the default 48 KiB per block; up to 256 within an H100's 227 KiB
  // (the kernels opt in above 48 KiB).
  for (int64_t d : {1, 16, 64, 128}) {
    const FlashSharedBytes s = FlashAttentionSharedBytes(d);
    EXPECT_LE(std::max({s.forward, s.dq, s.dkdv}), size_t(48) << 10) << d;
  }
  const FlashSharedBytes s = FlashAttentionSharedBytes(256);
  EXPECT_GT(s.dkdv, size_t(48) << 10);
  EXPECT_LE(std::max({s.forward, s.dq, s.dkdv}), size_t(227) << 10);
  // GPT-2's D = 64: two padded 32 x 65 tiles and eight 64-float rows (plus dout's for dQ).
  EXPECT_EQ(FlashAttentionSharedBytes(64).forward, size_t(2 * 32 * 65 * 4 + 8 * 64 * 4));
}

}  // namespace
}  // namespace braid::cuda
