#include "backends/cuda/kernels/lt_plan_cache.h"

#include <tuple>

#include "absl/strings/str_cat.h"

namespace braid::cuda {

const char* LtDTypeName(LtDType t) {
  switch (t) {
    case LtDType::kF32: return "f32";
    case LtDType::kBF16: return "bf16";
    case LtDType::kF16: return "f16";
  }
  return "?";
}

namespace {
constexpr uint32_t kMaxAlignment = 256;

uint32_t PowerOfTwoDividing(uint64_t x) {
  if (x == 0) return kMaxAlignment;
  const uint64_t low = x & (~x + 1);  // the lowest set bit
  return low >= kMaxAlignment ? kMaxAlignment : uint32_t(low);
}

auto Tie(const LtPlanKey& k) {
  return std::tie(k.device, k.dtype, k.m, k.n, k.k, k.lda, k.ldb, k.ldd, k.batch, k.stride_a,
                  k.stride_b, k.stride_d, k.trans_a, k.trans_b, k.epilogue, k.align_a, k.align_b,
                  k.align_d, k.align_bias);
}
}  // namespace

uint32_t OperandAlignment(uintptr_t addr, int64_t batch, int64_t stride_elems, int64_t elem_size) {
  uint32_t a = PowerOfTwoDividing(uint64_t(addr));
  if (batch > 1) {
    const uint32_t s = PowerOfTwoDividing(uint64_t(stride_elems * elem_size));
    a = s < a ? s : a;
  }
  return a;
}

bool LtPlanKey::operator==(const LtPlanKey& o) const { return Tie(*this) == Tie(o); }

size_t LtPlanKeyHash::operator()(const LtPlanKey& k) const {
  size_t h = 0;
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldd, k.batch, k.stride_a, k.stride_b,
                    k.stride_d}) {
    mix(uint64_t(v));
  }
  mix(uint64_t(k.device) << 32 | uint64_t(k.dtype) << 16 | uint64_t(k.epilogue) << 8 |
      uint64_t(k.trans_a) << 1 | uint64_t(k.trans_b));
  mix(uint64_t(k.align_a) << 48 | uint64_t(k.align_b) << 32 | uint64_t(k.align_d) << 16 |
      uint64_t(k.align_bias));
  return h;
}

std::string LtPlanKey::ToString() const {
  return absl::StrCat("cuda:", device, " ", LtDTypeName(dtype), " m=", m, " n=", n, " k=", k,
                      " A", trans_a ? "^T" : "", " ld ", lda, " B", trans_b ? "^T" : "", " ld ",
                      ldb, " ldd ", ldd, " batch ", batch, " strides ", stride_a, "/", stride_b,
                      "/", stride_d, " epilogue ", EpilogueName(epilogue), " align ", align_a,
                      "/", align_b, "/", align_d, "/", align_bias);
}

LtPlanKey MakeLtPlanKey(int device, LtDType dtype, const MatmulPlan& p, uintptr_t a_lt,
                        uintptr_t b_lt, uintptr_t d, uintptr_t bias, int64_t elem_size) {
  LtPlanKey k;
  k.device = device;
  k.dtype = dtype;
  k.m = p.m, k.n = p.n, k.k = p.k;
  k.lda = p.lda, k.ldb = p.ldb, k.ldd = p.ldd;
  k.batch = p.batch;
  // Strides only matter for batched GEMMs; a 2-D call keeps them 0 so its key does not depend
  // on them.
  k.stride_a = p.batch > 1 ? p.stride_a : 0;
  k.stride_b = p.batch > 1 ? p.stride_b : 0;
  k.stride_d = p.batch > 1 ? p.stride_d : 0;
  k.trans_a = p.trans_a, k.trans_b = p.trans_b;
  k.epilogue = p.epilogue;
  k.align_a = OperandAlignment(a_lt, p.batch, p.stride_a, elem_size);
  k.align_b = OperandAlignment(b_lt, p.batch, p.stride_b, elem_size);
  k.align_d = OperandAlignment(d, p.batch, p.stride_d, elem_size);
  k.align_bias = bias == 0 ? kMaxAlignment : OperandAlignment(bias, 1, 0, elem_size);
  return k;
}

}  // namespace braid::cuda
