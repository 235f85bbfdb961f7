#!/usr/bin/env bash
# Training on a prepared token data set (//tools:prepare_data, byte tokenizer: no data files
# needed): a few steps on one process and on two (the train split sharded over DDP's ranks), and
# the one-line refusals at start of a vocabulary the model lacks and of a damaged shard. A flat
# token file still trains as before, and an eval section on it is refused.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" train_tokens
prep="$TEST_SRCDIR/braid/tools/prepare_data/prepare_data"
tmp="$T"

mkdir -p "$tmp/in"
for i in $(seq 1 12); do
  for j in $(seq 1 40); do printf 'Document %d, line %d: the quick brown fox.\n' "$i" "$j"; done >"$tmp/in/d$i.txt"
done
"$prep" --tokenizer=byte --out="$tmp/ds" --shard_tokens=5000 --quiet "$tmp/in" || fail "prepare_data"
[ "$(grep -c '"split":"train"' "$tmp/ds/manifest.json")" -ge 3 ] || fail "want several train shards"

cfg() {  # cfg FILE DATA-SECTION [MODEL-FIELDS]
  printf 'model { name: "gpt-mini" n_layer: 1 block_size: 32 %s }\ndata { %s }\ntrain_micro_batch_size_per_gpu: 4\nsteps: 3\nlog { print_every: 1 }\n' \
    "${3:-}" "$2" >"$1"
}
cfg "$tmp/ok.pbtxt" "dataset: \"tokens\" path: \"$tmp/ds\""
out=$(bounded "$TR" --config="$tmp/ok.pbtxt" --log_dir="$tmp/l1" 2>&1) || fail "train on the data set: $(tail -5 <<<"$out")"
# Three steps with finite losses (a NaN loss fails the comparison).
/usr/bin/python3 - "$tmp/l1/metrics.jsonl" <<'PY' || fail "metrics: $(tail -3 <<<"$out")"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
steps = [r["step"] for r in rows if "loss" in r]
assert steps == [0, 1, 2], steps
assert all(math.isfinite(r["loss"]) and 0 < r["loss"] < 10 for r in rows if "loss" in r), rows
PY

cfg "$tmp/seq.pbtxt" "dataset: \"tokens\" path: \"$tmp/ds/manifest.json\" sampler: \"sequential\""
out=$(bounded "$L" --nproc_per_node=2 --log_dir="$tmp/l2.logs" -- --config="$tmp/seq.pbtxt" --log_dir="$tmp/l2" 2>&1) ||
  fail "two ranks, sequential, on the manifest: $(tail -5 <<<"$out")"

# Ids past the model's vocabulary: the shard and offset, at start.
cfg "$tmp/small.pbtxt" "dataset: \"tokens\" path: \"$tmp/ds\"" "vocab_size: 100"
out=$(bounded "$TR" --config="$tmp/small.pbtxt" --log_dir="$tmp/l3" 2>&1); rc=$?
if [ "$rc" != 1 ] || ! grep -qE "^braid train: shard '$tmp/ds/train-00000.bin' holds token id [0-9]+ at offset [0-9]+ \(token index in that shard\), beyond the model's vocabulary of 100" <<<"$out"; then
  fail "vocabulary refusal (exit $rc): $(tail -3 <<<"$out")"
fi
[ -e "$tmp/l3/metrics.jsonl" ] && grep -q '"step"' "$tmp/l3/metrics.jsonl" && fail "it trained before refusing"

# A damaged shard: named, at start.
cp -r "$tmp/ds" "$tmp/bad"
printf 'XY' | dd of="$tmp/bad/train-00001.bin" bs=1 seek=10 conv=notrunc 2>/dev/null
cfg "$tmp/bad.pbtxt" "dataset: \"tokens\" path: \"$tmp/bad\""
out=$(bounded "$TR" --config="$tmp/bad.pbtxt" --log_dir="$tmp/l4" 2>&1); rc=$?
grep -q "shard '$tmp/bad/train-00001.bin' does not match its SHA-256" <<<"$out" && [ "$rc" = 1 ] ||
  fail "damaged shard (exit $rc): $(tail -3 <<<"$out")"

# A data set that was never prepared: the path and the command that makes it.
cfg "$tmp/none.pbtxt" "dataset: \"tokens\" path: \"$tmp/never-prepared\""
out=$(bounded "$TR" --config="$tmp/none.pbtxt" --log_dir="$tmp/l6" 2>&1); rc=$?
grep -q "^braid train: data.path '$tmp/never-prepared' does not exist: prepare the data first (bazel run //tools:prepare_data" <<<"$out" &&
  [ "$rc" = 1 ] || fail "missing data set (exit $rc): $(tail -3 <<<"$out")"

# The flat file of before: u16 ids, no manifest.
head -c 20000 "$tmp/ds/train-00000.bin" >"$tmp/flat.u16"
cfg "$tmp/flat.pbtxt" "dataset: \"tokens\" path: \"$tmp/flat.u16\" token_dtype: \"u16\""
out=$(bounded "$TR" --config="$tmp/flat.pbtxt" --log_dir="$tmp/l5" 2>&1) || fail "flat token file: $(tail -5 <<<"$out")"
# ... which has no validation split: an eval section is refused at start, in one line saying how
# to make one (the dataset says so: DatasetSpec::validation).
printf 'eval { batches: 1 }\n' >>"$tmp/flat.pbtxt"
out=$(bounded "$TR" --config="$tmp/flat.pbtxt" --log_dir="$tmp/l7" 2>&1); rc=$?
grep -q "^braid train: eval needs a validation split: set data { dataset: \"tokens\" path: \"<folder>\" } to a data set prepared with bazel run //tools:prepare_data -- --val_fraction=0.1 ... (data.path is \"$tmp/flat.u16\", a flat token file)" <<<"$out" &&
  [ "$rc" = 1 ] || fail "eval on a flat token file (exit $rc): $(tail -3 <<<"$out")"

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
