#include "core/communicator.h"

#include <utility>

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

}  // namespace braid
