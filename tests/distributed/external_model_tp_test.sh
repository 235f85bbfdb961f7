#!/usr/bin/env bash
# A user's model loaded at run time (tests/external_plugin's tiny_lm, libbraid_tiny_lm.so named by
# the config's model.path) under tensor parallelism with the plan it registers itself
# (ModelSpec::tensor_plan: vocabulary-parallel embedding and head, q|k|v and the MLP's first
# projection colwise, their second rowwise), real processes through the launcher and the training
# program, against one process on the same global batch of 16 rows (the sequential loader making
# the ranks' rows the one process's): tensor 2, tensor 2 with sequence parallelism, and tensor 2 x
# data 2 (DDP). Plain SGD with weight decay and gradient clipping at 1 (the norms are about 2.7,
# 2.1 and 2.1, so every step is clipped: a norm that counts a replicated weight twice, or misses
# another rank's slices, changes the update), 3 steps.
# Bounds, those of the GPT tensor-parallel tests (tensor_parallel_equivalence_test.sh): 2e-6 on
# the weights (each split product sums its terms in 2 parts and an all-reduce adds them in
# another order: float32 rounding that 3 SGD steps carry) and the gradient norms to 1e-5
# relative. Measured: 7.5e-9 (one f32 ulp of these weights) in every case, the norms equal to
# 6 digits; the values are printed ("max |difference|").
# Shapes the tensor size does not divide are refused at start in one line: tensor 4 over tiny_lm's
# 2 heads (the plan's `divides n_head`), and tensor 2 over a vocabulary of 257 rows.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" tiny_lm_tp
PLUGIN="$TEST_SRCDIR/braid/tests/external_plugin/libbraid_tiny_lm.so"
cfg() {  # FILE MICRO SECTIONS [MODEL_FIELDS]
  cat > "$1" <<CFG
model { name: "tiny_lm" path: "$PLUGIN" n_layer: 2 n_head: 2 n_embd: 64 block_size: 32 ${4:-} }
data { dataset: "moby-dick" sampler: "sequential" }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: 4
steps: 3
gradient_clipping: 1
optimizer { type: "SGD" params { lr: 0.1 weight_decay: 0.1 } }
$3
CFG
}
norms_match() {  # RUN
  /usr/bin/python3 - "$T/single/metrics.jsonl" "$T/$1/metrics.jsonl" "$1" <<'PY' || fail "$1: gradient norms differ"
import json, math, sys
def norms(path):
    return [json.loads(l)["grad_norm"] for l in open(path) if '"step"' in l]
want, got = norms(sys.argv[1]), norms(sys.argv[2])
assert all(math.isfinite(v) for v in want + got), (want, got)
assert len(got) == len(want) == 3 and all(abs(a - b) <= 1e-5 * b for a, b in zip(got, want)), (sys.argv[3], got, want)
print(f"   {sys.argv[3]}: gradient norms {got}")
PY
}
tp_case() {  # NAME NPROC MICRO SECTIONS
  cfg "$T/$1.pbtxt" "$3" "$4"
  run_ranks "$1" "$2" "$T/$1.pbtxt" || return
  compare "$1 == one process" "$T/$1.safetensors" "$T/single.safetensors" 2e-6
  norms_match "$1"
}
# A refusal at start: NAME NPROC SECTIONS MODEL_FIELDS MESSAGE (a fixed string).
refused() {
  cfg "$T/$1.pbtxt" 4 "$3" "$4"
  if bounded "$L" --nproc_per_node="$2" --log_dir="$T/$1.logs" -- --config="$T/$1.pbtxt" \
      --log_dir="$T/$1" > "$T/$1.out" 2>&1; then
    fail "$1: accepted"
  elif grep -qF -- "$5" "$T/$1.out"; then
    echo "ok   $1 refused: $(grep -m1 -F -- "$5" "$T/$1.out")"
  else
    fail "$1: not refused with: $5"; tail -5 "$T/$1.out"
  fi
}

cfg "$T/single.pbtxt" 4 'strategy { name: "single" }'
run_single single "$T/single.pbtxt" || finish
/usr/bin/python3 - "$T/single/metrics.jsonl" <<'PY' || fail "clipping does not bind on step 0"
import json, sys
n = [json.loads(l)["grad_norm"] for l in open(sys.argv[1]) if '"step"' in l]
print(f"   one process: gradient norms {n}")
assert n[0] > 1, n
PY

tp_case t2 2 4 'parallel { tensor: 2 } strategy { name: "single" }'
# The split is the model's own plan, reported at start.
grep -q "^braid: tensor parallel: 2 ranks, plan tiny_lm: " "$T/t2.out" ||
  fail "t2: the split by plan tiny_lm is not reported"
tp_case t2_sp 2 4 'parallel { tensor: 2 sequence_parallel: true } strategy { name: "single" }'
tp_case t2d2 4 2 'parallel { tensor: 2 data: 2 } strategy { name: "ddp" }'

refused t4 4 'parallel { tensor: 4 } strategy { name: "single" }' "" \
  'model.n_head (2) is not a multiple of parallel.tensor (4)'
refused t2_vocab257 2 'parallel { tensor: 2 } strategy { name: "single" }' 'vocab_size: 257' \
  "'embed.weight' has 257 along the split dimension, which 2 (2 ranks) does not divide"
finish
