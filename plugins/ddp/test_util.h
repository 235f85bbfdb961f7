// Helpers shared by the ddp plugin's tests (ddp_test.cc, ddp_reducer_test.cc): the small MLP
// and its data, the default optimizer, state snapshots and their difference, and the fixture that
// loads libbraid_ddp.so the way the trainer does and runs ranks as threads of this process (the
// in-process communicator).
#ifndef BRAID_PLUGINS_DDP_TEST_UTIL_H_
#define BRAID_PLUGINS_DDP_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/in_process/in_process_communicator.h"
#include "core/check.h"
#include "core/communicator.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/plugin.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace braid::ddp_test {

using StateDict = std::map<std::string, Tensor>;

// ---- Models and data ---------------------------------------------------------------------------

constexpr int64_t kIn = 12, kHidden = 24, kClasses = 5;

std::unique_ptr<Module> MakeMlp(uint64_t seed);

// Rows [first, first + rows) of step `step`'s global batch: features in [-1, 1], class labels.
Batch MlpRows(int step, int first, int rows);

Tensor CrossEntropyLoss(Module& model, const Batch& batch);

std::unique_ptr<Optimizer> AdamW(const std::vector<std::pair<std::string, Tensor>>& named);

StateDict Snapshot(const Module& m);

// Largest |a - b| over every tensor, +infinity where either holds a NaN or inf (so that
// EXPECT_EQ(MaxDiff(...), 0) fails on them); also checks both hold the same names.
float MaxDiff(const StateDict& a, const StateDict& b);

// ---- Running ranks as threads -------------------------------------------------------------------

std::string PluginPath();

class DdpTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    absl::Status s = LoadPlugin(PluginPath(), {});
    ASSERT_TRUE(s.ok()) << s;
  }

  static std::unique_ptr<Strategy> MakeDdp() {
    absl::StatusOr<std::unique_ptr<Strategy>> made = Registry::Get().MakeStrategy("ddp");
    BRAID_CHECK(made.ok()) << made.status();
    return std::move(made).value();
  }

  // Runs body(rank, comm) on n threads, one per rank of a fresh in-process group.
  static void RunRanks(int n, const std::function<void(int, Communicator*)>& body) {
    std::vector<std::unique_ptr<Communicator>> group = MakeInProcessGroup(n);
    for (auto& c : group) c->set_timeout(absl::Seconds(60));  // a hang fails, not stalls
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r, group[size_t(r)].get()); });
    for (auto& t : threads) t.join();
  }
};

}  // namespace braid::ddp_test

#endif  // BRAID_PLUGINS_DDP_TEST_UTIL_H_
