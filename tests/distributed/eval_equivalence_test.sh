#!/usr/bin/env bash
# Held-out evaluation (the config's eval section) under every strategy and layout, real
# processes through the launcher: the validation loss of the same weights equals one process's.
# The data: synthetic documents prepared by //tools:prepare_data (byte tokenizer, a fifth held
# out). The weights: 20 AdamW steps of one process, saved; every run below starts from them
# (init_from) and takes one SGD step of lr 1e-30, which leaves every weight as it was (the update
# is ~30 orders of magnitude below a weight's rounding), then evaluates 4 fixed batches:
#   single (the reference), DDP 2, ZeRO 1, 2 and 3 on 2, pipeline 2 (1F1B), tensor 2 (the
#   vocabulary-split loss, which refused evaluation before), tensor 2 with sequence parallelism,
#   tensor 2 x pipeline 2 x data 2.
# Tolerance: relative 1e-5 on the loss. Runs whose model is whole on each rank compute what one
# process does; tensor parallelism adds its split products in another order (measured ~3e-8).
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" eval_eq
PREP="$TEST_SRCDIR/braid/tools/prepare_data/prepare_data"

/usr/bin/python3 - "$T/docs.jsonl" <<'PY'
import json, random, sys
r = random.Random(5)
words = "the whale sea ship captain ahab white harpoon boat crew deep water sail wind storm".split()
with open(sys.argv[1], "w") as f:
    for _ in range(60):
        n = r.randint(80, 200)
        f.write(json.dumps({"text": " ".join(r.choice(words) for _ in range(n)) + "."}) + "\n")
PY
"$PREP" --tokenizer=byte --val_fraction=0.2 --out="$T/data" "$T/docs.jsonl" > "$T/prep.out" 2>&1 ||
  { fail "prepare_data"; cat "$T/prep.out"; finish; }

model='model { name: "gpt-mini" n_layer: 2 n_head: 4 n_embd: 64 block_size: 32 }'
cat > "$T/pretrain.pbtxt" <<CFG
$model
data { dataset: "tokens" path: "$T/data" }
train_micro_batch_size_per_gpu: 4
steps: 20
optimizer { type: "AdamW" params { lr: 0.003 } }
CFG
run_single pretrain "$T/pretrain.pbtxt" || finish

cfg() {  # FILE SECTIONS [INIT]
  cat > "$1" <<CFG
$model
data { dataset: "tokens" path: "$T/data" sampler: "sequential" }
train_micro_batch_size_per_gpu: 2
gradient_accumulation_steps: 2
steps: 1
${3-init_from: \"$T/pretrain.safetensors\"}
optimizer { type: "SGD" params { lr: 1e-30 } }
eval { batches: 4 }
$2
CFG
}
val_loss() {  # RUN -> the one validation loss in its metrics
  /usr/bin/python3 - "$T/$1/metrics.jsonl" <<'PY'
import json, math, sys
v = [json.loads(l)["val_loss"] for l in open(sys.argv[1]) if '"val_loss"' in l]
assert len(v) == 1 and math.isfinite(v[0]), v
print(repr(v[0]))
PY
}
# NAME: its validation loss within relative 1e-5 of the one process's.
same_loss() {
  local got; got=$(val_loss "$1") || { fail "$1: no single finite val_loss in its metrics"; return; }
  if /usr/bin/python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" "$got" "$want"; then
    echo "ok   $1: val_loss $got (one process: $want)"
  else
    fail "$1: val_loss $got, one process $want (tolerance relative 1e-5)"
  fi
}

cfg "$T/single.pbtxt" 'strategy { name: "single" }'
run_single single "$T/single.pbtxt" || finish
want=$(val_loss single) || { fail "single: no single finite val_loss in its metrics"; finish; }
grep -q "^eval 1/1 | val loss .* | val ppl " "$T/single.out" || fail "single: no eval line in the output"
# The comparison can fail: a fresh model's validation loss is far from the trained one's.
cfg "$T/fresh.pbtxt" 'strategy { name: "single" }' ""
run_single fresh "$T/fresh.pbtxt" && {
  fresh=$(val_loss fresh)
  /usr/bin/python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) > 0.5 else 1)" "$fresh" "$want" ||
    fail "a fresh model's val_loss $fresh is close to the trained one's $want"
}

case_() {  # NAME NPROC SECTIONS
  cfg "$T/$1.pbtxt" "$3"
  run_ranks "$1" "$2" "$T/$1.pbtxt" && same_loss "$1"
}
case_ ddp2 2 'strategy { name: "ddp" }'
case_ zero1 2 'strategy { name: "zero" } zero_optimization { stage: 1 }'
case_ zero2 2 'strategy { name: "zero" } zero_optimization { stage: 2 }'
case_ zero3 2 'strategy { name: "zero" } zero_optimization { stage: 3 }'
case_ pipe2 2 'strategy { name: "pipeline" } parallel { pipeline: 2 }'
case_ tp2 2 'parallel { tensor: 2 } strategy { name: "single" }'
case_ tp2_sp 2 'parallel { tensor: 2 sequence_parallel: true } strategy { name: "single" }'
case_ t2p2d2 8 'parallel { tensor: 2 pipeline: 2 data: 2 } strategy { name: "pipeline" }'
finish
