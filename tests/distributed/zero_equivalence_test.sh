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
#
# Two shards (BUILD shard_count): the 2-rank MLP runs (and the offload), and the 3-rank ones
# with gpt-mini; each has its own one-process references, none is run twice.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" zero_eq
shards 2
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
# MLP, each stage: N ranks x 16 x accumulation 2 = one process x 16N (N = 2 on shard 0, 3 on 1).
mlp_stages() {  # NPROC
  local n=$1 stage
  mlp_cfg "$T/single$((32 * n)).pbtxt" $((32 * n)) 1 single 0
  run_single single$((32 * n)) "$T/single$((32 * n)).pbtxt"
  for stage in 1 2 3; do
    mlp_cfg "$T/zero$stage.pbtxt" 16 2 zero $stage
    run_ranks "mlp_zero${stage}_$n" $n "$T/zero$stage.pbtxt"
    grep -q "strategy zero" "$T/mlp_zero${stage}_$n.out" || fail "zero did not train"
    compare "mlp stage $stage, $n ranks x 16 x 2 = one process x $((32 * n))" "$T/mlp_zero${stage}_$n.safetensors" "$T/single$((32 * n)).safetensors" 1e-7
  done
}

if shard 0; then
  mlp_stages 2
  # ZeRO-Offload: the optimizer's step on host copies gives the same weights, and the summary
  # shows the host pool apart from the training device.
  mlp_cfg "$T/offload.pbtxt" 16 2 zero 2 'offload_optimizer { device: "cpu" }'
  run_ranks mlp_offload_2 2 "$T/offload.pbtxt"
  compare "mlp stage 2 with the optimizer offloaded, 2 ranks = one process x 64" "$T/mlp_offload_2.safetensors" "$T/single64.safetensors" 1e-7
  grep -E "peak tensor memory per device:.* host [0-9.]+ MiB" "$T/mlp_offload_2.out" && grep -E "optimizer state \(host\)" "$T/mlp_offload_2.out" ||
    fail "the offloaded run's summary does not show the host pool"
fi

if shard 1; then
  mlp_stages 3
  gpt_cfg "$T/g_single8.pbtxt" 8 single 0
  gpt_cfg "$T/g_zero3.pbtxt" 4 zero 3
  run_single g_single8 "$T/g_single8.pbtxt"
  run_ranks g_zero3_2 2 "$T/g_zero3.pbtxt"
  compare "gpt-mini AdamW stage 3, 2 ranks x 4 = one process x 8" "$T/g_zero3_2.safetensors" "$T/g_single8.safetensors" 2e-4
  # The summary reports what each rank held.
  grep -E "^braid: model state per rank" "$T/g_zero3_2.out" || fail "no model-state summary"
fi
finish
