#!/usr/bin/env bash
# Elastic training across three real nodes: three network namespaces (10.124.0.1-3), each
# joined by a veth pair to a bridge in a fourth ("hub"), one launcher in each with
# --nnodes=2:3, gpt-mini DDP (1 rank per node), train_batch_size 12 with micro-batch 2 (so
# gradient accumulation is 2 at world size 3 and 3 at world size 2), a checkpoint every 4 steps.
#   loss    - node 2's launcher is killed (SIGKILL) while training: nodes 0 and 1 regroup as a
#             round of 2, resume from the newest checkpoint (resharded, accumulation 3) and finish;
#             the log names the lost node and the step. Their final weights equal, bit for bit,
#             those of a second job of nodes 0 and 1 alone resumed from a copy of the checkpoint
#             folder holding only the checkpoints up to that step.
#   rejoin  - three nodes again; node 2's launcher is killed, nodes 0 and 1 go on as a round of
#             2, then node 2's launcher is started again: it waits in the rendezvous, the group
#             stops at its next checkpoint and all three go on as a round of 3 (accumulation 2)
#             to the end. Their final weights equal, bit for bit, those of a three-node job
#             resumed from a copy of the checkpoints up to the one they regrouped at.
# After each job no process may be left in any namespace; on any failure the trap kills every
# process there and deletes the namespaces.
#
# Needs root with network-admin rights and the data; Bazel runs it only where third_party/host
# found them (SKIPPED elsewhere), so here a failure to set them up is a failure of the test.
set -uo pipefail
L="$TEST_SRCDIR/braid/launcher/launcher"
export BRAID_DATA_DIR="$(dirname "$(dirname "$(dirname "$(readlink -f "$TEST_SRCDIR/braid/tests/twonode/BUILD")")")")/data"
T="${TEST_TMPDIR:-$(mktemp -d)}/elastic"
rm -rf "$T" && mkdir -p "$T"
fails=0
ok() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
expect_grep() {  # NAME PATTERN FILE
  if grep -qE -- "$2" "$3"; then ok "$1: /$2/"; else fail "$1: /$2/ not in $3:"; sed 's/^/     /' "$3" | tail -20; fi
}
expect_rc() {  # NAME WANT GOT
  [ "$2" = "$3" ] && ok "$1: exit code $3" || fail "$1: exit code $3, want $2"
}

id="$(( $$ % 100000 ))$(printf '%04x' $((RANDOM % 65536)))"
hub="braid_eh_$id"
ns=("braid_e0_$id" "braid_e1_$id" "braid_e2_$id")
addr=(10.124.0.1 10.124.0.2 10.124.0.3)
cleanup() {
  for n in "${ns[@]}" "$hub"; do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$n" 2>/dev/null  # takes its ends of the veth pairs with it
  done
}
trap cleanup EXIT

setup() {
  ip netns add "$hub" && ip -n "$hub" link add br0 type bridge && ip -n "$hub" link set br0 up || return 1
  for i in 0 1 2; do
    # Made inside the hub with the node's end in the node's namespace: never in the machine's own.
    ip netns add "${ns[$i]}" &&
      ip -n "$hub" link add "h$i" type veth peer name "e$i" netns "${ns[$i]}" &&
      ip -n "$hub" link set "h$i" master br0 && ip -n "$hub" link set "h$i" up &&
      ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev "e$i" &&
      ip -n "${ns[$i]}" link set lo up && ip -n "${ns[$i]}" link set "e$i" up || return 1
  done
}
if ! err=$(setup 2>&1); then
  echo "FAIL: running as root but cannot create the namespaces and the bridge: $err"
  exit 1
fi
ok "nodes ${addr[*]} on a bridge in $hub"

export BRAID_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
unset MASTER_ADDR MASTER_PORT

config() {  # FILE CHECKPOINT_DIR
  cat > "$1" <<EOF
model { name: "gpt-mini" }
data { dataset: "moby-dick" sampler: "random" seed: 1234 }
train_batch_size: 12
train_micro_batch_size_per_gpu: 2
steps: 24
optimizer { type: "AdamW" params { lr: 1e-3 } }
scheduler { type: "Constant" }
strategy { name: "ddp" }
communicator: "gloo"
device: "cpu"
threads: 1
log { print_every: 1 }
collective_timeout_s: 60
checkpoint { dir: "$2" every_steps: 4 keep_last: 100 }
EOF
}

# Starts node N's launcher of job NAME in its namespace, in the background, under a watchdog
# (a hung launcher is killed after 240 s and the job fails); sets pid[N], the watchdog's pid,
# whose one child is the launcher.
declare -a pid
start() {  # NAME N program-args...
  local name=$1 n=$2; shift 2
  mkdir -p "$T/$name"
  ip netns exec "${ns[$n]}" timeout -s KILL 240 "$L" --nnodes=2:3 --node_rank=$n --nproc_per_node=1 \
    --master_addr=${addr[0]} --master_port=29500 --rdzv_last_call_s=3 --heartbeat_timeout_s=10 \
    --stop_grace_s=3 --connect_timeout_s=30 --rdzv_timeout_s=60 --log_dir="$T/$name/logs$n" \
    -- "$@" > "$T/$name/stdout$n" 2> "$T/$name/stderr$n" &
  pid[$n]=$!
}
# Waits until FILE has a line matching PATTERN (the event a step waits for), at most 120 s.
wait_for() {  # PATTERN FILE
  for _ in $(seq 1200); do
    grep -qE -- "$1" "$2" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
nothing_left() {  # NAME
  for n in "${ns[@]}"; do
    left=$(ip netns pids "$n" | tr '\n' ' ')
    [ -z "$left" ] && ok "$1: nothing left running in $n" || fail "$1: still running in $n: $left"
  done
}

# A job of NODES nodes (0..NODES-1) resumed from a copy of JOB's checkpoints up to STEP, to the
# end; its final weights must equal JOB's bit for bit (WHAT names the check).
resumed_equals() {  # NAME JOB_DIR STEP NODES WHAT
  local name=$1 job=$2 step=$3 nodes=$4 what=$5 b="$T/$1" n s
  mkdir -p "$b"
  cp -a "$job/ckpt" "$b/ckpt"
  for s in "$b"/ckpt/step_*; do [ "${s##*_}" -gt "$step" ] && rm -rf "$s"; done
  config "$b/cfg.pbtxt" "$b/ckpt"
  for n in $(seq 0 $((nodes - 1))); do start "$name" $n --config="$b/cfg.pbtxt" --save_to="$b/final.safetensors"; done
  for n in $(seq 0 $((nodes - 1))); do wait "${pid[$n]}"; expect_rc "$name node $n" 0 $?; done
  nothing_left "$name"
  expect_grep "$name: from step $step" "resumed from .*/step_$step " "$b/logs0/workerlog.0"
  if [ -s "$job/final.safetensors" ] && cmp -s "$job/final.safetensors" "$b/final.safetensors"; then
    ok "$what, bit for bit"
  else
    fail "$what: they differ (or are missing)"
  fi
}

# ---- loss: three nodes, node 2's launcher killed, two finish -------------------------------
d="$T/loss"
mkdir -p "$d"
config "$d/cfg.pbtxt" "$d/ckpt"
for n in 0 1 2; do start loss $n --config="$d/cfg.pbtxt" --save_to="$d/final.safetensors"; done
if wait_for "^step +10/24" "$d/logs0/workerlog.0"; then
  pkill -KILL -P "${pid[2]}"  # the launcher; its worker gets SIGKILL too (PR_SET_PDEATHSIG)
  ok "loss: node 2's launcher killed at step 10"
else
  fail "loss: training never reached step 10"
fi
wait "${pid[0]}"; rc0=$?
wait "${pid[1]}"; rc1=$?
expect_rc "loss node 0" 0 $rc0
expect_rc "loss node 1" 0 $rc1
nothing_left loss
for n in 0 1; do
  expect_grep "loss node $n: three" "^braid launcher: round 0: starting with 3 node\(s\)" "$d/stderr$n"
  expect_grep "loss node $n: named" "^braid launcher: round [0-9]+: node 2 \(host [^)]*\) lost \(.*\); continuing with 2 node\(s\) from the checkpoint of step (4|8) \(world size 2\)" "$d/stderr$n"
done
expect_grep "loss: the table" "^  world size 2 \(2 node\(s\)\): data-parallel 2, gradient accumulation 3" "$d/stdout0"
expect_grep "loss: accumulation 3 at 2" "micro-batch 2 x 3 accumulation x 2 data-parallel" "$d/stdout0"
# The step the survivors resumed from, as the training program says it.
from=$(grep -oE "resumed from .*/step_[0-9]+" "$d/logs0/workerlog.0" | tail -1 | grep -oE "[0-9]+$")
if [ -n "$from" ]; then ok "loss: resumed from step $from"; else fail "loss: no resume in $d/logs0/workerlog.0"; from=0; fi
expect_grep "loss: the launcher's step is the program's" "from the checkpoint of step $from " "$d/stderr0"

# The same two nodes, resumed from a copy of the checkpoints up to that step.
resumed_equals resumed "$d" "$from" 2 "loss: final weights equal the two-node run's from step $from"

# ---- rejoin: node 2 killed, then started again: three again --------------------------------
j="$T/rejoin"
mkdir -p "$j"
config "$j/cfg.pbtxt" "$j/ckpt"
for n in 0 1 2; do start rejoin $n --config="$j/cfg.pbtxt" --save_to="$j/final.safetensors"; done
if wait_for "^step +6/24" "$j/logs0/workerlog.0"; then
  pkill -KILL -P "${pid[2]}"
  ok "rejoin: node 2's launcher killed at step 6"
else
  fail "rejoin: training never reached step 6"
fi
wait "${pid[2]}" 2>/dev/null
# Started again once the two go on without it (its first logs stay in rejoin/).
if wait_for "^braid launcher: round [0-9]+: node 2 \(host [^)]*\) lost" "$j/stderr0"; then
  start rejoin-again 2 --config="$j/cfg.pbtxt" --save_to="$j/final.safetensors"
else
  fail "rejoin: the survivors never named node 2 lost"
fi
for n in 0 1 2; do wait "${pid[$n]}"; rcs[$n]=$?; done
for n in 0 1 2; do expect_rc "rejoin node $n" 0 ${rcs[$n]}; done
nothing_left rejoin
a="$T/rejoin-again"
expect_grep "rejoin: two after the loss" "^braid launcher: round 1: node 2 \(host [^)]*\) lost \(.*\); continuing with 2 node\(s\) from the checkpoint of step [0-9]+ \(world size 2\)" "$j/stderr0"
expect_grep "rejoin: noticed" "^braid launcher: node 2 \(host [^)]*\) waits to join; the group regroups at its next checkpoint" "$j/stderr0"
expect_grep "rejoin: three again" "^braid launcher: round 2: node 2 \(host [^)]*\) joined; continuing with 3 node\(s\) from the checkpoint of step (8|12|16|20) \(world size 3\)" "$a/stderr2"
expect_grep "rejoin: stopped at the checkpoint" "stopped after the checkpoint of step [0-9]+: node 2 \(host [^)]*\) waits to join" "$j/logs1/workerlog.1"
expect_grep "rejoin: accumulation 2 at 3" "micro-batch 2 x 2 accumulation x 3 data-parallel" "$j/stdout0"
at=$(grep -oE "joined; continuing with 3 node\(s\) from the checkpoint of step [0-9]+" "$a/stderr2" | grep -oE "[0-9]+$")
if [ -n "$at" ]; then ok "rejoin: three from step $at"; else fail "rejoin: no regroup step in $a/stderr2"; at=0; fi
expect_grep "rejoin: node 2 resumed there" "^braid: resumed from .*/step_$at " "$a/logs2/workerlog.2"

# Three nodes, resumed from a copy of the checkpoints up to the regroup.
resumed_equals rejoin-resumed "$j" "$at" 3 "rejoin: final weights equal the three-node run's from step $at"

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
