#!/usr/bin/env bash
# Metrics are never lost (launcher/metrics_file.h has the rule):
#   1. a worker killed at step 3 under --max_restarts=1 (checkpoints every 2 steps): the restarted
#      group resumes at step 2 and appends; every process of the job, both attempts, writes into
#      one folder, runs/<config name>-<time> (the launcher's choice, no --log_dir anywhere); the
#      metrics hold steps 0-5 exactly once, in order, each with a wall-clock "time";
#   2. the same command again resumes at its last step: it says there is nothing to train (not
#      "loss 0.0000 -> 0.0000") and leaves the metrics as they were; it writes them in the first
#      run's folder, which the checkpoint names (no --log_dir given);
#   3. the same command with --steps=8 resumes at step 6 and appends steps 6-7 to that folder's
#      metrics: 0-7 once, and the two runs' summaries.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" metrics_restart
cd "$T"
cat > "$T/restart-ddp.pbtxt" <<CFG
model { name: "gpt-mini" n_layer: 1 }
data { dataset: "moby-dick" sampler: "sequential" }
train_micro_batch_size_per_gpu: 2
steps: 6
optimizer { type: "AdamW" params { lr: 0.001 } }
strategy { name: "ddp" }
checkpoint { dir: "$T/ckpt" every_steps: 2 }
CFG
# STEPS [MORE TRAIN FLAGS]: checks the folder's metrics hold steps 0..STEPS-1 once, in order,
# stamped with times that never go back, and prints them.
check_metrics() {
  /usr/bin/python3 - "$@" <<'PY'
import json, math, sys
path, want, summaries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(path)]
steps = [r["step"] for r in rows if "step" in r]
assert steps == list(range(want)), f"{path}: steps {steps}, want 0..{want - 1} once each"
times = [r["time"] for r in rows]
assert all(isinstance(t, float) and math.isfinite(t) and t > 1.6e9 for t in times), times
assert all(a <= b for a, b in zip(times, times[1:])), f"times go back: {times}"
got = [r["steps"] for r in rows if r.get("summary")]
assert len(got) == summaries, f"{path}: summaries {got}, want {summaries}"
print(f"ok   {path.split('/')[-2]}/{path.split('/')[-1]}: steps {steps}, summaries for {got}")
PY
}

# ---- 1. a restart appends, into the one folder ------------------------------------------------
BRAID_FAULT=kill_at_step:3 bounded "$L" --nproc_per_node=2 --max_restarts=1 -- \
  --config="$T/restart-ddp.pbtxt" > "$T/first.out" 2>&1
rc=$?
[ $rc = 0 ] || { fail "restarted job: $(ended $rc)"; tail -20 "$T/first.out"; finish; }
grep -q "resumed from $T/ckpt/step_2 (step 2 of 6)" "$T/first.out" &&
  echo "ok   the restarted group resumed at step 2" || fail "no resume from step_2"
folders=$(ls "$T/runs")
if [ "$(echo "$folders" | wc -l)" = 1 ] && [[ "$folders" =~ ^restart-ddp-[0-9]{8}-[0-9]{6}$ ]]; then
  echo "ok   one run folder, named after the config: runs/$folders"
else
  fail "run folders: $(echo $folders), want one restart-ddp-<date>-<time>"; finish
fi
R="$T/runs/$folders"
for f in workerlog.0 workerlog.1 train.log train.rank1.log metrics.jsonl metrics.jsonl.rank1; do
  [ -s "$R/$f" ] || fail "runs/$folders/$f is missing or empty (have: $(ls "$R" | tr '\n' ' '))"
done
check_metrics "$R/metrics.jsonl" 6 1 || fail "metrics after the restart"
check_metrics "$R/metrics.jsonl.rank1" 6 1 || fail "rank 1's metrics after the restart"
grep -q "dropped .* line(s) of an earlier attempt, for steps from 2 on" "$R/train.log" &&
  echo "ok   train.log says which lines the restart replaced" || fail "no 'dropped' note in train.log"

# ---- 2. resumed at its last step ---------------------------------------------------------------
cp "$R/metrics.jsonl" "$T/before.jsonl"
[ "$(cat "$T/ckpt/run_folder" 2>/dev/null)" = "$R" ] && echo "ok   the checkpoint names the run folder" ||
  fail "ckpt/run_folder holds '$(cat "$T/ckpt/run_folder" 2>/dev/null)', want $R"
bounded "$L" --nproc_per_node=2 -- --config="$T/restart-ddp.pbtxt" > "$T/again.out" 2>&1 ||
  fail "the run resumed at its end: $(ended $?)"
if grep -q "^braid: nothing to train: the checkpoint is at step 6 and the run has 6 step(s)" "$T/again.out" &&
   ! grep -q "^braid: done:" "$T/again.out"; then
  echo "ok   resumed at its last step: $(grep '^braid: nothing' "$T/again.out" | cut -c1-90)..."
else
  fail "a run resumed at its end should say so"; tail -5 "$T/again.out"
fi
cmp -s "$T/before.jsonl" "$R/metrics.jsonl" && echo "ok   its metrics are unchanged" ||
  fail "a run with nothing to train changed the metrics"

# ---- 3. extended: appends ---------------------------------------------------------------------
bounded "$L" --nproc_per_node=2 -- --config="$T/restart-ddp.pbtxt" --steps=8 \
  > "$T/more.out" 2>&1 || fail "the extended run: $(ended $?)"
grep -q "^braid: done: 8 steps (7-8 in this run, resumed at step 6)" "$T/more.out" &&
  echo "ok   $(grep '^braid: done:' "$T/more.out" | cut -c1-80)..." || fail "no done line of the extended run"
check_metrics "$R/metrics.jsonl" 8 2 || fail "metrics after extending the run"
finish
