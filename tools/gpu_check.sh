#!/usr/bin/env bash
# The GPU checks, run from an unpacked bundle on a GPU machine: no Bazel, no build there
# (tools/gpu_bundle.sh makes the bundle; docs/GPU.md says how to carry and read it).
#
#   braid-gpu/gpu_check.sh [--out DIR] [--steps N] [--bench_steps N] [--rounds N]
#
# Writes DIR/gpu_check.json (one entry per check: passed, failed, skipped or "not run", with its
# figures) and DIR/gpu_check.log (everything printed), default DIR ./gpu-check-<time>:
#   unit:<binary>      every CUDA test binary in tests/ (all its cases; gtest's counts);
#   allocator_streams  cuda_runtime_test's GPU cases (the caching allocator's stream-ordered
#                      reuse, copies, the prefetcher's ordering), required to run, not skip;
#   gpt_mini_f32/bf16  gpt-mini for --steps (200) on one GPU, losses against reference/ (the same
#                      run on the build machine's CPU): the first step within 1%, the mean of the
#                      last 50 steps within 2% (bf16 against f32 on the CPU differs by ~1% over a
#                      single seed, docs/BENCHMARKS.md; a wrong kernel is off by far more);
#   gpt2_124m          GPT-2 124M, B = 16, T = 1024, bf16: Braid, then PyTorch eager and
#                      torch.compile (gpt2_torch_bench.py), alternated --rounds (2) times;
#                      tokens/s, MFU, peak memory, and Braid's ratio to each;
#   nccl_2proc         DDP over NCCL on 2 GPUs: "not run" with one GPU.
# Budget: under 8 minutes on an H100 (each step has its own timeout). Exits 0 only if every
# check ran and passed. Without a GPU it says so, writes every check as "not run", and exits 1.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$PWD/gpu-check-$(date -u +%Y%m%d-%H%M%S)"
steps=200
bench_steps=20
rounds=2
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --bench_steps) bench_steps="${2:?}"; shift 2 ;;
    --rounds) rounds="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$steps" "$bench_steps" "$rounds"; do
  case "$v" in ''|*[!0-9]*|0) echo "gpu_check: --steps, --bench_steps and --rounds want positive numbers, got '$v'" >&2; exit 2 ;; esac
done
mkdir -p "$out" || { echo "gpu_check: cannot create $out" >&2; exit 2; }
out="$(cd "$out" && pwd)"
json="$out/gpu_check.json"
log="$out/gpu_check.log"
exec > >(tee -a "$log") 2>&1
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t0=$(date +%s)

# ---- results --------------------------------------------------------------------------------
jstr() {  # a JSON string of $1
  local s="$1"
  s="${s//\\/\\\\}"; s="${s//\"/\\\"}"; s="${s//$'\n'/\\n}"; s="${s//$'\t'/\\t}"; s="${s//$'\r'/}"
  printf '"%s"' "$(printf '%s' "$s" | tr -d '\000-\010\013\014\016-\037')"
}
entries=()
failed=0
record() {  # name status detail [extra JSON members, already formatted, without braces]
  local extra="${4:-}"
  entries+=("{\"name\": $(jstr "$1"), \"status\": $(jstr "$2"), \"detail\": $(jstr "$3")${extra:+, $extra}}")
  [ "$2" = passed ] || failed=1
  printf 'gpu_check: %-24s %-8s %s\n' "$1" "$2" "$3"
}
write_json() {  # gpu_json reason
  {
    printf '{\n  "tool": "gpu_check.sh",\n  "started": %s,\n  "finished": %s,\n  "seconds": %s,\n' \
      "$(jstr "$started")" "$(jstr "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" "$(( $(date +%s) - t0 ))"
    printf '  "bundle": %s,\n  "gpu": %s,\n  "not_run_reason": %s,\n  "checks": [\n' \
      "$(jstr "$(tr '\n' ' ' < "$here/BUNDLE_INFO" 2>/dev/null)")" "$1" "$(jstr "$2")"
    local i
    for i in "${!entries[@]}"; do
      printf '    %s%s\n' "${entries[$i]}" "$([ "$i" -lt $(( ${#entries[@]} - 1 )) ] && echo ,)"
    done
    printf '  ],\n  "all_passed": %s\n}\n' "$([ "$failed" = 0 ] && echo true || echo false)"
  } > "$json"
  echo "gpu_check: results in $json, log in $log"
}
unit_tests=()
if [ -d "$here/tests" ]; then
  for t in "$here"/tests/*; do [ -x "$t" ] && unit_tests+=("$(basename "$t")"); done
fi
all_checks=()
for t in "${unit_tests[@]+"${unit_tests[@]}"}"; do all_checks+=("unit:$t"); done
all_checks+=(allocator_streams gpt_mini_f32 gpt_mini_bf16 gpt2_124m nccl_2proc)
not_run_all() {  # reason
  local c
  for c in "${all_checks[@]}"; do record "$c" "not run" "$1"; done
  write_json null "$1"
  echo "gpu_check: NOT RUN: $1"
  exit 1
}

# ---- the bundle, the environment, the GPU ---------------------------------------------------
echo "gpu_check: bundle $here, results $out"
[ -f "$here/BUNDLE_INFO" ] && [ -x "$here/bin/train" ] ||
  not_run_all "no bundle at $here (no BUNDLE_INFO or bin/train): make one with tools/gpu_bundle.sh and run braid-gpu/gpu_check.sh from it"
# shellcheck source=/dev/null
source "$here/env.sh"
ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
[ "$ngpu" -ge 1 ] || not_run_all "no usable NVIDIA GPU here (nvidia-smi missing or lists no GPU)"
grep -q '^cuda=1' "$here/BUNDLE_INFO" ||
  not_run_all "this bundle was built with --cpu_only: build it without that option for a GPU"
[ -z "${BRAID_ENV_PROBLEMS:-}" ] || not_run_all "env.sh: $BRAID_ENV_PROBLEMS"
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu_json="{\"count\": $ngpu, \"name\": $(jstr "$gpu_name"), \"driver\": $(jstr "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"), \"memory\": $(jstr "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader 2>/dev/null | head -1)")}"
echo "gpu_check: $ngpu GPU(s): $gpu_name"
# The first GPU (two for the NCCL run), unless the caller chose.
if [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then
  export CUDA_VISIBLE_DEVICES=0
  [ "$ngpu" -ge 2 ] && export CUDA_VISIBLE_DEVICES=0,1
fi
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"

# ---- 1. the CUDA test binaries, every case ---------------------------------------------------
gtest_counts() {  # output file -> "passed failed skipped"
  local p f s
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$1" | tail -1)
  echo "${p:-0} ${f:-0} ${s:-0}"
}
run_gtest() {  # check name, binary, timeout, gtest args...
  local name="$1" bin="$2" limit="$3"; shift 3
  local o="$out/$name.out"; o="${o//:/_}"
  ( cd "$out" && BRAID_REQUIRE_GPU=1 timeout -k 10 "$limit" "$bin" "$@" ) > "$o" 2>&1
  local rc=$? p f s
  read -r p f s <<<"$(gtest_counts "$o")"
  local figures="\"passed_cases\": $p, \"failed_cases\": $f, \"skipped_cases\": $s, \"exit\": $rc"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    record "$name" failed "timed out after ${limit}s; see $(basename "$o")" "$figures"
  elif [ "$rc" != 0 ] || [ "$f" != 0 ]; then
    record "$name" failed "exit $rc, $f case(s) failed: $(grep '^\[  FAILED  \] [A-Za-z]' "$o" | grep -v ' ms)$' | sed 's/^\[  FAILED  \] //' | head -5 | xargs); see $(basename "$o")" "$figures"
  elif [ "$p" = 0 ]; then
    record "$name" skipped "no case ran ($s skipped): $(grep -m1 -A1 'SKIPPED\|Skipped' "$o" | tail -1 | cut -c1-200)" "$figures"
  else
    record "$name" passed "$p passed, $s skipped (cases needing more GPUs or none)" "$figures"
  fi
}
for t in "${unit_tests[@]+"${unit_tests[@]}"}"; do
  run_gtest "unit:$t" "$here/tests/$t" 180
done

# ---- 2. the caching allocator and stream ordering on the device ------------------------------
if [ -x "$here/tests/cuda_runtime_test" ]; then
  run_gtest allocator_streams "$here/tests/cuda_runtime_test" 120 --gtest_filter='CudaRuntimeGpuTest.*'
  grep -q '^\[  SKIPPED \]' "$out/allocator_streams.out" &&
    { failed=1; echo "gpu_check: allocator_streams: a case skipped on a GPU machine"; }
else
  record allocator_streams failed "tests/cuda_runtime_test is not in the bundle"
fi

# ---- 3. gpt-mini on one GPU against the CPU reference ----------------------------------------
make_config() {  # source config, destination, extra lines...
  local src="$1" dst="$2"; shift 2
  grep -v -E '^(device|steps|threads|communicator):' "$src" > "$dst"
  printf 'device: "cuda"\n' >> "$dst"
  local line; for line in "$@"; do echo "$line" >> "$dst"; done
}
losses() { sed -n 's/.*"loss": *\([-+0-9.eEnaifNAIF]*\).*/\1/p' "$1"; }
compare_losses() {  # gpu metrics, cpu reference -> prints a verdict line, returns 0 if within
  paste -d' ' <(losses "$1") <(losses "$2") | awk -v tail=50 '
    NF == 2 { n++; g[n] = $1; c[n] = $2 }
    END {
      if (n < 1) { print "no common steps"; exit 1 }
      for (i = 1; i <= n; i++) if (g[i] != g[i] + 0 || g[i] "" ~ /nan|inf/) { print "non-finite loss at step " i - 1; exit 1 }
      first = (g[1] - c[1]) / c[1]; if (first < 0) first = -first
      k = (n < tail) ? n : tail; sg = 0; sc = 0
      for (i = n - k + 1; i <= n; i++) { sg += g[i]; sc += c[i] }
      last = (sg - sc) / sc; if (last < 0) last = -last
      printf "%d steps compared; first loss GPU %.5f CPU %.5f (%.3f%%); mean of last %d GPU %.5f CPU %.5f (%.3f%%)\n", n, g[1], c[1], 100 * first, k, sg / k, sc / k, 100 * last
      exit !(first <= 0.01 && last <= 0.02)
    }'
}
gpt_mini() {  # precision (f32|bf16)
  local p="$1" name="gpt_mini_$1" cfg="$here/configs/gpt-mini.pbtxt"
  [ "$p" = bf16 ] && cfg="$here/configs/gpt-mini-bf16.pbtxt"
  local ref="$here/reference/gpt-mini-cpu-$p.jsonl"
  [ -f "$ref" ] || { record "$name" failed "no CPU reference in the bundle ($ref): build it without --no_reference"; return; }
  local ref_steps; ref_steps=$(grep -c '"step"' "$ref")
  local n=$(( steps < ref_steps ? steps : ref_steps ))
  make_config "$cfg" "$out/$name.pbtxt"
  ( cd "$out" && timeout -k 10 300 "$here/bin/train" --config="$out/$name.pbtxt" --steps="$n" \
      --log_dir="$out/$name" ) > "$out/$name.out" 2>&1
  local rc=$?
  if [ "$rc" != 0 ] || ! grep -q '^braid: done: ' "$out/$name.out"; then
    record "$name" failed "training exited $rc: $(grep -v '^ ' "$out/$name.out" | tail -1 | cut -c1-300)"
    return
  fi
  local verdict; verdict=$(compare_losses "$out/$name/metrics.jsonl" "$ref")
  local ok=$? summary; summary=$(grep '"summary"' "$out/$name/metrics.jsonl" | tail -1)
  record "$name" "$([ $ok = 0 ] && echo passed || echo failed)" "$verdict (bounds: 1% first, 2% last-50 mean)" \
    "\"steps\": $n, \"summary\": ${summary:-null}"
}
gpt_mini f32
gpt_mini bf16

# ---- 4. GPT-2 124M, bf16, B = 16, T = 1024: Braid beside PyTorch eager and torch.compile -------
cat > "$out/gpt2.pbtxt" <<CFG
model { name: "gpt2-124m" block_size: 1024 }
data { dataset: "moby-dick" sampler: "random" seed: 1234 }
train_micro_batch_size_per_gpu: 16
optimizer { type: "AdamW" params { lr: 6e-4 betas: [0.9, 0.95] eps: 1e-8 weight_decay: 0.1 } }
strategy { name: "single" }
bf16 { enabled: true }
device: "cuda"
log { print_every: 5 }
CFG
braid_runs=(); torch_runs=(); bench_ok=1
for ((r = 1; r <= rounds; r++)); do
  ( cd "$out" && timeout -k 10 150 "$here/bin/train" --config="$out/gpt2.pbtxt" --steps="$bench_steps" \
      --log_dir="$out/gpt2-braid-$r" ) > "$out/gpt2-braid-$r.out" 2>&1
  s=$(grep '"summary"' "$out/gpt2-braid-$r/metrics.jsonl" 2>/dev/null | tail -1)
  if [ -n "$s" ]; then braid_runs+=("$s"); else bench_ok=0; echo "gpu_check: Braid's GPT-2 run $r failed: $(tail -2 "$out/gpt2-braid-$r.out")"; fi
  timeout -k 10 240 "${BRAID_PYTHON:-python3}" "$here/gpt2_torch_bench.py" --steps "$bench_steps" \
    --batch 16 --seq 1024 --dtype bf16 --modes eager,compile --json "$out/gpt2-torch-$r.json" \
    > "$out/gpt2-torch-$r.out" 2>&1
  if [ -s "$out/gpt2-torch-$r.json" ]; then torch_runs+=("$(cat "$out/gpt2-torch-$r.json")"); else bench_ok=0; echo "gpu_check: PyTorch's GPT-2 run $r failed: $(tail -2 "$out/gpt2-torch-$r.out")"; fi
done
median_of() {  # key, JSON objects... -> median of that number
  local key="$1"; shift
  printf '%s\n' "$@" | sed -n "s/.*\"$key\": *\([0-9.eE+-]*\).*/\1/p" | sort -g |
    awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}
b_tps=$(median_of median_tokens_per_s "${braid_runs[@]+"${braid_runs[@]}"}")
e_tps=$(median_of eager_tokens_per_s "${torch_runs[@]+"${torch_runs[@]}"}")
c_tps=$(median_of compile_tokens_per_s "${torch_runs[@]+"${torch_runs[@]}"}")
detail="Braid ${b_tps:-?} tokens/s, PyTorch eager ${e_tps:-?}, torch.compile ${c_tps:-?}"
if [ -n "$b_tps" ] && [ -n "$e_tps" ] && [ -n "$c_tps" ]; then
  detail+="; Braid/eager $(awk -v a="$b_tps" -v b="$e_tps" 'BEGIN {printf "%.2f", a / b}')x, Braid/compile $(awk -v a="$b_tps" -v b="$c_tps" 'BEGIN {printf "%.2f", a / b}')x (goals 1.2x, 1.0x)"
fi
join() { local IFS=,; echo "$*"; }
record gpt2_124m "$([ "$bench_ok" = 1 ] && echo passed || echo failed)" "$detail" \
  "\"rounds\": $rounds, \"steps\": $bench_steps, \"braid\": [$(join "${braid_runs[@]+"${braid_runs[@]}"}")], \"pytorch\": [$(join "${torch_runs[@]+"${torch_runs[@]}"}")]"

# ---- 5. two processes over NCCL -------------------------------------------------------------
if [ "$ngpu" -lt 2 ]; then
  record nccl_2proc "not run" "one GPU: NCCL refuses two ranks on one GPU"
else
  make_config "$here/configs/gpt-mini-ddp.pbtxt" "$out/ddp.pbtxt" 'communicator: "nccl"'
  ( cd "$out" && timeout -k 10 240 "$here/bin/launcher" --nproc_per_node=2 --config="$out/ddp.pbtxt" \
      --steps=20 --log_dir="$out/nccl_2proc" ) > "$out/nccl_2proc.out" 2>&1
  rc=$?
  if [ "$rc" = 0 ] && grep -q 'braid: done: ' "$out/nccl_2proc.out"; then
    record nccl_2proc passed "$(grep 'braid: done: ' "$out/nccl_2proc.out" | head -1)"
  else
    record nccl_2proc failed "exit $rc: $(tail -1 "$out/nccl_2proc.out" | cut -c1-300)"
  fi
fi

write_json "$gpu_json" ""
echo "gpu_check: $( [ "$failed" = 0 ] && echo 'every check passed' || echo 'NOT every check passed') in $(( $(date +%s) - t0 )) s"
exit "$failed"
