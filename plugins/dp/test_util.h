// Helpers shared by the dp plugin's tests (dp_test.cc, dp_memory_and_errors_test.cc): the small
// MLP and tiny GPT with their data, the optimizer, bit-for-bit replica checks, and the fixture
// that loads libbraid_dp.so the way the trainer does. Separate so both test files use one copy.
#ifndef BRAID_PLUGINS_DP_TEST_UTIL_H_
#define BRAID_PLUGINS_DP_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/check.h"
#include "core/module.h"
#include "core/optimizer.h"
#include "core/registry.h"
#include "core/strategy.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt.h"
#include "models/mlp/mlp.h"

namespace braid::dp_test {

// ---- Models and data ------------------------------------------------------------------------

enum class Kind { kMlp, kGpt };

models::MlpConfig SmallMlp(uint64_t seed);

models::GptConfig TinyGpt(uint64_t seed);

// The seed differs per call so that replicas start unlike the master: Setup must overwrite them.
std::unique_ptr<Module> MakeModel(Kind kind, Device device, uint64_t seed);

// `rows` rows of step `step`'s data, deterministic.
Batch MakeBatch(Kind kind, int step, int64_t rows);

Tensor CrossEntropyLoss(Module& model, const Batch& batch);

// eps 1e-6 rather than 1e-8: AdamW's first steps move each parameter by about lr * g / (|g| +
// eps), so a gradient near eps whose last bits differ between two f32 summation orders moves its
// parameter measurably differently (by up to lr * noise / (4 eps)). Some GPT gradients are pure
// rounding noise (the attention key bias's is exactly zero in exact arithmetic), and with the
// default eps two correct implementations then disagree by a good fraction of lr.
std::unique_ptr<Optimizer> AdamW(const std::vector<std::pair<std::string, Tensor>>& named);

// ---- Comparisons ----------------------------------------------------------------------------

// Bit-for-bit equal values (replicas are copies, not recomputations).
void ExpectIdentical(const Module& got, const Module& want, const std::string& where);

// ---- Fixture --------------------------------------------------------------------------------

class DpTest : public ::testing::Test {
 protected:
  void SetUp() override;

  static std::unique_ptr<Strategy> MakeDp() {
    absl::StatusOr<std::unique_ptr<Strategy>> made = Registry::Get().MakeStrategy("dp");
    BRAID_CHECK(made.ok()) << made.status();
    return std::move(*made);
  }

  static std::string Devices(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? ",cpu:" : "cpu:") + std::to_string(i);
    return s;
  }

  // Replicas built for the strategy, remembered so the test can look at them.
  struct Made {
    std::vector<Module*> modules;
    std::vector<Device> devices;
  };
  static ModuleFactory Factory(Kind kind, Made* made) {
    return [kind, made](Device d) {
      std::unique_ptr<Module> m = MakeModel(kind, d, 77 + made->modules.size());
      made->modules.push_back(m.get());
      made->devices.push_back(d);
      return m;
    };
  }

  static StrategyContext Context(int devices, const std::string& mode, ModuleFactory factory) {
    StrategyContext ctx;
    ctx.options["devices"] = Devices(devices);
    ctx.options["loss_mode"] = mode;
    ctx.make_replica = std::move(factory);
    return ctx;
  }

  std::string plugin_;
};

}  // namespace braid::dp_test

#endif  // BRAID_PLUGINS_DP_TEST_UTIL_H_
