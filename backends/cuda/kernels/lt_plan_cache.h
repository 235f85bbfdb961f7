// cuBLASLt plans cached per GEMM (matmul.cc): the matmul descriptor, the three layouts and the
// heuristic's algorithm are built once per key and reused, instead of at every call. The key is
// everything the plan depends on: device, dtype, cuBLASLt's shapes and leading dimensions, batch
// and strides, transposes, epilogue, and the operands' alignment, since the heuristic is told the
// alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES) and may pick an algorithm that needs
// it. Host code, tested on the CPU with a fake plan builder (lt_plan_cache_test.cc).
#ifndef BRAID_BACKENDS_CUDA_KERNELS_LT_PLAN_CACHE_H_
#define BRAID_BACKENDS_CUDA_KERNELS_LT_PLAN_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "backends/cuda/kernels/matmul_plan.h"

namespace braid::cuda {

enum class LtDType { kF32, kBF16, kF16 };
const char* LtDTypeName(LtDType t);

// The largest power of two, up to 256, dividing every address an operand's batch entries start
// at: `addr`, addr + stride, addr + 2 stride, ... (strides in elements). A tensor allocated on
// its own is 256-byte aligned; a view into a flat buffer (ZeRO's shards, a slice) may be only
// 4- or 2-byte aligned, and cuBLASLt must be told so. 0 (no operand) counts as 256.
uint32_t OperandAlignment(uintptr_t addr, int64_t batch, int64_t stride_elems, int64_t elem_size);

struct LtPlanKey {
  int device = 0;
  LtDType dtype = LtDType::kF32;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;
  bool trans_a = false, trans_b = false;
  Epilogue epilogue = Epilogue::kDefault;
  uint32_t align_a = 256, align_b = 256, align_d = 256, align_bias = 256;

  bool operator==(const LtPlanKey& o) const;
  std::string ToString() const;
};

struct LtPlanKeyHash {
  size_t operator()(const LtPlanKey& k) const;
};

// The key of a plan's GEMM: `a_lt` and `b_lt` are cuBLASLt's A and B (Braid's b and a, see
// matmul_plan.h), `d` the output, `bias` the epilogue's bias (0 without).
LtPlanKey MakeLtPlanKey(int device, LtDType dtype, const MatmulPlan& p, uintptr_t a_lt,
                        uintptr_t b_lt, uintptr_t d, uintptr_t bias, int64_t elem_size);

// Plans by key, built on first use by `builder` and kept for the process (a training run has a
// few dozen distinct GEMMs). A build that fails is returned as its status and not cached.
// Thread-safe; a returned plan stays valid as long as the cache.
template <typename Plan>
class LtPlanCache {
 public:
  using Builder = std::function<absl::StatusOr<std::unique_ptr<Plan>>(const LtPlanKey&)>;
  explicit LtPlanCache(Builder builder) : builder_(std::move(builder)) {}

  absl::StatusOr<const Plan*> Get(const LtPlanKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      ++hits_;
      return it->second.get();
    }
    ++misses_;
    absl::StatusOr<std::unique_ptr<Plan>> built = builder_(key);
    if (!built.ok()) return built.status();
    const Plan* plan = built->get();
    plans_.emplace(key, std::move(*built));
    return plan;
  }

  int64_t hits() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hits_;
  }
  int64_t misses() const {
    std::lock_guard<std::mutex> lock(mu_);
    return misses_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return plans_.size();
  }

 private:
  Builder builder_;
  mutable std::mutex mu_;
  std::unordered_map<LtPlanKey, std::unique_ptr<Plan>, LtPlanKeyHash> plans_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_LT_PLAN_CACHE_H_
