#!/usr/bin/env bash
# End to end: the launcher trains gpt-mini on Moby Dick for a few dozen steps through the real
# program, plugin loading included; the loss must fall well below ln(256) = 5.55 and the run must
# leave a complete metrics file and log.
# The run's time is bounded by the target's own timeout (lib.sh): a hang fails with its output.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" gpt_mini
set -e
launcher="$L"
out="$T/run"
steps=40
bounded "$launcher" --config="$TEST_SRCDIR/braid/launcher/configs/gpt-mini.pbtxt" --steps=$steps \
  --log_dir="$out" > "$out.stdout" 2>&1 || { cat "$out.stdout"; echo "FAIL: training exited non-zero"; exit 1; }
cat "$out.stdout"
grep -q '^braid: done: ' "$out.stdout" || { echo "FAIL: no summary line"; exit 1; }
[ -s "$out/train.log" ] || { echo "FAIL: no train.log"; exit 1; }
lines=$(grep -c '"step"' "$out/metrics.jsonl")
[ "$lines" = "$steps" ] || { echo "FAIL: $lines step records in metrics.jsonl, want $steps"; exit 1; }
/usr/bin/python3 - "$out/metrics.jsonl" <<'PY'
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "step" in r]
summary = [r for r in recs if r.get("summary")]
assert summary, "no summary record"
first, last = steps[0]["loss"], sum(r["loss"] for r in steps[-5:]) / 5
print(f"first loss {first:.4f}, mean of last 5 {last:.4f}, ln(256) = {math.log(256):.4f}")
assert abs(first - math.log(256)) < 0.15, f"initial loss {first} should be near ln(256)"
assert last < 3.5, f"loss after {len(steps)} steps is {last}, expected well below ln(256)"
PY
echo PASS
