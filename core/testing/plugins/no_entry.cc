// A shared library that is not a Braid plugin.
extern "C" int braid_test_not_a_plugin(void) { return 42; }
