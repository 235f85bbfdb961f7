#!/usr/bin/env bash
set -uo pipefail
d="${TEST_TMPDIR:-$(mktemp -d)}/job"
timeout 120 "$TEST_SRCDIR/braid/launcher/launcher" --nproc_per_node=3 --log_dir="$d" \
  --program="$TEST_SRCDIR/braid/tests/distributed/allreduce_job" > "$d.out" 2>&1
rc=$?
cat "$d.out"
[ "$rc" = 0 ] || { echo "FAIL: launcher exited $rc"; for f in "$d"/workerlog.*; do echo "== $f"; tail -5 "$f"; done; exit 1; }
for r in 0 1 2; do
  grep -q "allreduce job: rank $r of 3 ok" "$d/workerlog.$r" || { echo "FAIL: rank $r did not finish"; cat "$d/workerlog.$r"; exit 1; }
done
echo PASS
