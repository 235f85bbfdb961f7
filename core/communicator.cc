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
