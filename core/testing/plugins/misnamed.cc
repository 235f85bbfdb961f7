// Loads fine but registers a strategy under another name than the plugin's.
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/testing/plugins/dummy_strategy.h"

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddStrategy("test_misnamed_strategy", [] {
    return std::make_unique<braid::testing::DummyStrategy>("test_misnamed_strategy");
  });
  return s.ok() ? 0 : 1;
}
