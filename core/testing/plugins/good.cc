#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/testing/plugins/dummy_strategy.h"

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy(
      "test_good", [] { return std::make_unique<braid::testing::DummyStrategy>("test_good"); });
  return s.ok() ? 0 : 1;
}
