#!/usr/bin/env bash
# A user's own training program (launcher/examples/my_train: braid::Session in its own main())
# started both ways, against the training program's own run of the same config:
#   spawn    - `my_train --nprocs=2` alone: braid::Spawn runs the launcher's code in-process
#              (2 workers of my_train, the store, logs in --log_dir); every step's loss of both
#              ranks exactly as `launcher --nproc_per_node=2 -- --config=C` (the training program);
#   launcher - `launcher --nproc_per_node=2 --program=my_train`: the same losses exactly;
#   failure  - a config that does not exist: each worker names it, the launcher's code in Spawn
#              names the failed rank and its exit code, and my_train exits 1 with no worker left;
#   sigterm  - SIGTERM to my_train once rank 0 has printed its first step: forwarded to the
#              workers, exit code 143, both workers gone when it returns.
# The losses are the same arithmetic on the same data in the same processes' layout; only the
# program around the engine differs (launcher/trainer.h's TrainingRun).
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" my_train
MT="$TEST_SRCDIR/braid/launcher/examples/my_train/my_train"
config="$(readlink -f "$TEST_SRCDIR/braid/launcher/configs/gpt-mini-ddp.pbtxt")"
ok() { echo "ok   $1"; }
expect_grep() {  # NAME PATTERN FILE
  if grep -qE -- "$2" "$3"; then ok "$1: /$2/"; else fail "$1: /$2/ not in $3:"; tail -20 "$3" | sed 's/^/     /'; fi
}
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE BRAID_RESTART_COUNT BRAID_RUN_DIR
cd "$T"

# Every step's loss, as the program wrote it (8 decimals), rank by rank.
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1"; }
same_losses() {  # NAME DIR
  local f
  for f in metrics.jsonl metrics.jsonl.rank1; do
    losses "ref/$f" > "ref.$f.losses"; losses "$2/$f" > "$2.$f.losses"
    if [ "$(wc -l < "ref.$f.losses")" != 3 ] || grep -qviE '^[0-9]+ -?[0-9]+\.[0-9]+$' "ref.$f.losses"; then
      fail "$1: the reference's $f has not 3 finite losses:"; cat "ref.$f.losses"
    elif cmp -s "ref.$f.losses" "$2.$f.losses"; then
      ok "$1: $f: the 3 losses equal the training program's exactly: $(cut -d' ' -f2 "$2.$f.losses" | tr '\n' ' ')"
    else
      fail "$1: $f: the losses differ (step loss, the training program's then my_train's):"
      paste "ref.$f.losses" "$2.$f.losses" | sed 's/^/     /'
    fi
  done
}

# ---- the training program's own run ------------------------------------------------------------
t0=$SECONDS
bounded "$L" --nproc_per_node=2 --log_dir="$T/ref" -- --config="$config" --steps=3 > ref.out 2> ref.err ||
  { fail "reference run $(ended $?)"; tail -20 ref.err ref/workerlog.*; }
echo "   ran the training program: $((SECONDS - t0)) s"

# ---- spawn -------------------------------------------------------------------------------------
t0=$SECONDS
bounded "$MT" --nprocs=2 --config="$config" --steps=3 --log_dir="$T/spawn" > spawn.out 2> spawn.err
rc=$?
echo "   ran my_train --nprocs=2: $((SECONDS - t0)) s"
[ $rc = 0 ] && ok "spawn: exit code 0" || { fail "spawn: $(ended $rc)"; tail -20 spawn.err spawn/workerlog.*; }
expect_grep "spawn: rank 0 says what it did" "^my_train: 2 rank\(s\) trained 3 step\(s\); last loss [0-9]+\.[0-9]+$" spawn.out
expect_grep "spawn: DDP over the two workers" "^braid: training gpt-mini .* strategy ddp, 3 step\(s\) .* x 2 data-parallel rank\(s\)" spawn.out
for r in 0 1; do
  [ -s "spawn/workerlog.$r" ] && ok "spawn: rank $r's log" || fail "spawn: no spawn/workerlog.$r"
done
same_losses spawn spawn

# ---- launcher --program ------------------------------------------------------------------------
t0=$SECONDS
bounded "$L" --nproc_per_node=2 --log_dir="$T/launched" --program="$MT" -- --config="$config" \
  --steps=3 > launched.out 2> launched.err
rc=$?
echo "   ran launcher --program=my_train: $((SECONDS - t0)) s"
[ $rc = 0 ] && ok "launcher: exit code 0" || { fail "launcher: $(ended $rc)"; tail -20 launched.err launched/workerlog.*; }
expect_grep "launcher: rank 0 says what it did" "^my_train: 2 rank\(s\) trained 3 step\(s\)" launched.out
same_losses launcher launched

# ---- failure -----------------------------------------------------------------------------------
bounded "$MT" --nprocs=2 --config="$T/no-such.pbtxt" --log_dir="$T/failed" > failed.out 2> failed.err
rc=$?
[ $rc = 1 ] && ok "failure: exit code 1" || { fail "failure: $(ended $rc), want 1"; tail -20 failed.err; }
expect_grep "failure: the failed rank named" "^braid launcher: rank [01] \(node 0, host [^,]+, pid [0-9]+\) exited with code 1" failed.err
expect_grep "failure: the worker's own message" "my_train: rank [01]: .*no-such\.pbtxt" failed.err

# ---- sigterm -----------------------------------------------------------------------------------
# Stopped at a step observed in rank 0's output (never after a sleep); its workers' pids from the
# launcher's process table are checked once my_train has returned.
timeout -k 10 "$(time_left)" "$MT" --nprocs=2 --config="$config" --steps=100000 --log_dir="$T/term" \
  > term.out 2> term.err &
pid=$!  # timeout's; my_train is its child
until ! kill -0 $pid 2>/dev/null || grep -qsE "^step +1/" term.out; do
  sleep 0.05  # polls rank 0's output for the readiness line; the run's timeout bounds the loop
done
workers=$(pgrep -P "$(pgrep -P $pid)" | tr '\n' ' ')  # timeout -> my_train -> its workers
kill -TERM "$(pgrep -P $pid)"
wait $pid
rc=$?
[ $rc = 143 ] && ok "sigterm: exit code 143" || { fail "sigterm: $(ended $rc), want 143"; tail -20 term.err; }
expect_grep "sigterm: said" "^braid launcher: node 0's launcher received SIGTERM; stopping the job" term.err
[ -n "$workers" ] && ok "sigterm: workers seen: $workers" || fail "sigterm: no workers seen"
left=""
for p in $workers; do [ "$(cat /proc/$p/comm 2>/dev/null)" = my_train ] && left="$left $p"; done
[ -z "$left" ] && ok "sigterm: no worker left running" || fail "sigterm: workers still running:$left"
finish
