"""Repository rule that finds the CUDA toolkit (nvcc, cudart, cuBLAS, cuDNN, NCCL).

The default build needs no CUDA; `--config=cuda` builds the GPU targets. When the toolkit is
absent the repository still exists, with CUDA_AVAILABLE = False and empty targets, so that BUILD
files load everywhere; cuda.bzl then fails a `--config=cuda` build with a message that says why.
"""

# What a toolkit must have for Braid's GPU targets to build. A partial install (nvcc without the
# runtime, say) counts as absent, with the first missing piece named in defs.bzl's CUDA_PROBLEM.
_REQUIRED = ["bin/nvcc", "include/cuda_runtime.h", "lib64/libcudart.so"]

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda").rstrip("/")
    problem = ""
    for rel in _REQUIRED:
        if not ctx.path(root + "/" + rel).exists:
            problem = "%s/%s does not exist" % (root, rel)
            break
    available = problem == ""

    # The toolkit's release goes into version.txt, an input of every nvcc action: actions run
    # nvcc from outside the workspace, so without it a toolkit upgrade would keep serving stale
    # objects from the disk cache.
    version_text = "none"
    version = ""
    if available:
        result = ctx.execute([root + "/bin/nvcc", "--version"])
        if result.return_code != 0:
            available = False
            problem = "%s/bin/nvcc --version failed: %s" % (root, result.stderr.strip())
        else:
            version_text = result.stdout
            for line in result.stdout.splitlines():
                if "release " in line:
                    version = line.split("release ")[1].split(",")[0].strip()
    ctx.file("version.txt", version_text)

    ctx.file("defs.bzl", "\n".join([
        "# Written by //third_party/cuda:cuda_configure.bzl; do not edit.",
        "CUDA_AVAILABLE = %s" % available,
        "CUDA_PROBLEM = %r" % problem,
        "CUDA_ROOT = %r" % root,
        "CUDA_VERSION = %r" % version,
        "NVCC = %r" % (root + "/bin/nvcc"),
        "",
    ]))

    if available:
        ctx.symlink(root + "/include", "include")
        ctx.symlink(root + "/lib64", "lib64")
        build = """
package(default_visibility = ["//visibility:public"])

exports_files(["version.txt", "defs.bzl"])

# Extension-less headers too (nv/target, cuda/std/...): the toolkit's headers include them.
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

# The shared runtime, found at run time through the rpath. Never the driver stub in
# lib64/stubs: a binary that loads it reports "no driver" even on a machine with a GPU.
cc_library(
    name = "cudart",
    deps = [":cuda_headers"],
    linkopts = [
        "-L{root}/lib64",
        "-Wl,-rpath,{root}/lib64",
        "-lcudart",
        "-ldl",
        "-lrt",
        "-lpthread",
    ],
)

cc_library(
    name = "cublas",
    deps = [":cudart"],
    linkopts = ["-L{root}/lib64", "-lcublasLt", "-lcublas"],
)

cc_library(
    name = "cudnn",
    deps = [":cudart"],
    linkopts = ["-L{root}/lib64", "-lcudnn"],
)

cc_library(
    name = "nccl",
    deps = [":cudart"],
    linkopts = ["-L{root}/lib64", "-lnccl"],
)
""".format(root = root)
    else:
        build = """
package(default_visibility = ["//visibility:public"])

exports_files(["version.txt", "defs.bzl"])

# No CUDA toolkit ({problem}): empty stand-ins, so that BUILD files referring to them load.
[cc_library(name = n) for n in ["cuda_headers", "cudart", "cublas", "cudnn", "nccl"]]
""".format(problem = problem)
    ctx.file("BUILD", build)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
