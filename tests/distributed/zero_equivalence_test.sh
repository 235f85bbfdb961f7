#!/usr/bin/env bash
# ZeRO stages 1, 2 and 3 over Gloo, real processes through the launcher and the training
# program (plugin loading, config section, deferred initialisation at stage 3), against one
# process on the same global batch. As in ddp_equivalence_test.sh, the sequential loader and
# MNIST's distributed sampler make N ranks x micro-batch b the same data as one process x N*b.
#   - MLP, plain SGD (lr x gradient: a scale error shows) with weight decay on the weights only
#     (decoupled per the model's attribute; a shard that lost it moves by lr*wd*w), accumulation
#     2, on 2 and 3 ranks, each
#     stage: tolerance 1e-7 (f32 sums in another order; measured ~1e-8);
#   - gpt-mini, AdamW, stage 3 on 2 ranks: 2e-4, measured 6.5e-5 (AdamW turns rounding-sized gradient differences
#     into lr-sized steps for near-zero gradients, as in the DDP test).
set -uo pipefail
L="$TEST_SRCDIR/braid/launcher/launcher"
TR="$TEST_SRCDIR/braid/launcher/train"
CMP="$TEST_SRCDIR/braid/tests/testing/compare_weights.py"
T="${TEST_TMPDIR:-$(mktemp -d)}/zero_eq"
rm -rf "$T"; mkdir -p "$T"
fails=0
mlp_cfg() {  # FILE MICRO ACCUM STRATEGY STAGE [MORE_ZERO_SETTINGS]
  cat > "$1" <<CFG
model { name: "mlp" }
data { dataset: "mnist" seed: 7 }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: $3
steps: 4
optimizer { type: "SGD" params { lr: 0.1 weight_decay: 0.1 } }
strategy { name: "$4" }
CFG
  [ "$5" = 0 ] || echo "zero_optimization { stage: $5 ${6:-} }" >> "$1"
}
gpt_cfg() {  # FILE MICRO STRATEGY STAGE
  cat > "$1" <<CFG
model { name: "gpt-mini" }
data { dataset: "moby-dick" sampler: "sequential" }
train_micro_batch_size_per_gpu: $2
steps: 4
optimizer { type: "AdamW" params { lr: 1e-3 betas: [0.9, 0.95] eps: 1e-8 weight_decay: 0.1 } }
strategy { name: "$3" }
CFG
  [ "$4" = 0 ] || echo "zero_optimization { stage: $4 }" >> "$1"
}
run_single() {  # NAME CFG
  "$TR" --config="$2" --save_to="$T/$1.safetensors" --log_dir="$T/$1" > "$T/$1.out" 2>&1 ||
    { echo "FAIL $1: single run exited $?"; tail -5 "$T/$1.out"; fails=$((fails+1)); }
}
run_ranks() {  # NAME NPROC CFG
  timeout 300 "$L" --nproc_per_node=$2 --log_dir="$T/$1.logs" -- --config="$3" \
    --save_to="$T/$1.safetensors" --log_dir="$T/$1" > "$T/$1.out" 2>&1 ||
    { echo "FAIL $1: launcher exited $?"; tail -15 "$T/$1.out"; fails=$((fails+1)); }
}
compare() {  # NAME A B TOL
  if /usr/bin/python3 "$CMP" "$2" "$3" "$4"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails+1)); fi
}

mlp_cfg "$T/single64.pbtxt" 64 1 single 0
mlp_cfg "$T/single96.pbtxt" 96 1 single 0
run_single single64 "$T/single64.pbtxt"
run_single single96 "$T/single96.pbtxt"
for stage in 1 2 3; do
  mlp_cfg "$T/zero$stage.pbtxt" 16 2 zero $stage
  run_ranks "mlp_zero${stage}_2" 2 "$T/zero$stage.pbtxt"
  grep -q "strategy zero" "$T/mlp_zero${stage}_2.out" || { echo "FAIL: zero did not train"; fails=$((fails+1)); }
  compare "mlp stage $stage, 2 ranks x 16 x 2 = one process x 64" "$T/mlp_zero${stage}_2.safetensors" "$T/single64.safetensors" 1e-7
  run_ranks "mlp_zero${stage}_3" 3 "$T/zero$stage.pbtxt"
  compare "mlp stage $stage, 3 ranks x 16 x 2 = one process x 96" "$T/mlp_zero${stage}_3.safetensors" "$T/single96.safetensors" 1e-7
done

# ZeRO-Offload: the optimizer's step on host copies gives the same weights, and the summary
# shows the host pool apart from the training device.
mlp_cfg "$T/offload.pbtxt" 16 2 zero 2 'offload_optimizer { device: "cpu" }'
run_ranks mlp_offload_2 2 "$T/offload.pbtxt"
compare "mlp stage 2 with the optimizer offloaded, 2 ranks = one process x 64" "$T/mlp_offload_2.safetensors" "$T/single64.safetensors" 1e-7
grep -E "peak tensor memory per device:.* host [0-9.]+ MiB" "$T/mlp_offload_2.out" && grep -E "optimizer state \(host\)" "$T/mlp_offload_2.out" ||
  { echo "FAIL: the offloaded run's summary does not show the host pool"; fails=$((fails+1)); }

gpt_cfg "$T/g_single8.pbtxt" 8 single 0
gpt_cfg "$T/g_zero3.pbtxt" 4 zero 3
run_single g_single8 "$T/g_single8.pbtxt"
run_ranks g_zero3_2 2 "$T/g_zero3.pbtxt"
compare "gpt-mini AdamW stage 3, 2 ranks x 4 = one process x 8" "$T/g_zero3_2.safetensors" "$T/g_single8.safetensors" 2e-4
# The summary reports what each rank held.
grep -E "^braid: model state per rank" "$T/g_zero3_2.out" || { echo "FAIL: no model-state summary"; fails=$((fails+1)); }

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
