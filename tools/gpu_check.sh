#!/usr/bin/env bash
# The GPU checks of the CUDA path (docs/GPU.md), for a machine with NVIDIA GPUs and Bazel:
#   1. bazel build --config=cuda //backends/... //launcher/...
#   2. every CUDA test, //backends/cuda/... and //backends/nccl/... (the *_gpu and *_multi_gpu
#      targets fail, not skip, when their GPUs are missing)
#   3. gpt-mini for a few steps on one GPU (device "cuda"), then on every GPU with DDP over NCCL
#      (--nproc_per_node = the number of GPUs nvidia-smi lists)
#   4. GPT-2 124M, B = 16, T = 1024: Braid's tokens/s beside PyTorch eager's on the same GPU
#      (tools/bench/gpt2_gpu_bench.py), with MFU against the GPU's dense bf16/f32 peak.
# Without a GPU (or without Bazel) it says plainly what it could not do and exits 1; it never
# reports a check it did not run as passed. Never run by CI.
#
#   tools/gpu_check.sh [--steps N] [--bench_steps N]
set -uo pipefail
cd "$(dirname "$0")/.."

steps=10
bench_steps=20
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --bench_steps) bench_steps="$2"; shift 2 ;;
    *) echo "gpu_check: unknown argument '$1' (use --steps N, --bench_steps N)" >&2; exit 2 ;;
  esac
done

not_done="build --config=cuda, the CUDA tests, gpt-mini on 1 and on all GPUs, the GPT-2 124M benchmark"
ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [ "$ngpu" -lt 1 ]; then
  echo "gpu_check: NOT RUN: no usable NVIDIA GPU here (nvidia-smi missing or lists no GPU)."
  echo "gpu_check: not done: $not_done."
  exit 1
fi
if ! command -v bazel >/dev/null 2>&1; then
  echo "gpu_check: NOT RUN: $ngpu GPU(s) found but no Bazel on this machine."
  echo "gpu_check: not done: $not_done."
  echo "gpu_check: build on a machine with Bazel and copy the binaries (docs/GPU.md, 'Running on a GPU machine')."
  exit 1
fi

results=()
rc=0
record() {  # name, status (PASSED/FAILED), detail
  results+=("$1 $2${3:+ ($3)}")
  [ "$2" = PASSED ] || rc=1
}

echo "== gpu_check: $ngpu GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"

echo "== 1. bazel build --config=cuda //backends/... //launcher/..."
if bazel build --config=cuda //backends/... //launcher/...; then
  record build PASSED
else
  record build FAILED "nothing else can run"
  printf '%s\n' "${results[@]}"
  exit 1
fi

# The *_gpu and *_multi_gpu targets require their GPUs themselves (third_party/cuda/cuda.bzl).
echo "== 2. CUDA tests (the GPU cases in *_gpu and *_multi_gpu targets, which must run)"
if bazel test --config=cuda --test_output=errors \
     //backends/cuda/... //backends/nccl/...; then
  record cuda_tests PASSED "bazel test --config=cuda //backends/cuda/... //backends/nccl/..."
else
  record cuda_tests FAILED "see bazel-testlogs/backends/"
fi

# A config from a checked-in one with device and steps replaced (and the lines given appended).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make_config() {  # source, destination, extra lines...
  local src="$1" dst="$2"; shift 2
  grep -v -E '^(device|steps|communicator|threads):' "$src" > "$dst"
  printf 'device: "cuda"\nsteps: %s\n' "$steps" >> "$dst"
  for line in "$@"; do echo "$line" >> "$dst"; done
}

echo "== 3a. gpt-mini, $steps steps on one GPU"
make_config launcher/configs/gpt-mini.pbtxt "$tmp/one.pbtxt"
if bazel run --config=cuda //launcher -- --config="$tmp/one.pbtxt" 2>&1 | tee "$tmp/one.log"; \
   grep -q '^braid: done: ' "$tmp/one.log"; then
  record gpt_mini_1gpu PASSED "$(grep '^braid: done: ' "$tmp/one.log")"
else
  record gpt_mini_1gpu FAILED "see the output above"
fi

echo "== 3b. gpt-mini, $steps steps on $ngpu GPU(s), DDP over NCCL"
make_config launcher/configs/gpt-mini-ddp.pbtxt "$tmp/ddp.pbtxt" 'communicator: "nccl"'
if bazel run --config=cuda //launcher -- --nproc_per_node="$ngpu" --config="$tmp/ddp.pbtxt" 2>&1 \
     | tee "$tmp/ddp.log"; grep -q 'braid: done: ' "$tmp/ddp.log"; then
  record gpt_mini_nccl PASSED "$ngpu GPUs: $(grep 'braid: done: ' "$tmp/ddp.log" | head -1)"
else
  record gpt_mini_nccl FAILED "see the output above"
fi

echo "== 4. GPT-2 124M, B=16, T=1024: Braid, then PyTorch eager"
steps="$bench_steps"
make_config launcher/configs/gpt-mini.pbtxt "$tmp/gpt2.pbtxt"
sed -i -e 's/name: "gpt-mini"/name: "gpt2-124m" block_size: 1024/' "$tmp/gpt2.pbtxt"
if bazel run --config=cuda //launcher -- --config="$tmp/gpt2.pbtxt" 2>&1 | tee "$tmp/gpt2.log"; \
   grep -q '^braid: done: ' "$tmp/gpt2.log"; then
  braid_tps=$(sed -n 's/^braid: done: .* median \([0-9]*\) .*/\1/p' "$tmp/gpt2.log")
  record gpt2_braid PASSED "median ${braid_tps} tokens/s"
else
  braid_tps=""
  record gpt2_braid FAILED "see the output above"
fi
if python3 tools/bench/gpt2_gpu_bench.py --steps "$bench_steps" --batch 16 --seq 1024 \
     ${braid_tps:+--braid_tokens_per_s "$braid_tps"} | tee "$tmp/torch.log"; then
  record gpt2_torch PASSED "$(tail -1 "$tmp/torch.log")"
else
  record gpt2_torch FAILED "tools/bench/gpt2_gpu_bench.py failed (PyTorch with CUDA installed?)"
fi

echo "== gpu_check summary"
printf '%s\n' "${results[@]}"
exit "$rc"
