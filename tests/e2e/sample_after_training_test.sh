#!/usr/bin/env bash
# From training to text: a small GPT (width 64, no preset's) trains on a data set //tools:prepare_data
# wrote (byte tokenizer), writing --save_to and checkpoints on 2 DDP ranks; //tools:sample then
# reads both with no --n_head (the trainer noted it beside the weights) and, greedy, prints the
# same text from each, which is the prompt and 40 more bytes; a run with an eval section prints
# its validation loss and writes it to the metrics and the csv monitor.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" sample_after_training
PREP="$TEST_SRCDIR/braid/tools/prepare_data/prepare_data"
SAMPLE="$TEST_SRCDIR/braid/tools/sample/sample"

/usr/bin/python3 - "$T/docs.jsonl" <<'PY'
import json, random, sys
r = random.Random(7)
words = "call me ishmael some years ago never mind how long precisely having little money".split()
with open(sys.argv[1], "w") as f:
    for _ in range(40):
        f.write(json.dumps({"text": " ".join(r.choice(words) for _ in range(r.randint(60, 150)))}) + "\n")
PY
"$PREP" --tokenizer=byte --val_fraction=0.2 --out="$T/data" "$T/docs.jsonl" > "$T/prep.out" 2>&1 ||
  { fail "prepare_data"; cat "$T/prep.out"; finish; }
cat > "$T/cfg.pbtxt" <<CFG
model { name: "gpt-mini" n_layer: 2 n_head: 2 n_embd: 64 block_size: 32 }
data { dataset: "tokens" path: "$T/data" }
train_micro_batch_size_per_gpu: 4
steps: 100
optimizer { type: "AdamW" params { lr: 0.01 } }
strategy { name: "ddp" }
checkpoint { dir: "$T/ckpt" every_steps: 50 }
eval { every_steps: 50 batches: 2 }
csv_monitor { enabled: true job_name: "csv" }
CFG
run_ranks trained 2 "$T/cfg.pbtxt" || finish
grep -q "^eval  50/100 | val loss " "$T/trained.out" && grep -q "^eval 100/100 | val loss " "$T/trained.out" ||
  fail "no eval lines after steps 50 and 100 in the output"
n=$(grep -c '"val_loss"' "$T/trained/metrics.jsonl")
[ "$n" = 2 ] || fail "$n validation lines in the metrics, want 2"
# The monitors have them too, at DeepSpeed's x (samples: (step + 1) x 8), beside the train loss.
/usr/bin/python3 - "$T/trained/metrics.jsonl" "$T/trained/csv/Eval_Samples_val_loss.csv" <<'PY' ||
import json, sys
want = [(str((r["step"] + 1) * 8), r["val_loss"]) for r in map(json.loads, open(sys.argv[1])) if "val_loss" in r]
rows = [l.rstrip("\n").split(",") for l in open(sys.argv[2])]
assert rows[0] == ["step", "val_loss"], rows[0]
got = [(x, float(v)) for x, v in rows[1:]]
assert [x for x, _ in got] == [x for x, _ in want] and all(abs(a - b) <= 1e-6 * b for (_, a), (_, b) in zip(got, want)), (got, want)
PY
  fail "the csv monitor's Eval_Samples_val_loss.csv does not hold the validation losses"

sample() { bounded "$SAMPLE" --prompt="call me" --max_new_tokens=40 --temperature=0 "$@"; }
from_file=$(sample --from="$T/trained.safetensors" 2>"$T/err1") || fail "sample from the weights: $(cat "$T/err1")"
from_ckpt=$(sample --from="$T/ckpt" 2>"$T/err2") || fail "sample from the checkpoint: $(cat "$T/err2")"
[ -n "$from_file" ] && [ "$from_file" = "$from_ckpt" ] ||
  fail "the weights and the checkpoint of the same step print different text: '$from_file' / '$from_ckpt'"
[ "$(printf '%s' "$from_file" | head -c 7)" = "call me" ] && [ "$(printf '%s' "$from_file" | wc -c)" = 47 ] ||
  fail "not the prompt and 40 bytes: '$from_file'"
echo "   greedy: $from_file"
# The head count matters: forced to another, the same weights compute something else.
other=$(sample --from="$T/trained.safetensors" --n_head=4 2>/dev/null)
[ "$other" != "$from_file" ] || fail "--n_head=4 printed the same text as the noted n_head 2"
finish
