#include "backends/cuda/kernels/matmul_plan.h"

#include "absl/strings/str_cat.h"

namespace braid::cuda {

const char* EpilogueName(Epilogue e) {
  switch (e) {
    case Epilogue::kDefault: return "DEFAULT";
    case Epilogue::kBias: return "BIAS";
    case Epilogue::kGeluBias: return "GELU_BIAS";
    case Epilogue::kGeluAuxBias: return "GELU_AUX_BIAS";
  }
  return "?";
}

std::string MatmulPlan::ToString() const {
  return absl::StrCat("m=", m, " n=", n, " k=", k, " A", trans_a ? "^T" : "", "[", a_rows, "x",
                      a_cols, ", ld ", lda, "] B", trans_b ? "^T" : "", "[", b_rows, "x", b_cols,
                      ", ld ", ldb, "] ldd=", ldd, " batch=", batch, " strides=", stride_a, "/",
                      stride_b, "/", stride_d, " epilogue=", EpilogueName(epilogue),
                      needs_aside ? " aside" : "");
}

namespace {
bool Overlap(uintptr_t a, int64_t a_bytes, uintptr_t b, int64_t b_bytes) {
  if (a == 0 || b == 0 || a_bytes <= 0 || b_bytes <= 0) return false;
  return a < b + uintptr_t(b_bytes) && b < a + uintptr_t(a_bytes);
}
}  // namespace

absl::StatusOr<MatmulPlan> PlanMatmul(const MatmulCall& c) {
  const int64_t m = c.trans_a ? c.a_cols : c.a_rows, k = c.trans_a ? c.a_rows : c.a_cols;
  const int64_t kb = c.trans_b ? c.b_cols : c.b_rows, n = c.trans_b ? c.b_rows : c.b_cols;
  if (c.batch < 0 || k != kb || c.out_rows != m || c.out_cols != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda matmul: [", c.a_rows, ", ", c.a_cols, "]", c.trans_a ? "^T" : "", " @ [", c.b_rows,
        ", ", c.b_cols, "]", c.trans_b ? "^T" : "", " (batch ", c.batch, ") does not give [",
        c.out_rows, ", ", c.out_cols, "]; check the operands' shapes and transpose flags"));
  }
  if (c.save_pre_gelu && !c.gelu) {
    return absl::InvalidArgumentError(
        "cuda matmul: save_pre_gelu asks for GELU's pre-activation without gelu; set gelu too");
  }
  MatmulPlan p;
  if (m == 0 || n == 0 || c.batch == 0) {
    p.kind = MatmulPlan::Kind::kNothing;
    return p;
  }
  // Swap: cuBLASLt's A is Braid's b, its B is Braid's a; its D is outᵀ [n, m].
  p.m = n;
  p.n = m;
  p.k = k;
  p.trans_a = c.trans_b;
  p.trans_b = c.trans_a;
  p.a_rows = c.b_cols;  // b row-major [b_rows, b_cols] is column-major [b_cols, b_rows]
  p.a_cols = c.b_rows;
  p.lda = c.b_cols;
  p.b_rows = c.a_cols;
  p.b_cols = c.a_rows;
  p.ldb = c.a_cols;
  p.ldd = n;
  p.batch = c.batch;
  p.stride_a = c.b_rows * c.b_cols;
  p.stride_b = c.a_rows * c.a_cols;
  p.stride_d = m * n;
  if (k == 0) {
    p.kind = MatmulPlan::Kind::kScaleOnly;  // an empty sum: out = beta * out (+ epilogue)
  }
  if (c.bias) p.bias_len = n;
  if (c.bias && c.gelu) {
    // The aux (pre-GELU) buffer's leading dimension must be a multiple of 8 for cuBLASLt.
    if (c.save_pre_gelu && n % 8 != 0) {
      p.unfused_bias = p.unfused_gelu = true;
    } else {
      p.epilogue = c.save_pre_gelu ? Epilogue::kGeluAuxBias : Epilogue::kGeluBias;
    }
  } else if (c.bias) {
    p.epilogue = Epilogue::kBias;
  } else if (c.gelu) {
    // GELU without bias: Braid's linear layers always have a bias when they fuse GELU, so
    // this is done unfused rather than adding two more epilogues to test.
    p.unfused_gelu = true;
  }
  if (p.kind == MatmulPlan::Kind::kScaleOnly) {
    p.unfused_bias = c.bias;
    p.unfused_gelu = c.gelu;
    p.epilogue = Epilogue::kDefault;
  }
  const int64_t es = c.elem_size;
  const int64_t out_bytes = c.batch * m * n * es;
  p.needs_aside = p.kind == MatmulPlan::Kind::kGemm &&
                  (Overlap(c.out_addr, out_bytes, c.a_addr, c.batch * c.a_rows * c.a_cols * es) ||
                   Overlap(c.out_addr, out_bytes, c.b_addr, c.batch * c.b_rows * c.b_cols * es));
  return p;
}

}  // namespace braid::cuda
