// ReplicatedStrategy: a Strategy whose every data-parallel rank holds the whole model (single,
// DDP, Local SGD, most strategies a user writes first). Everything such a strategy would write
// the same way has its answer here: the optimizer, the full state and loading it, the data
// shard from the data-parallel group, evaluation, and sharded-checkpoint chunks (rank 0 of the
// group writes, every rank reads). A subclass writes name(), Setup and TrainStep; its Setup
// ends with Adopt(model, optimizer, data group). docs/WRITING_A_STRATEGY.md section 2.
#ifndef BRAID_CORE_REPLICATED_STRATEGY_H_
#define BRAID_CORE_REPLICATED_STRATEGY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/autograd.h"
#include "core/communicator.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/state_chunks.h"
#include "core/strategy.h"

namespace braid {

class ReplicatedStrategy : public Strategy {
 public:
  Optimizer* optimizer() override { return optimizer_.get(); }

  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override {
    if (model_ == nullptr) return NotSetUp("FullStateDict");
    return model_->StateDict();  // every replica holds the same whole model
  }
  // Every rank loads the same values: no communication.
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override {
    if (model_ == nullptr) return NotSetUp("LoadFullStateDict");
    return model_->LoadStateDict(state, /*strict=*/true);
  }
  int data_parallel_rank() const override { return data_ != nullptr ? data_->rank() : 0; }
  int data_parallel_size() const override { return data_ != nullptr ? data_->size() : 1; }
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    if (model_ == nullptr) return NotSetUp("Evaluate");
    autograd::NoGradGuard no_grad;
    eval(*model_);
    return absl::OkStatus();
  }
  // The replicas are equal: rank 0 of the data-parallel group writes, every rank reads.
  absl::StatusOr<std::vector<StateChunk>> StateChunks(bool create) override {
    if (model_ == nullptr) return NotSetUp("StateChunks");
    return WholeModelChunks(*model_, *optimizer_, create, data_parallel_rank() == 0);
  }
  absl::Status AfterStateLoaded(const std::vector<StateChunk>& chunks) override {
    RestoreOptimizerStep(*optimizer_, chunks);
    return absl::OkStatus();
  }

 protected:
  // Ends a subclass's Setup: the model it trains, the optimizer it built over the model's
  // parameters, and the data-parallel group (null or size 1: one replica).
  absl::Status Adopt(Module& model, std::unique_ptr<Optimizer> optimizer, Communicator* data) {
    if (optimizer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("strategy '", name(), "': the optimizer factory returned null"));
    }
    model_ = &model;
    optimizer_ = std::move(optimizer);
    data_ = data;
    return absl::OkStatus();
  }
  // "strategy 'NAME': WHAT before Setup".
  absl::Status NotSetUp(const std::string& what) const {
    return absl::FailedPreconditionError(absl::StrCat("strategy '", name(), "': ", what, " before Setup"));
  }

  Module* model_ = nullptr;
  std::unique_ptr<Optimizer> optimizer_;
  Communicator* data_ = nullptr;
};

}  // namespace braid

#endif  // BRAID_CORE_REPLICATED_STRATEGY_H_
