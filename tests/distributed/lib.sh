# Sourced by the multi-process tests of this folder (`source .../tests/distributed/lib.sh NAME`):
# the programs, a scratch folder, the runs of one process and of N processes through the
# launcher, the weight comparison, sharding, and the verdict. NAME names the scratch folder $T.
#
# Time. Each run through the launcher gets what is left of the target's own Bazel timeout
# (TEST_TIMEOUT: 300 s medium, 900 s large), less a reserve for reporting. A run never outlives
# the target, and a hung run is stopped while there is still time to print which run hung and
# its output, rather than Bazel killing the whole test with nothing said. The budget bounds a
# hang only: nothing here judges how fast anything ran.
set -uo pipefail
L="$TEST_SRCDIR/braid/launcher/launcher"
TR="$TEST_SRCDIR/braid/launcher/train"
CMP="$TEST_SRCDIR/braid/tests/testing/compare_weights.py"
T="${TEST_TMPDIR:-$(mktemp -d)}/${1:?lib.sh: name the scratch folder}"
rm -rf "$T"; mkdir -p "$T"
fails=0
fail() { echo "FAIL $*"; fails=$((fails+1)); }

# ---- the time budget ---------------------------------------------------------------------------
# $SECONDS counts from the shell's start, i.e. the test's. A tenth of the budget (at least 20 s)
# is kept for the comparisons after a run that had to be stopped, and for the launcher's own stop
# (timeout's SIGTERM, SIGKILL 10 s later: the launcher stops its workers on SIGTERM).
BUDGET_S=${TEST_TIMEOUT:-300}
RESERVE_S=$(( BUDGET_S / 10 > 20 ? BUDGET_S / 10 : 20 ))
# Seconds a run may take now: what is left of the budget. 0 when nothing is left.
time_left() {
  local left=$(( BUDGET_S - RESERVE_S - 10 - SECONDS ))
  echo $(( left > 0 ? left : 0 ))
}
# timeout(1) with the time left: COMMAND... (exit 124 when stopped, 125 when no time was left).
bounded() {
  local t; t=$(time_left)
  if [ "$t" = 0 ]; then
    echo "braid test: no time left in the target's ${BUDGET_S} s for: $*" >&2
    return 125
  fi
  timeout -k 10 "$t" "$@"
}
# How a run ended, from its exit code: for the FAIL lines.
ended() {
  case $1 in
    124) echo "stopped: it ran past the target's time budget (${BUDGET_S} s in all)" ;;
    137) echo "killed by SIGKILL (exit 137: the budget's hard stop, or something else)" ;;
    125) echo "not started: no time left in the target's budget" ;;
    *) echo "exited $1" ;;
  esac
}

# ---- runs --------------------------------------------------------------------------------------
# One process, no launcher: NAME CFG [MORE TRAIN FLAGS...] -> $T/NAME.safetensors, $T/NAME.out.
# Each run's wall time is printed ("ran NAME: N s") for sizing the targets, never judged.
run_single() {
  local name=$1 cfg=$2 t0=$SECONDS; shift 2
  bounded "$TR" --config="$cfg" --save_to="$T/$name.safetensors" --log_dir="$T/$name" "$@" \
    > "$T/$name.out" 2>&1 ||
    { fail "$name: single run $(ended $?)"; tail -5 "$T/$name.out"; return 1; }
  echo "   ran $name: $((SECONDS - t0)) s"
}
# NPROC processes through the launcher: NAME NPROC CFG -> $T/NAME.safetensors, $T/NAME.out,
# the workers' logs in $T/NAME.logs.
run_ranks() {
  local t0=$SECONDS
  bounded "$L" --nproc_per_node=$2 --log_dir="$T/$1.logs" -- --config="$3" \
    --save_to="$T/$1.safetensors" --log_dir="$T/$1" > "$T/$1.out" 2>&1 ||
    { fail "$1: launcher $(ended $?)"; tail -15 "$T/$1.out"; return 1; }
  echo "   ran $1 on $2 processes: $((SECONDS - t0)) s"
}
# The weights of A and B within TOL (absolute; tests/testing/compare_weights.py): NAME A B TOL.
compare() {
  if /usr/bin/python3 "$CMP" "$2" "$3" "$4"; then echo "ok   $1"; else fail "$1"; fi
}

# ---- sharding ----------------------------------------------------------------------------------
# A script whose BUILD target has shard_count = N says `shards N`, then runs each group of cases
# under `if shard K; then ... fi` (K in 0..N-1, each group on exactly one shard; groups are
# placed by their cost so that the shards take about as long). Run by hand (no sharding
# variables), every group runs. A shard_count that disagrees with the script fails, rather than
# leave groups that no shard runs.
SHARDS=1
SHARD_INDEX=0
shards() {
  SHARDS=$1
  [ -n "${TEST_SHARD_STATUS_FILE:-}" ] && touch "$TEST_SHARD_STATUS_FILE"  # "sharding understood"
  if [ -n "${TEST_TOTAL_SHARDS:-}" ]; then
    [ "$TEST_TOTAL_SHARDS" = "$1" ] ||
      { echo "FAIL: the script has $1 shards, the BUILD target shard_count = $TEST_TOTAL_SHARDS"; exit 1; }
    SHARD_INDEX=$TEST_SHARD_INDEX
    echo "shard $((SHARD_INDEX + 1)) of $SHARDS (Bazel's shard_$((SHARD_INDEX + 1))_of_$SHARDS; groups under \"shard $SHARD_INDEX\")"
  fi
}
# True when this shard (or an unsharded run) runs group K.
shard() {
  [ -z "${TEST_TOTAL_SHARDS:-}" ] || [ "$1" = "$SHARD_INDEX" ]
}

# ---- the verdict -------------------------------------------------------------------------------
finish() {
  [ "$fails" = 0 ] && { echo "PASS ($SECONDS s)"; exit 0; }
  echo "$fails failure(s) ($SECONDS s)"; exit 1
}
