"""braid_plugin_test: a test that loads plugins at run time, linked like the training program.

It lives beside the plugins, not in core: it names the CPU backend and the plugins' .so targets,
and core depends on nothing of ours.
"""

# What every plugin test links: the core (once, so the plugins it loads resolve against it), the
# CPU kernels, ranks as threads over the in-process communicator, the comparison helpers, gtest
# and the runfiles library that finds the plugins.
_PLUGIN_TEST_DEPS = [
    "//backends/cpu",
    "//backends/in_process",
    "//backends/in_process:run_ranks",
    "//core",
    "//core/testing:compare",
    "//third_party:gtest_main",
    "//third_party:runfiles",
]

def braid_plugin_test(name, plugins, srcs = None, deps = [], size = "small", data = [], **kwargs):
    """A test of plugins loaded at run time, as the training program loads them.

    Args:
      name: the test; its source is `<name>.cc` unless `srcs` says otherwise.
      plugins: the plugins it loads, by name ("ddp" is //plugins/ddp:libbraid_ddp.so), found with
        the runfiles library at braid/plugins/<name>/libbraid_<name>.so.
      srcs: sources, when not `<name>.cc`.
      deps: libraries beyond the core, the CPU kernels, ranks as threads, the comparison helpers,
        gtest and runfiles.
      size: the test's size.
      data: more run-time files.
      **kwargs: passed to cc_test (shard_count, tags, target_compatible_with, ...).
    """
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs if srcs != None else [name + ".cc"],
        data = ["//plugins/%s:libbraid_%s.so" % (p, p) for p in plugins] + data,
        # Statically linked, so the core's registry is in the test binary exactly once.
        linkstatic = True,
        deps = _PLUGIN_TEST_DEPS + [d for d in deps if d not in _PLUGIN_TEST_DEPS],
        **kwargs
    )
