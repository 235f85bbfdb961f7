#!/usr/bin/env bash
# Tensor parallelism over Gloo, real processes through the launcher and the training program
# (the mesh's groups, the plan's split of gpt-mini, the vocabulary-parallel loss, slices gathered
# for --save_to), against one process on the same global batch. Plain SGD with weight decay and
# gradient clipping at 0.5 that binds (gpt-mini's norm starts near 1.4; a norm that counts a
# replicated weight twice, or misses another rank's slices, clips differently and moves the
# weights by ~1e-4), 3 steps, the sequential loader making replicas' rows the one process's:
#   tensor 2 and 4 (around single), tensor 2 x data 2 (DDP, and ZeRO stages 1 and 2 on the data axis),
#   tensor 2 x pipeline 2 x data 2 (8 processes, 1F1B; and with ZeRO-1 and 2 on the data axis); with
#   sequence parallelism, tensor 2 and
#   tensor 2 x pipeline 2 x data 2.
# Tolerance 2e-6 on the weights: each split matrix product sums its terms in t parts and an
# all-reduce adds them in another order, float32 rounding that 3 SGD steps carry (measured: at
# most 4e-7, see the closing note of the tensor-parallel issue).
set -uo pipefail
L="$TEST_SRCDIR/braid/launcher/launcher"
TR="$TEST_SRCDIR/braid/launcher/train"
CMP="$TEST_SRCDIR/braid/tests/testing/compare_weights.py"
T="${TEST_TMPDIR:-$(mktemp -d)}/tp_eq"
rm -rf "$T"; mkdir -p "$T"
fails=0
cfg() {  # FILE MICRO ACCUM SECTIONS
  cat > "$1" <<CFG
model { name: "gpt-mini" }
data { dataset: "moby-dick" sampler: "sequential" }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: $3
steps: 3
gradient_clipping: 8
optimizer { type: "SGD" params { lr: 0.1 weight_decay: 0.1 } }
$4
CFG
}
run() {  # NAME NPROC CFG
  timeout 400 "$L" --nproc_per_node=$2 --log_dir="$T/$1.logs" -- --config="$3" \
    --save_to="$T/$1.safetensors" --log_dir="$T/$1" > "$T/$1.out" 2>&1 ||
    { echo "FAIL $1: launcher exited $?"; tail -15 "$T/$1.out"; fails=$((fails+1)); }
}
compare() {  # NAME A B TOL
  if /usr/bin/python3 "$CMP" "$2" "$3" "$4"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails+1)); fi
}

cfg "$T/single.pbtxt" 4 4 'strategy { name: "single" }'
"$TR" --config="$T/single.pbtxt" --save_to="$T/single.safetensors" --log_dir="$T/single" > "$T/single.out" 2>&1 ||
  { echo "FAIL single run"; tail -5 "$T/single.out"; exit 1; }
cfg "$T/t2.pbtxt" 4 4 'parallel { tensor: 2 } strategy { name: "single" }';      run t2 2 "$T/t2.pbtxt"
cfg "$T/t4.pbtxt" 4 4 'parallel { tensor: 4 } strategy { name: "single" }';      run t4 4 "$T/t4.pbtxt"
cfg "$T/t2d2.pbtxt" 2 4 'parallel { tensor: 2 data: 2 } strategy { name: "ddp" }'; run t2d2 4 "$T/t2d2.pbtxt"
cfg "$T/t2z1.pbtxt" 2 4 'parallel { tensor: 2 data: 2 } strategy { name: "zero" } zero_optimization { stage: 1 }'
run t2d2_zero1 4 "$T/t2z1.pbtxt"
cfg "$T/t2z2.pbtxt" 2 4 'parallel { tensor: 2 data: 2 } strategy { name: "zero" } zero_optimization { stage: 2 }'
run t2d2_zero2 4 "$T/t2z2.pbtxt"
cfg "$T/t2p2d2.pbtxt" 2 4 'parallel { tensor: 2 pipeline: 2 data: 2 } strategy { name: "pipeline" }'
run t2p2d2 8 "$T/t2p2d2.pbtxt"
cfg "$T/t2p2d2z1.pbtxt" 2 4 'parallel { tensor: 2 pipeline: 2 data: 2 } strategy { name: "pipeline" } zero_optimization { stage: 1 }'
run t2p2d2_zero1 8 "$T/t2p2d2z1.pbtxt"
cfg "$T/t2p2d2z2.pbtxt" 2 4 'parallel { tensor: 2 pipeline: 2 data: 2 } strategy { name: "pipeline" } zero_optimization { stage: 2 }'
run t2p2d2_zero2 8 "$T/t2p2d2z2.pbtxt"
# Sequence parallelism: tensor 2, and tensor 2 x pipeline 2 x data 2.
cfg "$T/t2sp.pbtxt" 4 4 'parallel { tensor: 2 sequence_parallel: true } strategy { name: "single" }'
run t2_sp 2 "$T/t2sp.pbtxt"
cfg "$T/t2p2d2sp.pbtxt" 2 4 'parallel { tensor: 2 pipeline: 2 data: 2 sequence_parallel: true } strategy { name: "pipeline" }'
run t2p2d2_sp 8 "$T/t2p2d2sp.pbtxt"
for n in t2 t4 t2d2 t2d2_zero1 t2d2_zero2 t2p2d2 t2p2d2_zero1 t2p2d2_zero2 t2_sp t2p2d2_sp; do
  compare "$n == one process" "$T/$n.safetensors" "$T/single.safetensors" 2e-6
done
# The clipping bound binds on the first step (the one process's norm is above 8) and not on the
# last: both the clipped and the plain update are compared.
/usr/bin/python3 - "$T/single/metrics.jsonl" <<'PY' || { echo "FAIL: clipping does not bind on step 0 only"; fails=$((fails+1)); }
import json, sys
n = [json.loads(l)["grad_norm"] for l in open(sys.argv[1]) if '"step"' in l]
assert n[0] > 8 and n[-1] < 8, n
PY
# Every tensor-parallel run reports the same norms as the one process (6 significant digits).
/usr/bin/python3 - "$T" <<'PY' || { echo "FAIL: gradient norms differ"; fails=$((fails+1)); }
import json, sys
def norms(path):
    return [json.loads(l)["grad_norm"] for l in open(path) if '"step"' in l]
want = norms(f"{sys.argv[1]}/single/metrics.jsonl")
for run in ("t2", "t4", "t2d2", "t2d2_zero1", "t2d2_zero2", "t2p2d2", "t2p2d2_zero1", "t2p2d2_zero2", "t2_sp", "t2p2d2_sp"):
    got = norms(f"{sys.argv[1]}/{run}/metrics.jsonl")
    assert len(got) == len(want) and all(abs(a - b) <= 1e-5 * b for a, b in zip(got, want)), (run, got, want)
print("   gradient norms:", want)
PY
# The layout and the split are reported.
grep -q "layout tensor 2 x pipeline 2 x data 2" "$T/t2p2d2.out" &&
  grep -q "^braid: tensor parallel: 2 ranks, plan gpt: 1648640 of 3257856 parameters" "$T/t2.out" ||
  { echo "FAIL: no layout or split in the output"; fails=$((fails+1)); }
# An impossible layout is refused at start, in one line naming the sizes.
cfg "$T/bad.pbtxt" 4 4 'parallel { tensor: 2 pipeline: 2 data: 2 }'
"$L" --nproc_per_node=2 --log_dir="$T/bad.logs" -- --config="$T/bad.pbtxt" --log_dir="$T/bad" > "$T/bad.out" 2>&1
grep -q "parallel layout tensor 2 x pipeline 2 x data 2 = 8 ranks, but there are 2 processes" "$T/bad.out" ||
  { echo "FAIL: impossible layout not refused clearly"; cat "$T/bad.out"; fails=$((fails+1)); }
[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
