// Host-side decisions of the CUDA kernels, checked on the CPU: launch geometry, the cuBLASLt
// matmul plan (executed here by a naive column-major GEMM that reads exactly the plan's
// layouts, and compared with the CPU backend's matmul), and the attention path choice.
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

TEST(AttentionPlan, FusedSdpaOnlyWhereItApplies) {
  AttentionQuery q{16, 1024, 12, 64, AttentionDType::kBF16, false, 91900, 90};
  EXPECT_EQ(ChooseAttention(q).path, AttentionPath::kCudnnSdpa);
  auto reference_because = [&](AttentionQuery v, const std::string& why) {
    const AttentionChoice c = ChooseAttention(v);
    EXPECT_EQ(c.path, AttentionPath::kReferenceKernel) << why;
    EXPECT_NE(c.reason.find(why), std::string::npos) << c.reason;
  };
  AttentionQuery v = q;
  v.need_probabilities = true;  // what the kernel table's slot asks today
  reference_because(v, "probabilities");
  v = q, v.cudnn_version = 0;
  reference_because(v, "not available");
  v = q, v.cudnn_version = 8907;
  reference_because(v, "older than 9.0");
  v = q, v.compute_capability = 75;
  reference_because(v, "below 8.0");
  v = q, v.dtype = AttentionDType::kF32;
  reference_because(v, "f32");
  v = q, v.head_dim = 60;
  reference_because(v, "head_dim 60");
  v = q, v.head_dim = 256;
  reference_because(v, "head_dim 256");
  v = q, v.dtype = AttentionDType::kF16, v.compute_capability = 80;
  EXPECT_EQ(ChooseAttention(v).path, AttentionPath::kCudnnSdpa);
}

}  // namespace
}  // namespace braid::cuda
