// Exports the ABI version but forgot braid_plugin_register.
#include "core/plugin_api.h"

extern "C" __attribute__((visibility("default"))) uint32_t braid_plugin_abi_version(void) {
  return BRAID_PLUGIN_ABI_VERSION;
}
