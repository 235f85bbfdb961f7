// Built "against another Braid": reports an ABI version this program does not have.
#include "core/plugin_api.h"

extern "C" __attribute__((visibility("default"))) uint32_t braid_plugin_abi_version(void) {
  return BRAID_PLUGIN_ABI_VERSION + 41;
}
extern "C" __attribute__((visibility("default"))) int braid_plugin_register(BraidRegistry*) {
  return 0;
}
