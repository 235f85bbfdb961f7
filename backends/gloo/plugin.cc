// libbraid_gloo.so's entry point: registers the "gloo" communicator.
#include "backends/gloo/gloo_communicator.h"
#include "core/plugin_api.h"
#include "core/registry.h"

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddCommunicator("gloo", &braid::gloo_backend::MakeGlooCommunicator);
  return s.ok() ? 0 : 1;
}
