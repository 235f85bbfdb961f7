#!/usr/bin/env bash
# The mission's literal two-node use on one machine: `launcher --nnodes=2 --node_rank=0` and
# `--node_rank=1`, nothing else set (no --master_addr, no BRAID_JOB_TOKEN, no --config), train
# the default model over both "nodes" (DDP picked because there are two ranks). Node 1 starts
# first and waits for node 0. Then node 1 alone gives up after --connect_timeout_s with one line
# saying what it waited for. Only two things differ from a user's terminal: the port (held by
# this test, handed over as $MASTER_PORT, so that parallel tests never collide) and --steps.
#
# The launchers' time is bounded by what is left of the target's own timeout (lib.sh).
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" two_node_default
mkdir -p "$T/xdg" && chmod 700 "$T/xdg"
ok() { echo "ok   $1"; }
expect_grep() {  # NAME PATTERN FILE
  if grep -qE -- "$2" "$3"; then ok "$1: /$2/"; else fail "$1: /$2/ not in $3:"; tail -20 "$3" | sed 's/^/     /'; fi
}
read -r holder ports < <(python3 "$TEST_SRCDIR/braid/tests/testing/hold_ports.py" $$ 2)
ports=($ports)
[ ${#ports[@]} = 2 ] || { echo "FAIL: could not hold ports"; exit 1; }
trap 'kill -KILL ${n1:-} $holder 2>/dev/null' EXIT

# Only the user's own private folder for the shared token; no token or master in the environment.
export XDG_RUNTIME_DIR="$T/xdg"
unset BRAID_JOB_TOKEN MASTER_ADDR MASTER_PORT RANK WORLD_SIZE
cd "$T"
# Both nodes share one deadline; node 1 runs under timeout(1) directly, so that $n1 is the pid the
# trap must kill.
both=$(time_left)
[ "$both" -gt 0 ] || { fail "no time left in the target's budget"; finish; }
MASTER_PORT=${ports[0]} timeout -k 10 "$both" "$L" --nnodes=2 --node_rank=1 -- --steps=3 > node1.out 2> node1.err &
n1=$!
MASTER_PORT=${ports[0]} timeout -k 10 "$both" "$L" --nnodes=2 --node_rank=0 -- --steps=3 > node0.out 2> node0.err
rc0=$?
wait $n1; rc1=$?
[ $rc0 = 0 ] && ok "node 0: exit code 0" || { fail "node 0: exit code $rc0"; tail -20 node0.err; }
[ $rc1 = 0 ] && ok "node 1: exit code 0" || { fail "node 1: exit code $rc1"; tail -20 node1.err; }
expect_grep "node 0 says where the master is" "no --master_addr given: node 0 is this machine \(127\.0\.0\.1:${ports[0]}\)" node0.err
expect_grep "default model, DDP over both nodes" "^braid: training gpt-mini .* strategy ddp, 3 step\(s\) .* x 2 data-parallel rank\(s\)" node0.out
expect_grep "training finished" "^braid: done: " node0.out
# Both launchers agreed on one run folder, named after the run (no config: gpt-mini), holding
# every rank's worker log, metrics and train.log.
folders=$(ls "$T/runs")
if [ "$(echo "$folders" | wc -l)" = 1 ] && [[ "$folders" =~ ^gpt-mini-[0-9]{8}-[0-9]{6}$ ]] &&
   [ -s "runs/$folders/workerlog.0" ] && [ -s "runs/$folders/workerlog.1" ] &&
   [ -s "runs/$folders/metrics.jsonl" ] && [ -s "runs/$folders/metrics.jsonl.rank1" ]; then
  ok "one run folder for both nodes: runs/$folders"
else
  fail "run folders: $(for f in $folders; do echo "$f: $(ls "runs/$f" | tr '\n' ' ')"; done)"
fi
token_files=$(ls "$XDG_RUNTIME_DIR/braid" | grep -c "^job-token-127.0.0.1-${ports[0]}$")
[ "$token_files" = 1 ] && ok "one shared token file" || fail "$token_files token files: $(ls "$XDG_RUNTIME_DIR/braid")"
[ "$(stat -c %a "$XDG_RUNTIME_DIR/braid/job-token-127.0.0.1-${ports[0]}")" = 600 ] &&
  ok "token file readable by its owner only" || fail "token file mode $(stat -c %a "$XDG_RUNTIME_DIR/braid/job-token-127.0.0.1-${ports[0]}")"

# Node 1 alone: nobody serves the held port, so every connect is refused until the timeout.
MASTER_PORT=${ports[1]} bounded "$L" --nnodes=2 --node_rank=1 --connect_timeout_s=2 -- --steps=3 \
  > alone.out 2> alone.err
rc=$?
[ $rc = 2 ] && ok "node 1 alone: exit code 2" || fail "node 1 alone: exit code $rc, want 2"
expect_grep "node 1 alone says what it waited for" "^braid launcher: node 1 cannot use the rendezvous store at 127\.0\.0\.1:${ports[1]}: could not connect to the Braid store at 127\.0\.0\.1:${ports[1]} within 2s .*The master \(node 0's launcher\) may be down or not started yet" alone.err
n=$(grep -c "^braid launcher: node 1 cannot" alone.err)
[ "$n" = 1 ] && ok "node 1 alone: one line" || fail "node 1 alone: $n error lines"
finish
