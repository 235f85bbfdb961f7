// cuBLASLt plans cached per GEMM (matmul.cc): the matmul descriptor, the three layouts and the
// heuristic's algorithm are built once per key and reused, instead of at every call. The key is
// everything the plan depends on: device, dtype, cuBLASLt's shapes and leading dimensions, batch
// and strides, transposes, epilogue, and the operands' alignment, since the heuristic is told the
// alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES) and may pick an algorithm that needs
// it. The cache is bounded (least recently used evicted). Host code, tested on the CPU with a
// fake plan builder (lt_plan_cache_test.cc).
#ifndef BRAID_BACKENDS_CUDA_KERNELS_LT_PLAN_CACHE_H_
#define BRAID_BACKENDS_CUDA_KERNELS_LT_PLAN_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
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

// How many plans an LtPlanCache keeps by default. A GPT training step has a few dozen distinct
// GEMMs (per distinct Linear shape: forward, two backward products, times the operand
// alignments seen), so 256 keeps every plan of a run; the bound exists for programs whose shapes
// keep changing (varying sequence lengths, generation), where an unbounded cache would hold
// cuBLASLt descriptors for every shape ever seen.
constexpr size_t kDefaultLtPlanCacheCapacity = 256;

// Plans by key, built on first use by `builder`, least recently used evicted beyond `capacity`
// (destroying the plan, i.e. its cuBLASLt descriptors; it is rebuilt if its key comes back). A
// build that fails is returned as its status and not cached. Thread-safe. Plans are handed out
// as shared_ptr: one in use on another thread while it is evicted stays alive until that call
// ends.
template <typename Plan>
class LtPlanCache {
 public:
  using Builder = std::function<absl::StatusOr<std::unique_ptr<Plan>>(const LtPlanKey&)>;
  explicit LtPlanCache(Builder builder, size_t capacity = kDefaultLtPlanCacheCapacity)
      : builder_(std::move(builder)), capacity_(capacity < 1 ? 1 : capacity) {}

  absl::StatusOr<std::shared_ptr<const Plan>> Get(const LtPlanKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second);  // now the most recently used
      return it->second->second;
    }
    ++misses_;
    absl::StatusOr<std::unique_ptr<Plan>> built = builder_(key);
    if (!built.ok()) return built.status();
    std::shared_ptr<const Plan> plan(std::move(*built));
    lru_.emplace_front(key, plan);
    index_.emplace(key, lru_.begin());
    while (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
      ++evictions_;
    }
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
  int64_t evictions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return evictions_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lru_.size();
  }
  size_t capacity() const { return capacity_; }
  // Whether `key`'s plan is held (without counting a hit or touching the order).
  bool Contains(const LtPlanKey& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    return index_.count(key) != 0;
  }

 private:
  using Entry = std::pair<LtPlanKey, std::shared_ptr<const Plan>>;
  Builder builder_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<LtPlanKey, typename std::list<Entry>::iterator, LtPlanKeyHash> index_;
  int64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

}  // namespace braid::cuda

#endif  // BRAID_BACKENDS_CUDA_KERNELS_LT_PLAN_CACHE_H_
