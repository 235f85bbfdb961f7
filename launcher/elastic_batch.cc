#include "launcher/elastic_batch.h"

#include <cstdlib>
#include <numeric>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "backends/store/tcp_store.h"
#include "core/check.h"
#include "launcher/elastic_keys.h"

namespace braid::launcher {

absl::StatusOr<std::optional<ElasticNodes>> ElasticNodesFromEnv() {
  const char* v = std::getenv(kElasticEnv);
  if (v == nullptr || *v == '\0') return std::optional<ElasticNodes>();
  std::vector<std::string> parts = absl::StrSplit(v, ':');
  ElasticNodes n;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &n.min_nodes) ||
      !absl::SimpleAtoi(parts[1], &n.max_nodes) || n.min_nodes < 1 || n.max_nodes < n.min_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(kElasticEnv, "=", v, " is not MIN:MAX nodes"));
  }
  return std::optional<ElasticNodes>(n);
}

absl::StatusOr<std::string> PrepareElasticBatch(config::TrainConfig* cfg, ElasticNodes nodes,
                                                int local_world, int world_size,
                                                const ValidateForWorld& validate) {
  const std::string job = absl::StrCat("an elastic job (--nnodes=", nodes.min_nodes, ":", nodes.max_nodes, ")");
  if (!cfg->has_train_batch_size() || !cfg->has_train_micro_batch_size_per_gpu()) {
    // A whole accumulation for every world size: micro × lcm(world sizes) always works.
    const int micro = cfg->has_train_micro_batch_size_per_gpu() ? cfg->train_micro_batch_size_per_gpu() : 16;
    int64_t lcm = 1;
    for (int n = nodes.min_nodes; n <= nodes.max_nodes; ++n) lcm = std::lcm(lcm, int64_t(n) * local_world);
    return absl::InvalidArgumentError(absl::StrCat(
        job, " keeps the global batch fixed while the world size changes: set train_batch_size and "
        "train_micro_batch_size_per_gpu in the config (gradient_accumulation_steps is then derived for "
        "each round), e.g. train_batch_size: ", micro * lcm, " with train_micro_batch_size_per_gpu: ",
        micro, ", which suits every world size from ", nodes.min_nodes * local_world, " to ",
        nodes.max_nodes * local_world));
  }
  // Derived per round (DeepSpeed elasticity), whatever the config said for one size.
  cfg->clear_gradient_accumulation_steps();
  std::vector<std::string> rows, accepted;
  std::string refusal;
  for (int n = nodes.min_nodes; n <= nodes.max_nodes; ++n) {
    const int world = n * local_world;
    config::TrainConfig copy = *cfg;
    absl::Status st = validate(&copy, world);
    if (st.ok()) {
      const int dp = copy.train_batch_size() /
                     (copy.train_micro_batch_size_per_gpu() * copy.gradient_accumulation_steps());
      rows.push_back(absl::StrCat("  world size ", world, " (", n, " node(s)): data-parallel ", dp,
                                  ", gradient accumulation ", copy.gradient_accumulation_steps()));
      accepted.push_back(absl::StrCat(world));
    } else {
      rows.push_back(absl::StrCat("  world size ", world, " (", n, " node(s)): refused: ", st.message()));
      if (world == world_size) refusal = std::string(st.message());
    }
  }
  const std::string table = absl::StrCat(
      "braid: elastic: train_batch_size ", cfg->train_batch_size(), " = micro-batch ",
      cfg->train_micro_batch_size_per_gpu(), " x gradient accumulation x data-parallel size, for the "
      "world sizes of --nnodes=", nodes.min_nodes, ":", nodes.max_nodes, " x ", local_world, ":\n",
      absl::StrJoin(rows, "\n"));
  if (!refusal.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this round's world size ", world_size, " cannot keep train_batch_size ", cfg->train_batch_size(),
        " (", refusal, "); ", job, " with this config accepts world sizes ",
        accepted.empty() ? "none" : absl::StrJoin(accepted, ", ")));
  }
  return table;
}

absl::StatusOr<std::unique_ptr<ElasticCheckpoints>> ElasticCheckpoints::FromEnv(int rank, absl::Duration timeout) {
  BRAID_ASSIGN_OR_RETURN(std::optional<ElasticNodes> nodes, ElasticNodesFromEnv());
  if (!nodes) return std::unique_ptr<ElasticCheckpoints>();
  int round = 0;
  if (const char* r = std::getenv("BRAID_RESTART_COUNT"); r != nullptr) (void)absl::SimpleAtoi(r, &round);
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreClient> client, ConnectStoreFromEnv(timeout));
  auto e = std::make_unique<ElasticCheckpoints>(client.get(), rank, round, timeout);
  e->owned_ = std::move(client);
  return e;
}

absl::StatusOr<std::optional<std::string>> ElasticCheckpoints::AfterCheckpoint(int64_t step) {
  std::string decision;
  if (rank_ == 0) {
    BRAID_RETURN_IF_ERROR(store_->Set(CheckpointStepKey(), absl::StrCat(step)));
    absl::StatusOr<std::string> joiner = store_->Get(RegroupKey(round_), absl::Milliseconds(1));
    if (!joiner.ok() && !absl::IsDeadlineExceeded(joiner.status()) && !absl::IsNotFound(joiner.status())) {
      return joiner.status();
    }
    decision = joiner.ok() ? "stop:" + *joiner : "go";
    BRAID_RETURN_IF_ERROR(store_->Set(RegroupDecisionKey(round_, step), decision));
  } else {
    BRAID_ASSIGN_OR_RETURN(decision, store_->Get(RegroupDecisionKey(round_, step), timeout_));
  }
  if (decision.rfind("stop:", 0) != 0) return std::optional<std::string>();
  return std::optional<std::string>(decision.substr(5));
}

namespace {
constexpr char kRegroupPayload[] = "braid.elastic/regroup";
}  // namespace

absl::Status RegroupStatus(int64_t step, const std::string& joiner) {
  absl::Status st = absl::AbortedError(absl::StrCat(
      "stopped after the checkpoint of step ", step, ": ", joiner,
      " waits to join, and the group restarts larger from this checkpoint"));
  st.SetPayload(kRegroupPayload, absl::Cord("1"));
  return st;
}

bool IsRegroup(const absl::Status& st) { return st.GetPayload(kRegroupPayload).has_value(); }

}  // namespace braid::launcher
