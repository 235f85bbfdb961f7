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
