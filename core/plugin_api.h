/* The plugin ABI: the C entry points every Braid plugin (a shared library) exports.
 *
 * Loading (core/plugin.h) dlopens the library, calls braid_plugin_abi_version() and refuses a
 * library built against another ABI version, then calls braid_plugin_register() with the
 * process's one registry. Registration itself passes C++ factories: a plugin is compiled against
 * the same core headers and compiler as the host, which is exactly what the version guards.
 * Bump BRAID_PLUGIN_ABI_VERSION whenever a core header a plugin sees changes layout or meaning.
 */
#ifndef BRAID_CORE_PLUGIN_API_H_
#define BRAID_CORE_PLUGIN_API_H_

#include <stdint.h>

#define BRAID_PLUGIN_ABI_VERSION 8u

#ifdef __cplusplus
namespace braid {
class Registry;
}
typedef braid::Registry BraidRegistry;
extern "C" {
#else
typedef struct BraidRegistry BraidRegistry;
#endif

/* Returns BRAID_PLUGIN_ABI_VERSION as the plugin saw it when it was compiled. */
typedef uint32_t (*BraidPluginAbiVersionFn)(void);
/* Registers the plugin's factories; returns 0 on success, non-zero on failure. */
typedef int (*BraidPluginRegisterFn)(BraidRegistry* registry);

#define BRAID_PLUGIN_ABI_VERSION_SYMBOL "braid_plugin_abi_version"
#define BRAID_PLUGIN_REGISTER_SYMBOL "braid_plugin_register"

#ifdef __cplusplus
}
#endif

/* In a plugin's one .cc file: BRAID_PLUGIN(registry) { registry->AddStrategy(...); return 0; } */
#define BRAID_PLUGIN(registry_arg)                                                 \
  extern "C" __attribute__((visibility("default"))) uint32_t braid_plugin_abi_version(void) { \
    return BRAID_PLUGIN_ABI_VERSION;                                               \
  }                                                                                \
  extern "C" __attribute__((visibility("default"))) int braid_plugin_register(     \
      BraidRegistry* registry_arg)

#endif /* BRAID_CORE_PLUGIN_API_H_ */
