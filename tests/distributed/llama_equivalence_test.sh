#!/usr/bin/env bash
# llama-mini (models/llama: RMSNorm, RoPE, SwiGLU, 4 query heads sharing 2 K/V heads, untied head)
# under every kind of strategy, real processes through the launcher and the training program,
# against one process on the same global batch of 16 rows (the sequential loader making the
# ranks' rows the one process's). Plain SGD with weight decay and gradient clipping at 1
# (llama-mini's norms are about 7.6, 5.5 and 4.8, so every step is clipped: a wrong norm changes
# the update), 3 steps, unless a case says otherwise. Five shards (BUILD shard_count), each with
# the one-process runs it compares against:
#   0. data parallel: DDP, ZeRO 1, 2 (and with the optimizer offloaded to the host), 3 on 2 ranks;
#      activation checkpointing (one process, bitwise; ZeRO-3 on 2 ranks).
#   1. pipeline, 2 stages: GPipe, 1F1B, interleaved (2 virtual stages each), 1F1B with split
#      backwards, interleaved with split backwards.
#   2. tensor parallelism on 2 ranks under the model's own plan (with and without sequence
#      parallelism), tensor 2 x pipeline 2; tensor 4 is refused in one line (it does not divide
#      llama-mini's 2 K/V heads).
#   3. mixed precision (bf16 and fp16: DDP and ZeRO 1-3 on 2 ranks against one process in the
#      same precision) and 8-bit AdamW (Adam8bit: DDP against one process).
#   4. resharding: one process's checkpoint after step 3 loads into ZeRO-3 on 2 ranks, tensor 2
#      and a 2-stage pipeline, which train to step 6 (SGD with momentum: the buffers move with the
#      parameters); and ZeRO-3's checkpoint back into one process, bitwise.
# Tolerances, the bounds the GPT (and MLP) tests of the same strategies enforce:
#   - f32 SGD: 2e-6 on the weights where sums are split over ranks (DDP, ZeRO, tensor
#     parallelism, resharding), 1e-7 for the pipeline (each stage computes what one process
#     computes); every run's gradient norms equal the one process's to 1e-5 relative. Measured:
#     one f32 ulp of these weights (7.5e-9) everywhere. Activation checkpointing recomputes the
#     same forward: one process with and without it are bitwise equal.
#   - half precision: mixed_precision_test.sh's bounds, 2e-3 (bf16) and 2.5e-4 (f16), from its
#     rule: the saved weights are the half parameters, each the rounding of an f32 master that N
#     ranks and one process compute up to the rounding of half gradients summed in another
#     grouping, so a weight may differ by one unit in its last place. llama-mini's norm weights
#     sit near 1.0, where one ulp is larger than those bounds (2^-7 in bf16), so one ulp of the
#     larger value also passes (compare_weights.py's ULPS argument). Measured: 4.9e-4 (bf16) and
#     6.1e-5 (f16), no norm weight apart. Gradient norms to one rounding of the half gradients:
#     4e-3 relative (bf16, 2^-8) and 5e-4 (f16, 2^-11); measured 6e-4 and 7e-5.
#   - Adam8bit under DDP (every rank quantizes the same whole tensors): AdamW's bound under
#     sharding (zero_equivalence_test.sh, gpt-mini AdamW), 2e-4; measured 9.9e-5. Not under ZeRO:
#     there each rank quantizes its flat shard in blocks of its own (plugins/adam8bit/README.md),
#     another optimizer in effect (measured 2.5e-3 apart after 3 steps).
# Measured values are printed ("max |difference|").
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" llama_eq
shards 5
NORM_TOL=1e-5  # relative, on the gradient norms; half precision sets its own
SGD='optimizer { type: "SGD" params { lr: 0.1 weight_decay: 0.1 } }'
cfg() {  # FILE MICRO SECTIONS [OPTIMIZER_SECTION [STEPS]]
  cat > "$1" <<CFG
model { name: "llama-mini" }
data { dataset: "moby-dick" sampler: "sequential" }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: 4
steps: ${5:-3}
gradient_clipping: 1
${4:-$SGD}
$3
CFG
}
norms_match() {  # RUN REFERENCE
  /usr/bin/python3 - "$T/$2/metrics.jsonl" "$T/$1/metrics.jsonl" "$1" "$NORM_TOL" <<'PY' || fail "$1: gradient norms differ"
import json, math, sys
def norms(path):
    return [json.loads(l)["grad_norm"] for l in open(path) if '"step"' in l]
want, got = norms(sys.argv[1]), norms(sys.argv[2])
assert all(math.isfinite(v) for v in want + got), (want, got)
tol = float(sys.argv[4])
assert len(got) == len(want) == 3 and all(abs(a - b) <= tol * b for a, b in zip(got, want)), (sys.argv[3], got, want)
print(f"   {sys.argv[3]}: gradient norms {got}")
PY
}
# A run against a one-process reference: NAME NPROC MICRO SECTIONS TOL [REFERENCE [OPTIMIZER [ULPS]]]
case_() {
  local ref=${6:-single}
  cfg "$T/$1.pbtxt" "$3" "$4" "${7:-}"
  run_ranks "$1" "$2" "$T/$1.pbtxt" || return
  if /usr/bin/python3 "$CMP" "$T/$1.safetensors" "$T/$ref.safetensors" "$5" ${8:-}; then
    echo "ok   $1 == one process ($ref)"
  else
    fail "$1 == one process ($ref)"
  fi
  norms_match "$1" "$ref"
}
# The one-process reference: NAME SECTIONS [OPTIMIZER] (micro-batch 4 x 4 = the global 16 rows).
reference() {
  cfg "$T/$1.pbtxt" 4 "$2" "${3:-}"
  run_single "$1" "$T/$1.pbtxt" || finish
}

ZERO() { echo "strategy { name: \"zero\" } zero_optimization { stage: $1 ${2:-} }"; }
PIPE() {  # SCHEDULE [VIRTUAL [MORE_OPTIONS]]
  echo "parallel { pipeline: 2 } strategy { name: \"pipeline\"" \
    "options { key: \"schedule\" value: \"$1\" } options { key: \"virtual_stages\" value: \"${2:-1}\" } ${3:-} }"
}
SPLIT='options { key: "split_backward" value: "true" }'

if shard 0; then
  reference single 'strategy { name: "single" }'
  /usr/bin/python3 - "$T/single/metrics.jsonl" <<'PY' || fail "clipping does not bind on step 0"
import json, sys
n = [json.loads(l)["grad_norm"] for l in open(sys.argv[1]) if '"step"' in l]
print(f"   one process: gradient norms {n}")
assert n[0] > 1, n
PY
  case_ ddp2 2 2 'strategy { name: "ddp" }' 2e-6
  case_ zero1 2 2 "$(ZERO 1)" 2e-6
  case_ zero2 2 2 "$(ZERO 2)" 2e-6
  case_ zero2_offload 2 2 "$(ZERO 2 'offload_optimizer { device: "cpu" }')" 2e-6
  grep -q "optimizer state (host)" "$T/zero2_offload.out" || fail "zero2_offload: the summary shows no host optimizer state"
  compare "zero2 offloaded == zero2 on the device, bitwise" "$T/zero2_offload.safetensors" "$T/zero2.safetensors" 0
  case_ zero3 2 2 "$(ZERO 3)" 2e-6
  # Activation checkpointing: the recomputed forward is the forward, so one process is unchanged
  # bit for bit (every block alone, and sqrt(4) = 2 segments); and under ZeRO-3, whose gathers
  # run again inside the recomputation.
  reference single_ckpt 'strategy { name: "single" } activation_checkpointing { policy: "every_block" }'
  grep -q "activation checkpointing" "$T/single_ckpt.out" || fail "single_ckpt: checkpointing not announced"
  compare "one process with activation checkpointing == without, bitwise" "$T/single_ckpt.safetensors" "$T/single.safetensors" 0
  case_ zero3_ckpt 2 2 "$(ZERO 3) activation_checkpointing { policy: \"sqrt\" }" 2e-6
fi

if shard 1; then
  reference single 'strategy { name: "single" }'
  case_ pipe2_gpipe 2 4 "$(PIPE gpipe)" 1e-7
  case_ pipe2_1f1b 2 4 "$(PIPE 1f1b)" 1e-7
  case_ pipe2_interleaved 2 4 "$(PIPE interleaved 2)" 1e-7
  case_ pipe2_1f1b_split 2 4 "$(PIPE 1f1b 1 "$SPLIT")" 1e-7
  case_ pipe2_interleaved_split 2 4 "$(PIPE interleaved 2 "$SPLIT")" 1e-7
  grep -q "split backward" "$T/pipe2_1f1b_split.out" || fail "pipe2_1f1b_split: split backward not announced"
fi

if shard 2; then
  reference single 'strategy { name: "single" }'
  case_ tp2 2 4 'parallel { tensor: 2 } strategy { name: "single" }' 2e-6
  case_ tp2_sp 2 4 'parallel { tensor: 2 sequence_parallel: true } strategy { name: "single" }' 2e-6
  case_ tp2_pp2 4 4 'parallel { tensor: 2 pipeline: 2 } strategy { name: "pipeline" }' 2e-6
  cfg "$T/tp4.pbtxt" 4 'parallel { tensor: 4 } strategy { name: "single" }'
  if bounded "$L" --nproc_per_node=4 --log_dir="$T/tp4.logs" -- --config="$T/tp4.pbtxt" \
      --log_dir="$T/tp4" > "$T/tp4.out" 2>&1; then
    fail "tensor 4 over 2 K/V heads: accepted"
  else
    grep -q 'model.options "n_kv_head" (2) is not a multiple of parallel.tensor (4)' "$T/tp4.out" &&
      echo "ok   tensor 4 refused: $(grep -m1 'n_kv_head' "$T/tp4.out")" ||
      { fail "tensor 4: message"; tail -5 "$T/tp4.out"; }
  fi
fi

if shard 3; then
  FP16='fp16 { enabled: true loss_scale: 0 initial_scale_power: 12 }'
  BF16='bf16 { enabled: true }'
  for prec in bf16 fp16; do
    if [ $prec = bf16 ]; then SEC=$BF16 TOL=2e-3 NORM_TOL=4e-3; else SEC=$FP16 TOL=2.5e-4 NORM_TOL=5e-4; fi
    reference "${prec}_single" "strategy { name: \"single\" } $SEC"
    grep -q "braid: mixed precision" "$T/${prec}_single.out" || fail "$prec: no mixed-precision summary line"
    case_ "${prec}_ddp2" 2 2 "strategy { name: \"ddp\" } $SEC" $TOL "${prec}_single" "" 1
    for stage in 1 2 3; do
      case_ "${prec}_zero$stage" 2 2 "$(ZERO $stage) $SEC" $TOL "${prec}_single" "" 1
    done
  done
  NORM_TOL=1e-5
  A8='optimizer { type: "Adam8bit" params { lr: 0.001 weight_decay: 0.1 } }'
  reference a8_single 'strategy { name: "single" }' "$A8"
  grep -q "braid: Adam8bit: optimizer state" "$T/a8_single.out" || fail "a8_single: Adam8bit not in the summary"
  case_ a8_ddp2 2 2 'strategy { name: "ddp" }' 2e-4 a8_single "$A8"
fi

if shard 4; then
  SGDM='optimizer { type: "SGD" params { lr: 0.1 momentum: 0.9 } }'
  # One process: 3 steps with a checkpoint, and 6 steps straight (the reference).
  cfg "$T/r-src.pbtxt" 4 "strategy { name: \"single\" } checkpoint { dir: \"$T/r-src\" every_steps: 3 }" "$SGDM" 6
  run_single r-src-run "$T/r-src.pbtxt" --steps=3 || finish
  cfg "$T/r-plain.pbtxt" 4 'strategy { name: "single" }' "$SGDM" 6
  run_single r-plain "$T/r-plain.pbtxt" || finish
  reshard() {  # NAME NPROC MICRO SECTIONS: loads the one process's step 3, trains to 6
    rm -rf "$T/r-$1-ckpt"; cp -r "$T/r-src" "$T/r-$1-ckpt"
    cfg "$T/r-$1.pbtxt" "$3" "$4 checkpoint { dir: \"$T/r-$1-ckpt\" }" "$SGDM" 6
    run_ranks "r-$1" "$2" "$T/r-$1.pbtxt" || return
    grep -q "resumed from $T/r-$1-ckpt/step_3" "$T/r-$1.out" || { fail "reshard $1: did not load step 3"; return; }
    compare "reshard: one process's step 3 -> $1, 6 steps == one process" "$T/r-$1.safetensors" "$T/r-plain.safetensors" 2e-6
  }
  reshard zero3 2 2 "$(ZERO 3)"
  reshard tp2 2 4 'parallel { tensor: 2 } strategy { name: "single" }'
  reshard pipe2 2 4 "$(PIPE 1f1b)"
  # And back: ZeRO-3's step-6 checkpoint into one process, no steps: its weights, bitwise.
  cfg "$T/r-back.pbtxt" 4 "strategy { name: \"single\" } checkpoint { dir: \"$T/r-zero3-ckpt\" }" "$SGDM" 6
  run_single r-back "$T/r-back.pbtxt" &&
    compare "reshard: ZeRO-3's step 6 -> one process, bitwise" "$T/r-back.safetensors" "$T/r-zero3.safetensors" 0
fi
finish
