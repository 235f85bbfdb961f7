#include "core/communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace braid {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

absl::Status CheckReduction(ReduceOp op, DType dtype, const std::string& where) {
  // Both switches name every value (no default), so that a new op or dtype does not compile
  // without a warning here until the rule says what it takes.
  bool floating = false;
  bool known_dtype = false;
  switch (dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
      floating = known_dtype = true;
      break;
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
      known_dtype = true;
      break;
  }
  std::string why = "unknown dtype";
  if (known_dtype) {
    why = "unknown reduction";
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kMin:
        return absl::OkStatus();
      case ReduceOp::kAvg:
        if (floating) return absl::OkStatus();
        why = absl::StrCat("avg needs a floating dtype, got ", DTypeName(dtype),
                           " (f32, bf16 and f16 take every op; i32, i64, u8 and i8 take sum, "
                           "max and min)");
        break;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(where, where.empty() ? "" : ": ",
                                                 "cannot reduce ", DTypeName(dtype), " with ",
                                                 ReduceOpName(op), ": ", why));
}

namespace {

class CompletedWorkImpl final : public Work {
 public:
  explicit CompletedWorkImpl(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }
  bool IsCompleted() override { return true; }

 private:
  absl::Status status_;
};

}  // namespace

std::shared_ptr<Work> CompletedWork(absl::Status status) {
  return std::make_shared<CompletedWorkImpl>(std::move(status));
}

absl::StatusOr<std::vector<int64_t>> BlockCounts(const std::string& where, int64_t total,
                                                 int size, const std::vector<int64_t>& counts) {
  if (counts.empty()) {
    if (total % size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", total,
                                                     " elements do not split into ", size,
                                                     " equal blocks; pass per-rank counts"));
    }
    return std::vector<int64_t>(size_t(size), total / size);
  }
  int64_t sum = 0;
  bool negative = false;
  for (int64_t c : counts) {
    sum += c;
    negative |= c < 0;
  }
  if (int(counts.size()) != size || sum != total || negative) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": counts [", absl::StrJoin(counts, ","),
        "] must give one non-negative count per rank (", size, ") summing to the full buffer's ",
        total, " elements"));
  }
  return counts;
}

}  // namespace braid
