// The plugin's entry points: registers the "nccl" communicator (nccl_communicator.h).
#include "backends/nccl/nccl_communicator.h"
#include "core/plugin_api.h"
#include "core/registry.h"

BRAID_PLUGIN(registry) {
  absl::Status s = registry->AddCommunicator("nccl", braid::nccl::MakeNcclCommunicator);
  return s.ok() ? 0 : 1;
}
