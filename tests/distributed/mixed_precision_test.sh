#!/usr/bin/env bash
# Mixed precision (launcher/mixed_precision/mixed_precision.h) through the real launcher and training program, over
# Gloo: N ranks under DDP and ZeRO 1/2/3 in fp16/bf16 reach the weights one process reaches in
# the same precision on the same global batch (the sequential loader and MNIST's distributed
# sampler make N ranks x micro-batch b the same data as one process x N*b, as in
# ddp_equivalence_test.sh). Plain SGD (lr x gradient: a scale error shows).
#
# Tolerances. The saved weights are the half parameters, each the rounding of an f32 master.
# N ranks and one process compute the same masters up to the rounding of half gradients summed in
# another grouping (~2^-11 relative for f16, 2^-8 for bf16, times lr 0.1 over 4 steps: < 1e-5
# absolute here), so a saved weight may differ by one unit in the last place where its master
# sits next to a rounding boundary, and by nothing else. The MLP's weights stay below 0.5, where
# one ulp is 2^-12 = 2.4e-4 in f16 and 2^-9 = 2e-3 in bf16: the tolerances are 2.5e-4 (f16) and
# 2e-3 (bf16). Forgetting to divide out the loss scale, or averaging twice, moves weights by
# lr x |gradient| ~ 1e-3 per step: well beyond the f16 tolerance.
# The bf16 single-process run also tracks the f32 run within 1e-2 (the half forward/backward
# rounds each activation and gradient; measured ~3e-3).
#
# Two shards (BUILD shard_count): fp16 (with its metrics, the exact resume and the refusals), and
# bf16 (with the f32 run it tracks). No run is shared between them.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" mp_eq
shards 2
mlp_cfg() {  # FILE MICRO ACCUM STRATEGY STAGE PRECISION_SECTION [MORE]
  cat > "$1" <<CFG
model { name: "mlp" }
data { dataset: "mnist" seed: 7 }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: $3
steps: 4
optimizer { type: "SGD" params { lr: 0.1 weight_decay: 0.1 } }
strategy { name: "$4" }
$6
${7:-}
CFG
  [ "$5" = 0 ] || echo "zero_optimization { stage: $5 }" >> "$1"
}
dtype_of() {  # FILE: the first tensor's safetensors dtype
  /usr/bin/python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; h=json.loads(f.read(n)); print([v["dtype"] for k,v in h.items() if k!="__metadata__"][0])' "$1"
}

FP16='fp16 { enabled: true loss_scale: 0 initial_scale_power: 12 }'
BF16='bf16 { enabled: true }'
# One precision: one process, then DDP and ZeRO 1/2/3 on 2 ranks, and DDP reducing in f32.
precision() {  # fp16 | bf16
  local prec=$1 SEC TOL WANT s name stage
  if [ $prec = fp16 ]; then SEC="$FP16"; TOL=2.5e-4; WANT=F16; else SEC="$BF16"; TOL=2e-3; WANT=BF16; fi
  mlp_cfg "$T/${prec}_single.pbtxt" 64 1 single 0 "$SEC"
  run_single "${prec}_single" "$T/${prec}_single.pbtxt"
  [ "$(dtype_of "$T/${prec}_single.safetensors")" = $WANT ] || fail "$prec: saved weights are not $WANT"
  grep -q "braid: mixed precision $prec" "$T/${prec}_single.out" 2>/dev/null ||
    grep -q "braid: mixed precision ${WANT,,}" "$T/${prec}_single.out" || fail "$prec: no mixed-precision summary line"
  for s in ddp:0 zero:1 zero:2 zero:3; do
    name=${s%%:*}; stage=${s##*:}
    mlp_cfg "$T/${prec}_$name$stage.pbtxt" 16 2 "$name" "$stage" "$SEC"
    run_ranks "${prec}_$name$stage" 2 "$T/${prec}_$name$stage.pbtxt"
    compare "$prec $name${stage/#0/} 2 ranks x 16 x 2 = one process x 64" \
      "$T/${prec}_$name$stage.safetensors" "$T/${prec}_single.safetensors" $TOL
  done
  # ZeRO-Offload under half precision: the f32 masters and the optimizer's state on the host,
  # the same updates as on the device (bit for bit: the same kernels step the same values).
  mlp_cfg "$T/${prec}_zero2_offload.pbtxt" 16 2 zero 0 "$SEC" \
    'zero_optimization { stage: 2 offload_optimizer { device: "cpu" } }'
  run_ranks "${prec}_zero2_offload" 2 "$T/${prec}_zero2_offload.pbtxt"
  grep -q "optimizer state (host)" "$T/${prec}_zero2_offload.out" || fail "$prec: offload not in the summary"
  compare "$prec zero2 with the optimizer offloaded = on the device, bitwise" \
    "$T/${prec}_zero2_offload.safetensors" "$T/${prec}_zero2.safetensors" 0
  # ZeRO-Infinity's parameter offload: the shards on the host, copied to the device per layer for
  # the all-gather, the optimizer stepping them there: the same updates as stage 3 on the device.
  mlp_cfg "$T/${prec}_zero3_offload_param.pbtxt" 16 2 zero 0 "$SEC" \
    'zero_optimization { stage: 3 offload_param { device: "cpu" pin_memory: true } }'
  run_ranks "${prec}_zero3_offload_param" 2 "$T/${prec}_zero3_offload_param.pbtxt"
  grep -q "parameter shards (host)" "$T/${prec}_zero3_offload_param.out" || fail "$prec: parameter offload not in the summary"
  compare "$prec zero3 with the parameters offloaded = on the device, bitwise" \
    "$T/${prec}_zero3_offload_param.safetensors" "$T/${prec}_zero3.safetensors" 0
  # Gradients reduced in f32 (DDP): the same weights, one rounding fewer.
  mlp_cfg "$T/${prec}_ddp_f32.pbtxt" 16 2 ddp 0 "$SEC" 'communication_data_type: "fp32"'
  run_ranks "${prec}_ddp_f32" 2 "$T/${prec}_ddp_f32.pbtxt"
  grep -q "gradients reduced in f32" "$T/${prec}_ddp_f32.out" || fail "$prec: f32 reduction not announced"
  compare "$prec ddp, f32 reduction, 2 ranks = one process" "$T/${prec}_ddp_f32.safetensors" \
    "$T/${prec}_single.safetensors" $TOL
}

# bf16 tracks f32 (one process).
bf16_tracks_f32() {
  mlp_cfg "$T/f32_single.pbtxt" 64 1 single 0 ""
  run_single f32_single "$T/f32_single.pbtxt"
  compare "bf16 one process tracks f32" "$T/bf16_single.safetensors" "$T/f32_single.safetensors" 1e-2
}

# The metrics file carries the loss scale and skipped flag per step; the summary line the totals.
fp16_metrics() {
  local m="$T/fp16_single/metrics.jsonl"
  [ -f "$m" ] || m=$(ls "$T"/fp16_single/*.jsonl 2>/dev/null | head -1)
  if grep -q '"loss_scale": 4096, "skipped": false' "$m" && grep -q '"skipped_steps": 0' "$m"; then
    echo "ok   fp16 metrics carry loss_scale and skipped"
  else
    fail "fp16 metrics lack loss_scale/skipped ($m)"; head -2 "$m"
  fi
}

# Exact resume in fp16: the f32 masters (optimizer state "master") and the loss scaler's state
# (scale, hysteresis, window count) come back from the checkpoint, so 3 steps + resume 3 steps
# equals 8 steps bitwise (tolerance 0). The scale starts at 2^20, where this model's gradients
# overflow f16: step 1 is skipped, the scale halves, two clean steps grow it back, step 4
# overflows again; a resume after step 4 that forgot the scaler would start at 2^20 and skip
# step 5 as well, which the uninterrupted run does not.
fp16_resume() {
  local RES='fp16 { enabled: true loss_scale: 0 initial_scale_power: 20 loss_scale_window: 2 hysteresis: 1 }'
  mlp_cfg "$T/res_whole.pbtxt" 32 1 ddp 0 "$RES" "checkpoint { dir: \"$T/ck_whole\" every_steps: 4 }"
  mlp_cfg "$T/res_split.pbtxt" 32 1 ddp 0 "$RES" "checkpoint { dir: \"$T/ck_split\" every_steps: 4 }"
  sed -i 's/^steps: 4/steps: 8/' "$T/res_whole.pbtxt" "$T/res_split.pbtxt"
  run_ranks res_whole 2 "$T/res_whole.pbtxt"
  bounded "$L" --nproc_per_node=2 --log_dir="$T/res_a.logs" -- --config="$T/res_split.pbtxt" --steps=4 \
    --log_dir="$T/res_a" > "$T/res_a.out" 2>&1 || fail "resume: first half $(ended $?)"
  run_ranks res_split 2 "$T/res_split.pbtxt"
  grep -q "resumed from" "$T/res_split.out" || fail "resume: the second half did not resume"
  grep -qE "at the end, [2-7] of 8 steps skipped" "$T/res_whole.out" ||
    { fail "resume: the whole run did not skip (and recover from) overflows as planned"; grep "steps skipped" "$T/res_whole.out"; }
  compare "fp16 ddp 4 steps + resume 4 = 8 steps, bitwise" "$T/res_split.safetensors" "$T/res_whole.safetensors" 0
}

# Refusals, one line each, before training.
refuse() {  # NAME EXPECTED_SUBSTRING CONFIG_TEXT
  printf '%s\n' "$3" > "$T/$1.pbtxt"
  if bounded "$TR" --config="$T/$1.pbtxt" > "$T/$1.out" 2>&1; then fail "$1: accepted"; return; fi
  grep -q -- "$2" "$T/$1.out" && echo "ok   refused: $1" || { fail "$1: message"; cat "$T/$1.out"; }
}
refusals() {
  refuse fp32_comm_zero 'needs a strategy that provides "communication_data_type"; strategy "zero" does not; use strategy.name "ddp"' \
    "model { name: \"mlp\" } data { dataset: \"mnist\" } strategy { name: \"zero\" } zero_optimization { stage: 2 } bf16 { enabled: true } communication_data_type: \"fp32\""
  refuse comm_without_half 'applies under fp16 or bf16 only' \
    "model { name: \"mlp\" } data { dataset: \"mnist\" } communication_data_type: \"fp32\""
  refuse both_halves 'enable at most one' \
    "model { name: \"mlp\" } data { dataset: \"mnist\" } bf16 { enabled: true } fp16 { enabled: true }"
}

if shard 0; then
  precision fp16
  fp16_metrics
  fp16_resume
  refusals
fi
if shard 1; then
  precision bf16
  bf16_tracks_f32
fi
finish
