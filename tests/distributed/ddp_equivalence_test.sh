#!/usr/bin/env bash
# DDP over Gloo, real processes through the launcher, against one process on the same global
# batch: N ranks with micro-batch b (and accumulation k) must reach the parameters one process
# reaches with batch N*k*b. The sequential loader makes that the same data: rank r of N reads
# rows [r*b, (r+1)*b) of each N*b-row block, which one process reads as one batch. MNIST's
# distributed sampler gives the ranks disjoint halves of the same samples the single run takes.
set -uo pipefail
L="$TEST_SRCDIR/braid/launcher/launcher"
TR="$TEST_SRCDIR/braid/launcher/train"
T="${TEST_TMPDIR:-$(mktemp -d)}/ddp_eq"
rm -rf "$T"; mkdir -p "$T"
fails=0
gpt_cfg() {  # FILE MICRO ACCUM STRATEGY
  cat > "$1" <<CFG
model { name: "gpt-mini" }
data { dataset: "moby-dick" sampler: "sequential" }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: $3
steps: 5
optimizer { type: "AdamW" params { lr: 1e-3 betas: [0.9, 0.95] eps: 1e-8 weight_decay: 0.1 } }
strategy { name: "$4" }
CFG
}
mlp_cfg() {  # FILE MICRO STRATEGY OPTIMIZER
  local opt='type: "SGD" params { lr: 0.1 momentum: 0.9 }'
  [ "$4" = adamw ] && opt='type: "AdamW" params { lr: 1e-3 }'
  cat > "$1" <<CFG
model { name: "mlp" }
data { dataset: "mnist" seed: 7 }
train_micro_batch_size_per_gpu: $2
steps: 5
optimizer { $opt }
strategy { name: "$3" }
CFG
}
run_single() {  # NAME CFG
  "$TR" --config="$2" --save_to="$T/$1.safetensors" --log_dir="$T/$1" > "$T/$1.out" 2>&1 ||
    { echo "FAIL $1: single run exited $?"; tail -5 "$T/$1.out"; fails=$((fails+1)); }
}
run_ddp() {  # NAME NPROC CFG
  timeout 300 "$L" --nproc_per_node=$2 --log_dir="$T/$1.logs" -- --config="$3" \
    --save_to="$T/$1.safetensors" --log_dir="$T/$1" > "$T/$1.out" 2>&1 ||
    { echo "FAIL $1: launcher exited $?"; tail -15 "$T/$1.out"; fails=$((fails+1)); }
}
compare() {  # NAME A B TOL
  /usr/bin/python3 - "$2" "$3" "$4" "$T/init_$1" <<'PY' || { echo "FAIL $1"; fails=$((fails+1)); return; }
import json, struct, sys
import torch
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n)); blob = f.read()
    return {k: torch.frombuffer(bytearray(blob[v["data_offsets"][0]:v["data_offsets"][1]]),
                                dtype=torch.float32).reshape(v["shape"])
            for k, v in h.items() if k != "__metadata__"}
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys()
worst = max(((a[k] - b[k]).abs().max().item(), k) for k in a)
print(f"   max |difference| {worst[0]:.2e} ({worst[1]}), tolerance {tol:g}")
assert worst[0] <= tol, worst
PY
  echo "ok   $1"
}

gpt_cfg "$T/g_single8.pbtxt" 8 1 single
gpt_cfg "$T/g_ddp4.pbtxt" 4 1 ddp
gpt_cfg "$T/g_single12.pbtxt" 12 1 single
gpt_cfg "$T/g_ddp2x2.pbtxt" 2 2 ddp
mlp_cfg "$T/m_single32.pbtxt" 32 single sgd
mlp_cfg "$T/m_ddp16.pbtxt" 16 ddp sgd
mlp_cfg "$T/ma_single32.pbtxt" 32 single adamw
mlp_cfg "$T/ma_single48.pbtxt" 48 single adamw
mlp_cfg "$T/ma_ddp16.pbtxt" 16 ddp adamw

run_single g_single8 "$T/g_single8.pbtxt"
run_ddp g_ddp2 2 "$T/g_ddp4.pbtxt"
run_single g_single12 "$T/g_single12.pbtxt"
run_ddp g_ddp3 3 "$T/g_ddp4.pbtxt"
run_ddp g_ddp2_accum2 2 "$T/g_ddp2x2.pbtxt"
run_single m_single32 "$T/m_single32.pbtxt"
run_ddp m_ddp2 2 "$T/m_ddp16.pbtxt"
run_single ma_single32 "$T/ma_single32.pbtxt"
run_single ma_single48 "$T/ma_single48.pbtxt"
run_ddp ma_ddp2 2 "$T/ma_ddp16.pbtxt"
run_ddp ma_ddp3 3 "$T/ma_ddp16.pbtxt"

# AdamW turns rounding-sized gradients into lr-sized steps (its update is ~lr * sign(g) where
# |g| is tiny), so parameters may differ by a few lr after 5 steps; SGD must agree tightly.
compare "gpt-mini: 2 ranks x 4 == 1 x 8" "$T/g_ddp2.safetensors" "$T/g_single8.safetensors" 2e-3
compare "gpt-mini: 3 ranks x 4 == 1 x 12" "$T/g_ddp3.safetensors" "$T/g_single12.safetensors" 2e-3
compare "gpt-mini: 2 ranks x 2 x accumulation 2 == 1 x 8" "$T/g_ddp2_accum2.safetensors" "$T/g_single8.safetensors" 2e-3
compare "mlp: 2 ranks x 16 == 1 x 32 (SGD)" "$T/m_ddp2.safetensors" "$T/m_single32.safetensors" 1e-5
compare "mlp: 2 ranks x 16 == 1 x 32 (AdamW)" "$T/ma_ddp2.safetensors" "$T/ma_single32.safetensors" 2e-4
compare "mlp: 3 ranks x 16 == 1 x 48 (AdamW)" "$T/ma_ddp3.safetensors" "$T/ma_single48.safetensors" 2e-4
grep -h "exposed communication" "$T"/g_ddp2.out | head -1
[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
