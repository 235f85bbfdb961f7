"""Repository rule that finds the CUDA toolkit (nvcc, cudart, cuBLAS, cuDNN, NCCL).

The default build needs no CUDA; `--config=cuda` builds the GPU targets. When the toolkit is
absent the repository still exists, with CUDA_AVAILABLE = False, so that BUILD files load.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    available = nvcc.exists
    if available:
        ctx.symlink(root + "/include", "include")
        ctx.symlink(root + "/lib64", "lib64")
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_ROOT = %r\nNVCC = %r\n" % (
        available,
        root,
        str(nvcc),
    ))
    if available:
        build = """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)
cc_library(
    name = "cudart",
    deps = [":cuda_headers"],
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcudart", "-ldl", "-lrt", "-lpthread"],
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
[cc_library(name = n) for n in ["cuda_headers", "cudart", "cublas", "cudnn", "nccl"]]
"""
    ctx.file("BUILD", build)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
