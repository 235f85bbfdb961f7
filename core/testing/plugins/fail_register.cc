#include "core/plugin_api.h"

BRAID_PLUGIN(registry) { return 3; }
