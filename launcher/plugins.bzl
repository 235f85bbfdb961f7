"""The plugins a training program loads at run time: the data of //launcher:train and of a
user's own training program (launcher/session.h), which finds them in its runfiles."""

load("//third_party/cuda:cuda.bzl", "if_cuda")

def training_plugins():
    return [
        "//backends/gloo:libbraid_gloo.so",
        "//plugins/adam8bit:libbraid_adam8bit.so",
        "//plugins/checkpoint:libbraid_checkpoint.so",
        "//plugins/lamb:libbraid_lamb.so",
        "//plugins/ddp:libbraid_ddp.so",
        "//plugins/dp:libbraid_dp.so",
        "//plugins/paramserver:libbraid_paramserver.so",
        "//plugins/single:libbraid_single.so",
        "//plugins/tensor_parallel:libbraid_tensor_parallel.so",
        "//plugins/pipeline:libbraid_pipeline.so",
        "//plugins/zero:libbraid_zero.so",
    ] + if_cuda(["//backends/nccl:libbraid_nccl.so"])
