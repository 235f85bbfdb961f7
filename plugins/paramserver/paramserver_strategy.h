// The "paramserver" strategy's messages and class (paramserver.cc has its file comment: roles,
// messages, modes, and the host synchronisations on a GPU), apart from its implementation.
#ifndef BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_STRATEGY_H_
#define BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_STRATEGY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/async_copy.h"
#include "core/autograd.h"
#include "core/communicator.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/strategy.h"
#include "plugins/paramserver/flat_layout.h"
#include "plugins/paramserver/paramserver_errors.h"
#include "plugins/paramserver/paramserver_options.h"
#include "plugins/paramserver/paramserver_stats.h"

namespace braid::paramserver {

inline constexpr char kName[] = "paramserver";

// ---- Messages -----------------------------------------------------------------------------------

enum Tag : int {
  kPushHeader = 7101,
  kPushPayload = 7102,
  kReplyHeader = 7103,
  kReplyParams = 7104,
};
// The step field of the reply FullStateDict sends.
constexpr int64_t kFinal = -1;
// The push payload's values after the gradient: the worker's loss and the seconds its forward
// and backward took, so that the server (which computes neither) can report the job's time
// split instead of its own idle wait.
constexpr int64_t kPushExtras = 3;

// A worker's push the server has not answered yet. Its buffers stay untouched until the answer
// is in: a communicator may read a send buffer, or fill a receive buffer, until its Work is done.
struct Push {
  int64_t step = 0;
  Tensor header, payload;             // sent
  Tensor header_host, extras_host;    // what the host copied into them, alive until answered
  Tensor reply_header, reply_params;  // received
  std::vector<std::shared_ptr<Work>> works;

  bool Answered() const {
    for (const auto& w : works) {
      if (!w->IsCompleted()) return false;
    }
    return true;
  }
};

// The server's end of one worker: the push of the current step and the reply to it.
// What the server adds up from the pushes of one step.
struct PushSums {
  double loss = 0, forward_s = 0, backward_s = 0;
};

struct Peer {
  int rank = 0;
  Tensor header, payload;             // received
  Tensor reply_header, reply_params;  // sent
  // Sync mode: the received header and statistics copied to the host, read after the step's one
  // read; the reply's header as the host wrote it, alive until the next step.
  Tensor header_host, extras_host, reply_header_host;
  std::vector<std::unique_ptr<InFlightCopy>> copies;
  std::vector<std::shared_ptr<Work>> recvs;
  bool received = false;
};

// ---- The strategy -------------------------------------------------------------------------------

class ParamServerStrategy final : public Strategy, public ParamServerIntrospection {
 public:
  std::string name() const override { return kName; }
  absl::Status Setup(Module& model, const OptimizerFactory& make_optimizer,
                     const StrategyContext& ctx) override;
  absl::StatusOr<StepStats> TrainStep(const std::vector<Batch>& micro_batches,
                                      const LossFn& loss_fn) override;
  // On workers an optimizer that is never stepped (AdamW and SGD allocate their state on the
  // first step, so it costs nothing): callers set the learning rate on every rank, and only the
  // server's counts.
  Optimizer* optimizer() override { return optimizer_.get(); }
  absl::StatusOr<std::map<std::string, Tensor>> FullStateDict() override;
  absl::Status LoadFullStateDict(const std::map<std::string, Tensor>& state) override {
    if (model_ == nullptr) {
      return Failed(absl::StatusCode::kFailedPrecondition, "LoadFullStateDict before Setup");
    }
    // Before the first step, on every rank: the server and the workers start from the same
    // values, as they do after Setup.
    return model_->LoadStateDict(state, /*strict=*/true);
  }
  // Workers only, in rank order. The server reads worker 0's share too and ignores it: the
  // trainer draws a batch on every rank, and any valid place will do for one it never uses.
  int data_parallel_rank() const override {
    if (comm_ == nullptr || is_server()) return 0;
    return comm_->rank() < opts_.server_rank ? comm_->rank() : comm_->rank() - 1;
  }
  int data_parallel_size() const override { return comm_ ? comm_->size() - 1 : 1; }
  absl::Status Evaluate(const std::function<void(Module&)>& eval) override {
    if (model_ == nullptr) return Failed(absl::StatusCode::kFailedPrecondition, "Evaluate before Setup");
    autograd::NoGradGuard no_grad;
    eval(*model_);
    return absl::OkStatus();
  }
  ParamServerStats Stats() const override { return stats_; }
  // The run summary's line: what this rank did, from the counters (tests read it too).
  std::vector<std::string> SummaryLines() const override {
    if (comm_ == nullptr) return {};
    if (is_server()) {
      return {absl::StrCat("paramserver: rank ", comm_->rank(), " served ", peers_.size(),
                           " worker(s), ", ModeName(opts_.mode), "; ", stats_.gradients_applied,
                           " gradients applied, largest version lag ", stats_.max_version_lag,
                           "; the time split above is the workers' mean forward and backward")};
    }
    return {absl::StrCat("paramserver: worker rank ", comm_->rank(), ", ", ModeName(opts_.mode),
                         "; at most ", stats_.max_steps_ahead, " step(s) ahead of its parameters, ",
                         stats_.waits_for_fresh, " wait(s) for fresh ones")};
  }

 private:
  bool is_server() const { return comm_->rank() == opts_.server_rank; }
  absl::Status CheckRanksAgree(const Module::NamedTensors& named);

  // Worker side.
  absl::StatusOr<StepStats> WorkerStep(const std::vector<Batch>& micro_batches,
                                       const LossFn& loss_fn);
  absl::Status ComputeGradient(const std::vector<Batch>& micro_batches, const LossFn& loss_fn,
                               StepStats* stats);
  void SendPush(int64_t step, const StepStats& stats);
  absl::Status FinishOldestPush();

  // Server side.
  absl::StatusOr<StepStats> ServerStep();
  absl::StatusOr<int64_t> TakePush(Peer& peer, int64_t step, PushSums* sums);
  absl::Status ReceivePush(Peer& peer);
  absl::Status CheckPush(Peer& peer, int64_t step, PushSums* sums);
  float ApplyMean(const Tensor& mean, const std::function<absl::Status()>& after_read,
                  absl::Status* checked, StepStats* stats);
  float Apply(const Tensor& gradient, int64_t computed_on, StepStats* stats);
  void SendReply(Peer& peer, int64_t step);
  absl::Status WaitForReplies();

  Options opts_;
  Communicator* comm_ = nullptr;
  Module* model_ = nullptr;
  Device device_ = Device::CPU();
  float max_grad_norm_ = 0;
  std::unique_ptr<Optimizer> optimizer_;
  FlatLayout layout_;
  ParamServerStats stats_;

  // Worker: pushes in flight, oldest first (replies come back in this order), and answered
  // ones whose buffers can be reused.
  std::deque<Push> in_flight_;
  std::vector<Push> spare_;
  // Replies whose header is on its way to the host (no wait), checked after the next read.
  struct ReplyCheck {
    int64_t step = 0;
    Tensor header_host;
    std::unique_ptr<InFlightCopy> copy;
  };
  std::vector<ReplyCheck> reply_checks_;
  absl::Status CheckReplies(bool wait);

  // Server: one entry per worker, in rank order, and the reply sends of the current step.
  std::vector<Peer> peers_;
  std::vector<std::shared_ptr<Work>> reply_sends_;
};

}  // namespace braid::paramserver

#endif  // BRAID_PLUGINS_PARAMSERVER_PARAMSERVER_STRATEGY_H_
