// Claims the name the good plugin already registered; returns 0 regardless, so the loader must
// notice the failed AddStrategy by itself.
#include "core/plugin_api.h"
#include "core/registry.h"
#include "core/testing/plugins/dummy_strategy.h"

BRAID_PLUGIN(registry) {
  registry
      ->AddStrategy("test_good",
                    [] { return std::make_unique<braid::testing::DummyStrategy>("copy"); })
      .IgnoreError();
  return 0;
}
