"""braid_plugin: builds a Braid plugin, the shared library LoadPlugin (core/plugin.h) opens."""

def braid_plugin(name, srcs, deps = [], copts = [], visibility = None, **kwargs):
    """A plugin `name`: the cc_library `<name>_lib` and the shared library `libbraid_<name>.so`.

    The library compiles against //core:headers only and leaves core's symbols undefined: they
    resolve at dlopen time from the host program, which links //core:core once with -rdynamic.
    `deps` must therefore never reach //core:core (directly or through another library): the
    plugin would carry a second registry, register into it, and the host would never see its
    strategies. LoadPlugin("<name>", search_path) finds the result by its file name.

    Args:
      name: the plugin's name (usually its strategy's name).
      srcs: sources; exactly one of them defines the entry points with BRAID_PLUGIN(registry).
      deps: extra header-only or self-contained libraries (never //core:core).
      copts: extra compiler options.
      visibility: of the .so target (the library stays private to the package).
      **kwargs: passed to both targets (tags, testonly, target_compatible_with, ...).
    """
    lib = name + "_lib"
    native.cc_library(
        name = lib,
        srcs = srcs,
        copts = copts,
        # Label(): resolved in the repository of this file, so that from a user's own workspace
        # (Braid as @braid) it names Braid's headers, not a //core of theirs.
        deps = [Label("//core:headers")] + deps,
        # Keep every object, registration code included, even when nothing references it.
        alwayslink = True,
        visibility = ["//visibility:private"],
        **kwargs
    )
    native.cc_binary(
        name = "libbraid_" + name + ".so",
        linkshared = True,
        deps = [":" + lib],
        visibility = visibility,
        **kwargs
    )

# What every plugin test links: the core (once, so the plugins it loads resolve against it), the
# CPU kernels, the comparison helpers, gtest and the runfiles library that finds the plugins.
_PLUGIN_TEST_DEPS = [
    "//backends/cpu",
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
      deps: libraries beyond the core, the CPU kernels, the comparison helpers, gtest and runfiles.
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
