// Needs a function no program defines, so dlopen(RTLD_NOW) must fail with dlerror's message.
#include "core/plugin_api.h"

extern "C" int braid_test_symbol_nobody_defines(void);

BRAID_PLUGIN(registry) { return braid_test_symbol_nobody_defines(); }
