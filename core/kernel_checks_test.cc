// The kernel slots' shared argument checks: the dimensions they hand back, and messages that name
// the backend, the slot and the offending tensor.
#include "core/kernel_checks.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace braid::kernels::checks {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr DType kF32 = DType::kF32;

Tensor Named(const Shape& shape, const char* name, DType dtype = kF32) {
  Tensor t = Tensor::Zeros(shape, dtype);
  t.set_name(name);
  return t;
}

TEST(KernelChecksTest, ReturnsTheDimensionsKernelsNeed) {
  const RowsDims ln = LayerNormForward("cpu", kF32, Tensor::Zeros({2, 3, 4}), Tensor::Zeros({4}),
                                       Tensor::Zeros({4}), Tensor::Zeros({2, 3, 4}),
                                       Tensor::Zeros({6}), Tensor::Zeros({6}));
  EXPECT_EQ(ln.rows, 6);
  EXPECT_EQ(ln.cols, 4);
  const RowsDims sm = SoftmaxForward("cpu", kF32, Tensor::Zeros({2, 0}), Tensor::Zeros({2, 0}));
  EXPECT_EQ(sm.rows, 0);  // empty rows: nothing to do, and no division by zero
  const MatmulDims mm = Matmul("cpu", kF32, Tensor::Zeros({5, 2, 3}), Tensor::Zeros({5, 4, 3}),
                               Tensor::Zeros({5, 2, 4}), false, true);
  EXPECT_EQ(mm.batch, 5);
  EXPECT_EQ(mm.m, 2);
  EXPECT_EQ(mm.n, 4);
  EXPECT_EQ(mm.k, 3);
  EXPECT_EQ(mm.b_rows, 4);
  const EmbeddingDims em = EmbeddingForward("cpu", kF32, Tensor::Zeros({10, 3}),
                                            Tensor::Zeros({7}, DType::kI32), Tensor::Zeros({7, 3}));
  EXPECT_EQ(em.vocab, 10);
  EXPECT_EQ(em.cols, 3);
  EXPECT_EQ(em.n, 7);
  const AttentionDims at = AttentionForward("cpu", kF32, Tensor::Zeros({2, 3, 12}), 2,
                                            Tensor::Zeros({2, 3, 4}), Tensor::Zeros({2, 2, 3, 3}));
  EXPECT_EQ(at.c, 4);
  EXPECT_EQ(at.d, 2);
}

TEST(KernelChecksTest, MessagesNameBackendSlotAndTensor) {
  EXPECT_DEATH(LayerNormForward("cuda", kF32, Tensor::Zeros({2, 4}), Tensor::Zeros({4}),
                                Named({3}, "bias"), Tensor::Zeros({2, 4}), Tensor::Zeros({2}),
                                Tensor::Zeros({2})),
               AllOf(HasSubstr("cuda kernel 'layernorm_forward'"), HasSubstr("'bias' f32[3]"),
                     HasSubstr("should have 4 elements"), HasSubstr("core/kernel_checks.cc:")));
  EXPECT_DEATH(CrossEntropyForward("reference", kF32, Tensor::Zeros({2, 5}), Named({2}, "targets"),
                                   Tensor::Zeros({2}), Tensor::Zeros({2, 5})),
               AllOf(HasSubstr("reference kernel 'cross_entropy_forward' wants i32"),
                     HasSubstr("'targets' f32[2]")));
  // mean and rstd stay f32 whatever the slot's dtype.
  const DType bf16 = DType::kBF16;
  EXPECT_DEATH(LayerNormForward("cpu", bf16, Tensor::Zeros({2, 4}, bf16), Tensor::Zeros({4}, bf16),
                                Tensor::Zeros({4}, bf16), Tensor::Zeros({2, 4}, bf16),
                                Named({2}, "mean", bf16), Tensor::Zeros({2})),
               HasSubstr("cpu kernel 'layernorm_forward' wants f32, got 'mean' bf16[2]"));
  EXPECT_DEATH(Binary("cpu", kF32, Tensor::Zeros({6}), Named({4}, "b"), Tensor::Zeros({6})),
               HasSubstr("cpu kernel 'binary': 'b' f32[4]"));
  EXPECT_DEATH(UnaryBackward("cpu", kF32, UnaryOp::kScale, Tensor::Zeros({2}), Tensor::Zeros({2}),
                             Tensor::Zeros({2})),
               HasSubstr("kScale's derivative is its scalar"));
  EXPECT_DEATH(AttentionForward("cpu", kF32, Named({1, 2, 9}, "qkv"), 2, Tensor::Zeros({1, 2, 3}),
                                Tensor::Zeros({1, 2, 2, 2})),
               AllOf(HasSubstr("n_head=2"), HasSubstr("'qkv' f32[1,2,9]")));
  // The fused attention keeps lse [B, H, T] in f32 whatever the slot's dtype.
  const DType half = DType::kBF16;
  EXPECT_DEATH(FlashAttentionForward("cuda", half, Tensor::Zeros({1, 3, 12}, half), 2,
                                     Tensor::Zeros({1, 3, 4}, half), Named({1, 2, 3}, "lse", half)),
               HasSubstr("cuda kernel 'flash_attention_forward' wants f32, got 'lse' bf16[1,2,3]"));
  EXPECT_DEATH(FlashAttentionBackward("cuda", kF32, Tensor::Zeros({1, 3, 4}),
                                      Tensor::Zeros({1, 3, 12}), Tensor::Zeros({1, 3, 4}),
                                      Named({1, 2, 9}, "lse"), 2, Tensor::Zeros({1, 3, 12})),
               AllOf(HasSubstr("cuda kernel 'flash_attention_backward'"),
                     HasSubstr("'lse' f32[1,2,9]"), HasSubstr("should have 6 elements")));
  const AttentionDims fa = FlashAttentionForward("cuda", kF32, Tensor::Zeros({2, 3, 12}), 2,
                                                 Tensor::Zeros({2, 3, 4}), Tensor::Zeros({2, 2, 3}));
  EXPECT_EQ(fa.d, 2);
  EXPECT_EQ(fa.h, 2);
}

TEST(KernelChecksTest, OptimizerSlotsAreF32Only) {
  const AdamWParams ap{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1};
  EXPECT_DEATH(AdamW("cuda", Named({4}, "p", DType::kBF16), Tensor::Zeros({4}), Tensor::Zeros({4}),
                     Tensor::Zeros({4}), ap),
               HasSubstr("cuda kernel 'adamw': 'p' bf16[4] on cpu:0 is not f32: optimizer updates "
                         "run on f32 only"));
  AdamWParams step0 = ap;
  step0.step = 0;
  EXPECT_DEATH(AdamW("cpu", Tensor::Zeros({4}), Tensor::Zeros({4}), Tensor::Zeros({4}),
                     Tensor::Zeros({4}), step0),
               HasSubstr("step is 1-based, got 0"));
  // Without momentum the buffer is unused and may be empty.
  SgdParams sp{0.1f, 0.0f, 0.0f, 0.0f, false, true};
  Sgd("cpu", Tensor::Zeros({4}), Tensor::Zeros({4}), Tensor(), sp);
  sp.momentum = 0.9f;
  EXPECT_DEATH(Sgd("cpu", Tensor::Zeros({4}), Tensor::Zeros({4}), Named({3}, "buf"), sp),
               HasSubstr("cpu kernel 'sgd': 'buf' f32[3] on cpu:0 should have 4 elements"));
}

}  // namespace
}  // namespace braid::kernels::checks

namespace braid::kernels::checks {
namespace {

// The Llama-family slots: dimensions handed back, and each kind of bad argument refused.
TEST(KernelChecksTest, LlamaSlots) {
  const DType f32 = DType::kF32;
  const RowsDims rn = RmsNormForward("cpu", f32, Tensor::Zeros({2, 3, 4}), Tensor::Zeros({4}),
                                     Tensor::Zeros({2, 3, 4}), Tensor::Zeros({6}));
  EXPECT_EQ(rn.rows, 6);
  EXPECT_EQ(rn.cols, 4);
  const GqaDims g = GqaForward("cpu", f32, Tensor::Zeros({2, 5, 6, 4}), Tensor::Zeros({2, 5, 3, 4}),
                               Tensor::Zeros({2, 5, 3, 4}), Tensor::Zeros({2, 5, 6, 4}),
                               Tensor::Zeros({2, 6, 5, 5}));
  EXPECT_EQ(g.h, 6);
  EXPECT_EQ(g.hkv, 3);
  EXPECT_EQ(g.d, 4);
  EXPECT_DEATH(RmsNormForward("cpu", f32, Tensor::Zeros({2, 4}), Tensor::Zeros({4}),
                              Tensor::Zeros({2, 4}), Tensor::Zeros({2}, DType::kBF16)),
               "cpu kernel 'rmsnorm_forward' wants f32");
  EXPECT_DEATH(SwiGluBackward("cpu", f32, Tensor::Zeros({3}), Tensor::Zeros({3}), Tensor::Zeros({3}),
                              Tensor::Zeros({3}), Tensor()),
               "up and dup must be both given");
  EXPECT_DEATH(Rope("cuda", f32, Tensor::Zeros({1, 2, 1, 3}), RopeParams{}, Tensor::Zeros({6})),
               "cuda kernel 'rope' wants x \\[B, T, H, D\\] with D even");
  RopeParams bad;
  bad.theta = -1.0f;
  EXPECT_DEATH(Rope("cpu", f32, Tensor::Zeros({1, 2, 1, 4}), bad, Tensor::Zeros({8})),
               "theta -1 and position_scale 1 must be positive");
  EXPECT_DEATH(GqaForward("cpu", f32, Tensor::Zeros({1, 2, 3, 4}), Tensor::Zeros({1, 2, 2, 4}),
                          Tensor::Zeros({1, 2, 2, 4}), Tensor::Zeros({1, 2, 3, 4}),
                          Tensor::Zeros({1, 3, 2, 2})),
               "H a multiple of Hkv");
  EXPECT_DEATH(Dropout("cpu", f32, Tensor::Zeros({3}), -0.5f, Tensor::Zeros({3})),
               "p -0.5 is not in \\[0, 1\\]");
}

}  // namespace
}  // namespace braid::kernels::checks
