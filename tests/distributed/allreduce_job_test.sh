#!/usr/bin/env bash
# --nproc_per_node=3 on one node: three processes join through the launcher's store and
# allreduce over Gloo. The launcher's time is bounded by the target's own timeout (lib.sh).
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" job
bounded "$L" --nproc_per_node=3 --log_dir="$T" \
  --program="$TEST_SRCDIR/braid/tests/distributed/allreduce_job" > "$T.out" 2>&1
rc=$?
cat "$T.out"
[ "$rc" = 0 ] || { echo "FAIL: launcher $(ended $rc)"; for f in "$T"/workerlog.*; do echo "== $f"; tail -5 "$f"; done; exit 1; }
for r in 0 1 2; do
  grep -q "allreduce job: rank $r of 3 ok" "$T/workerlog.$r" || { fail "rank $r did not finish"; cat "$T/workerlog.$r"; }
done
finish
