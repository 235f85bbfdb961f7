"""Bazel macros for CUDA code: cuda_library and cuda_cc_test.

Only `bazel build --config=cuda` builds these targets. In the default build they are
incompatible with the platform (see //third_party/cuda:needs_config_cuda): `bazel build //...`
skips them, `bazel test //...` lists their tests as SKIPPED, and nvcc is never run. Naming one
of them explicitly without --config=cuda is an error that names that constraint.

A target outside this scheme that wants an optional CUDA dependency selects it:
    deps = if_cuda(["//backends/cuda:device"])
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_PROBLEM", "NVCC")
load("//third_party/host:host.bzl", "requires")

# The GPUs Braid builds for: A100 (sm_80) and H100/H200 (sm_90) machine code, plus compute_90
# PTX that the driver can JIT for newer GPUs. CUDA 13 refuses anything below compute_75.
CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# Always optimised, whatever --compilation_mode says: device code at -O0 is too slow to test.
# -fPIC because Bazel may link these objects into a shared library (cc_test links dynamically);
# the .o names are taken as PIC objects because .bazelrc sets --force_pic.
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "--compiler-bindir=/usr/bin/g++",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wall",
]

# target_compatible_with for every CUDA-only target.
REQUIRES_CUDA = select({
    "//third_party/cuda:enabled": [],
    "//conditions:default": ["//third_party/cuda:needs_config_cuda"],
})

def if_cuda(if_true, if_false = []):
    """`if_true` under --config=cuda, `if_false` otherwise."""
    return select({
        "//third_party/cuda:enabled": if_true,
        "//conditions:default": if_false,
    })

_CU_EXTENSIONS = [".cu"]
_HEADER_EXTENSIONS = [".h", ".hh", ".hpp", ".cuh", ".inc"]

def _has_extension(name, extensions):
    for ext in extensions:
        if name.endswith(ext):
            return True
    return False

def _merged(compilation_contexts, field):
    return depset(transitive = [getattr(c, field) for c in compilation_contexts])

def _cuda_objects_impl(ctx):
    if not CUDA_AVAILABLE:
        fail("%s: --config=cuda needs the CUDA toolkit, but %s. Install CUDA 12+ there, or " %
             (ctx.label, CUDA_PROBLEM) + "point CUDA_PATH at it, or build without --config=cuda.")

    compilation_contexts = [dep[CcInfo].compilation_context for dep in ctx.attr.deps]
    headers = depset(
        ctx.files.hdrs,
        transitive = [c.headers for c in compilation_contexts],
    )

    # The include paths and defines a cc_library with the same deps would see. nvcc has no
    # -iquote, so quote includes become plain -I (only ever a superset of what #include "..."
    # would find).
    common = ctx.actions.args()
    common.add_all(CUDA_ARCH_FLAGS)
    common.add_all(NVCC_FLAGS)
    common.add_all(_merged(compilation_contexts, "defines"), format_each = "-D%s", uniquify = True)
    common.add_all(
        depset([".", ctx.bin_dir.path, ctx.genfiles_dir.path], transitive = [
            _merged(compilation_contexts, "quote_includes"),
            _merged(compilation_contexts, "includes"),
        ]),
        format_each = "-I%s",
        uniquify = True,
    )
    common.add_all(
        _merged(compilation_contexts, "system_includes"),
        before_each = "-isystem",
        uniquify = True,
    )
    common.add_all(ctx.attr.copts)

    objects = []
    seen = {}
    for src in ctx.files.srcs:
        stem = src.basename[:-len(".cu")]
        if stem in seen:
            fail("%s: two sources named %s.cu; object files would collide" % (ctx.label, stem))
        seen[stem] = True
        obj = ctx.actions.declare_file("_cuda_objs/%s/%s.o" % (ctx.label.name, stem))
        per_file = ctx.actions.args()
        per_file.add_all(["-c", src.path, "-o", obj.path])
        ctx.actions.run(
            executable = NVCC,
            arguments = [common, per_file],
            inputs = depset([src, ctx.file._cuda_version], transitive = [headers]),
            outputs = [obj],
            # nvcc finds cicc/ptxas/fatbinary next to itself; it needs the shell tools and the
            # host compiler from the standard places only.
            env = {"PATH": "/usr/bin:/bin"},
            mnemonic = "NvccCompile",
            progress_message = "Compiling CUDA %s" % src.short_path,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = _CU_EXTENSIONS),
        "hdrs": attr.label_list(allow_files = _HEADER_EXTENSIONS),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "_cuda_version": attr.label(
            default = "@local_cuda//:version.txt",
            allow_single_file = True,
        ),
    },
)

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc.

    Args:
      name: the cc_library's name.
      srcs: .cu files (compiled by nvcc, see CUDA_ARCH_FLAGS and NVCC_FLAGS), plus any .cc and
        private headers (compiled by the host C++ toolchain as in any cc_library).
      hdrs: public headers; the .cu files may include them and any header of `deps`.
      deps: cc_library dependencies; @local_cuda//:cudart is always added.
      copts: extra nvcc flags for the .cu files only.
      **kwargs: passed to the cc_library (alwayslink, visibility, testonly, linkopts, ...).
    """
    cu_srcs = [s for s in srcs if _has_extension(s, _CU_EXTENSIONS)]
    other_srcs = [s for s in srcs if not _has_extension(s, _CU_EXTENSIONS)]
    private_hdrs = [s for s in other_srcs if _has_extension(s, _HEADER_EXTENSIONS)]
    all_deps = deps + ["@local_cuda//:cudart"]

    # A library of host code only (.cc calling the CUDA runtime) has no nvcc step: an empty
    # object list is not a valid cc_library source.
    objects = []
    if cu_srcs:
        objects = [":" + name + "_cuda_objects"]
        _cuda_objects(
            name = name + "_cuda_objects",
            srcs = cu_srcs,
            hdrs = hdrs + private_hdrs,
            deps = all_deps,
            copts = copts,
            target_compatible_with = REQUIRES_CUDA,
            testonly = kwargs.get("testonly", False),
            visibility = ["//visibility:private"],
        )
    native.cc_library(
        name = name,
        srcs = other_srcs + objects,
        hdrs = hdrs,
        deps = all_deps,
        target_compatible_with = REQUIRES_CUDA,
        **kwargs
    )

def cuda_cc_test(
        name,
        gpu_cases = None,
        multi_gpu_cases = None,
        no_gpu_cases = None,
        tags = [],
        linkstatic = True,
        **kwargs):
    """cc_tests that only exist under --config=cuda (SKIPPED otherwise), tagged "cuda".

    The cases that need something of the machine's GPUs (--gtest_filter patterns) run in targets
    of their own, SKIPPED where the machine lacks it (third_party/host):
      `gpu_cases`       need a GPU:            `name_gpu`, with BRAID_REQUIRE_GPU=1;
      `multi_gpu_cases` need two GPUs:         `name_multi_gpu`, with BRAID_REQUIRE_GPU=2;
      `no_gpu_cases`    need a machine without one (what a program is told there):
                                               `name_no_gpu`, with BRAID_REQUIRE_NO_GPU=1.
    The variables make such a case fail, not skip, when what its target promises is not there
    (backends/cuda/gpu_test_env.h). The other cases run in `name`. `gpu_cases = "*"` means every
    case the other two lists leave: then no case remains for `name`, which is the binary alone
    (a cc_binary), not a test that would show PASSED having run nothing.

    Every binary holds every case: GPU machines have no Bazel, so a binary is built here and
    copied there with the few system .so files it needs (docs/GPU.md), where it runs
    unfiltered and a case whose need is not met GTEST_SKIPs saying why (unless the variables
    are set by hand). Linked statically by default (Braid's code inside the binary, not in
    Bazel's _solib folders) for that copy.
    """
    common = dict(tags = tags + ["cuda"], linkstatic = linkstatic, **kwargs)
    every_gpu_case = gpu_cases == "*"
    others = [p for p in [multi_gpu_cases, no_gpu_cases] if p]
    groups = [
        (
            "gpu",
            ("*-" + ":".join(others) if others else "*") if every_gpu_case else gpu_cases,
            ["gpu"],
            {"BRAID_REQUIRE_GPU": "1"},
        ),
        ("multi_gpu", multi_gpu_cases, ["multi_gpu"], {"BRAID_REQUIRE_GPU": "2"}),
        ("no_gpu", no_gpu_cases, ["no_gpu"], {"BRAID_REQUIRE_NO_GPU": "1"}),
    ]
    for suffix, cases, features, env in groups:
        if cases:
            native.cc_test(
                name = name + "_" + suffix,
                args = ["--gtest_filter=" + cases],
                env = env,
                target_compatible_with = REQUIRES_CUDA + requires(*features),
                **common
            )
    if every_gpu_case:
        test_only = ["size", "timeout", "flaky", "shard_count", "local"]
        native.cc_binary(
            name = name,
            testonly = True,
            target_compatible_with = REQUIRES_CUDA,
            **{k: v for k, v in common.items() if k not in test_only}
        )
        return
    special = [p for p in [gpu_cases, multi_gpu_cases, no_gpu_cases] if p]
    native.cc_test(
        name = name,
        args = ["--gtest_filter=-" + ":".join(special)] if special else [],
        target_compatible_with = REQUIRES_CUDA,
        **common
    )
