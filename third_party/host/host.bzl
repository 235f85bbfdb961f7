"""`requires(...)`: target_compatible_with for tests that need something of the machine.

    sh_test(name = "twonode_test", ..., target_compatible_with = requires("netns"))

Features (found by host_configure.bzl): "data" (tools/setup.sh's data sets), "tokenizer_data"
(GPT-2's vocabulary and the npm reference tokenizers tools/setup.sh installs, and node),
"netns" (root with network-admin rights), "ipv6" (an IPv6 loopback), "torch" (Debian's PyTorch), "matplotlib"
(Debian's, for tools/plot_metrics.py), "gpu" (at least one NVIDIA GPU), "multi_gpu" (two or
more), "no_gpu" (none: for the cases that check what a program without one is told),
"dev_full" (/dev/full), "shm_limit" (a size-limited /dev/shm), "mount_tmpfs" (a tmpfs mounted
in a private mount namespace), "empty_root" (a chroot with its own /proc in private mount and PID namespaces, as root or in a user namespace), "x86_64", "avx2" (AVX2, FMA and F16C), "openmpi"
(mpirun.openmpi), "mpich" (mpiexec.mpich), "sshd" (OpenSSH's server and client), "slurm"
(Debian's slurmctld, slurmd, sbatch and munged).

A test that needs one of these must not exit 0 (or GTEST_SKIP) without it, which Bazel 4.2
would show as PASSED: it lives in a target that requires it, and inside that target a missing
feature is a failure.
"""

load("@braid_host//:defs.bzl", "HOST")

def requires(*features):
    missing = []
    for f in features:
        if f not in HOST:
            fail("requires(%r): unknown feature; known: %s" % (f, sorted(HOST.keys())))
        if not HOST[f]:
            missing.append("//third_party/host:missing_" + f)
    return missing

def has(feature):
    return HOST[feature]

def cc_test_with_host_cases(name, host_cases, features, **kwargs):
    """A cc_test whose cases `host_cases` (a --gtest_filter pattern) need `features`.

    Two targets from one source: `name` runs every other case anywhere; `name_<features>` runs
    those cases and is SKIPPED where the machine lacks a feature. Inside it the cases must fail,
    not skip, when what they need is missing: the target promises it is there.
    """
    native.cc_test(name = name, args = ["--gtest_filter=-" + host_cases], **kwargs)
    native.cc_test(
        name = name + "_" + "_".join(features),
        args = ["--gtest_filter=" + host_cases],
        target_compatible_with = requires(*features),
        **kwargs
    )
