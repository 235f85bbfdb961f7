// How a row-major Braid matmul maps onto cuBLASLt (column-major): a pure description computed
// on the host and tested on the CPU; matmul.cc turns it into cuBLASLt descriptors.
//
// Braid computes out[m, n] = alpha op(a) op(b) + beta out, row-major. Read as column-major, a
// row-major [r, c] matrix is its transpose [c, r], so cuBLASLt computes outᵀ[n, m] =
// op(b)ᵀ op(a)ᵀ: its A is Braid's b, its B is Braid's a, the transposes are kept, and
// m and n swap. A bias epilogue adds a vector along cuBLASLt's rows, i.e. one value per column
// of Braid's row-major output: exactly Linear's bias.
#ifndef BRAID_BACKENDS_CUDA_KERNELS_MATMUL_PLAN_H_
#define BRAID_BACKENDS_CUDA_KERNELS_MATMUL_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace braid::cuda {

// The cuBLASLt epilogues Braid uses (CUBLASLT_EPILOGUE_DEFAULT, _BIAS, _GELU_BIAS,
// _GELU_AUX_BIAS).
enum class Epilogue { kDefault, kBias, kGeluBias, kGeluAuxBias };
const char* EpilogueName(Epilogue e);

// One call, in Braid's row-major terms. Operands are [rows, cols] per batch entry (batch == 1
// for 2-D). Addresses are used only to detect aliasing.
struct MatmulCall {
  int64_t batch = 1;
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0, out_rows = 0, out_cols = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  // A fused linear layer: + bias[out_cols], then tanh-GELU; save_pre_gelu keeps the
  // pre-activation (for the backward) in an aux buffer.
  bool bias = false, gelu = false, save_pre_gelu = false;
  uintptr_t a_addr = 0, b_addr = 0, out_addr = 0;
  int64_t elem_size = 4;
};

struct MatmulPlan {
  // What to do at all: nothing (an empty output), out = beta * out (k == 0: an empty sum),
  // or the product.
  enum class Kind { kNothing, kScaleOnly, kGemm } kind = Kind::kGemm;
  // cuBLASLt's view: D[m, n] = alpha op(A) op(B) + beta C (column-major), C == D.
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;  // cuBLASLt's A (= Braid's b) and B (= Braid's a)
  // Matrix layouts as cuBLASLt wants them: stored rows, cols and leading dimension.
  int64_t a_rows = 0, a_cols = 0, lda = 0;
  int64_t b_rows = 0, b_cols = 0, ldb = 0;
  int64_t ldd = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;
  Epilogue epilogue = Epilogue::kDefault;
  // The epilogue was asked for but cannot be fused (e.g. the aux buffer's leading dimension
  // must be a multiple of 8): run the GEMM plain and the bias / GELU as separate kernels.
  bool unfused_bias = false, unfused_gelu = false;
  int64_t bias_len = 0;  // = n (Braid's out_cols) when a bias is added
  // The output overlaps an input (cuBLASLt allows D == C only): compute into a temporary.
  bool needs_aside = false;
  std::string ToString() const;
};

// InvalidArgument, naming the shapes, when they do not multiply.
absl::StatusOr<MatmulPlan> PlanMatmul(const MatmulCall& call);

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_MATMUL_PLAN_H_
