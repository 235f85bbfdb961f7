#!/usr/bin/env bash
# End to end: the launcher starts real worker processes (the probe) on loopback and must give
# them the environment contract, report a crash with the rank, its exit code or signal and its
# log's last lines, stop everything else in bounded time, restart on request, forward signals,
# and fail fast with a clear message on every rendezvous error. After every case, every process
# the workers recorded (workers and their children) must be gone.
set -uo pipefail
L="$TEST_SRCDIR/braid/launcher/launcher"
P="$TEST_SRCDIR/braid/tests/launcher/probe"
T="${TEST_TMPDIR:-$(mktemp -d)}/launcher_test"
rm -rf "$T" && mkdir -p "$T"
fails=0
bg=()

# Whatever happens, leave nothing running: launchers and helpers we started, then any recorded
# worker or child still running (checked by name: a recorded pid may have been reused since).
cleanup() {
  for p in "${bg[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in $(cat "$T"/*/out/pid.*[0-9] 2>/dev/null); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = probe ] && kill -KILL "$p" 2>/dev/null
  done
}
trap cleanup EXIT

ok() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# Ports are held, never guessed (tests/testing/hold_ports.py says how): 18 for the whole
# script; the helper's line of pid and ports is its readiness signal.
read -r holder held_ports < <(python3 "$TEST_SRCDIR/braid/tests/testing/hold_ports.py" $$ 18)
held_ports=($held_ports)
next_port=0
[ -n "${holder:-}" ] && [ ${#held_ports[@]} = 18 ] || { echo "FAIL: could not hold ports"; exit 1; }
bg+=($holder)
# Sets $port to a held port no other case uses.
take_port() {
  port=${held_ports[$next_port]:?"out of held ports: hold more"}
  next_port=$((next_port + 1))
}
# Starts a case folder: $T/<name>/{out,logs}; prints its path.
case_dir() { mkdir -p "$T/$1/out" "$T/$1/logs"; echo "$T/$1"; }
# Recorded pids (workers and their children) still alive; zombies count as gone with "zombies-ok".
# (pid.*[0-9]: not a pid.R.A.tmp the probe is writing.)
still_running() {  # DIR [zombies-ok]
  local left="" state
  for p in $(cat "$1"/out/pid.*[0-9] 2>/dev/null); do
    kill -0 "$p" 2>/dev/null || continue
    state=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)
    [ -z "$state" ] && continue  # gone meanwhile
    [ -n "${2:-}" ] && [ "$state" = Z ] && continue
    left="$left $p($state)"
  done
  echo "$left"
}
# Every recorded pid must be gone: reaped by the launcher before it returned (checked at once),
# or, with a third argument (its launcher was SIGKILLed, so its workers die of PR_SET_PDEATHSIG
# on their own time), at least dead, a zombie waiting for whoever adopted it (waited for, 20 s
# at most).
assert_gone() {  # NAME DIR [zombies-ok]
  local left tries=1
  [ -n "${3:-}" ] && tries=400
  for _ in $(seq $tries); do
    left=$(still_running "$2" "${3:-}")
    [ -z "$left" ] && break
    sleep 0.05
  done
  [ -z "$left" ] && ok "$1: no process left" || fail "$1: still running:$left"
}
expect_grep() {  # NAME PATTERN FILE
  if grep -qE -- "$2" "$3"; then ok "$1: /$2/"; else fail "$1: /$2/ not in $3:"; sed 's/^/     /' "$3" | tail -20; fi
}
expect_rc() {  # NAME WANT GOT
  [ "$2" = "$3" ] && ok "$1: exit code $3" || fail "$1: exit code $3, want $2"
}
# A probe writes its pid file once it is set up (SIGTERM ignored, child spawned): from then on it
# may be signalled.
wait_for_pids() {  # DIR COUNT: until COUNT pid files exist (30 s at most)
  for _ in $(seq 600); do
    [ "$(ls "$1"/out/pid.*[0-9] 2>/dev/null | wc -l)" -ge "$2" ] && return 0
    sleep 0.05
  done
  return 1
}
# Waits for a background pid (bounded); its exit code in $RC ("timeout" if it had to be killed).
wait_bounded() {  # PID SECONDS
  for _ in $(seq $(( $2 * 20 ))); do
    kill -0 "$1" 2>/dev/null || { wait "$1"; RC=$?; return; }
    sleep 0.05
  done
  kill -KILL "$1" 2>/dev/null
  wait "$1"
  RC=timeout
}

export BRAID_JOB_TOKEN=""
unset MASTER_ADDR MASTER_PORT

# ---- 1. Three workers, end to end -------------------------------------------------------------
d=$(case_dir nproc3)
timeout 60 "$L" --nproc_per_node=3 --program="$P" --log_dir="$d/logs" -- --out_dir="$d/out" \
  --exchange > "$d/stdout" 2> "$d/stderr"
expect_rc nproc3 0 $?
for r in 0 1 2; do
  # The contract, checked from the outside too: ranks node by node, loopback master, a token.
  expect_grep "nproc3 env $r" "^RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=[0-9]+ TOKEN_LEN=64 RESTART=0$" "$d/out/env.$r.0"
  # 1 + 2 + 5: every rank read every rank's value through the store.
  expect_grep "nproc3 log $r" "probe: rank $r on .*: exchange ok, sum 8 over 3 ranks" "$d/logs/workerlog.$r"
done
expect_grep "nproc3 console has rank 0" "probe: rank 0 done" "$d/stdout"
grep -q "probe: rank 1" "$d/stdout" && fail "nproc3: rank 1's output on the console" || ok "nproc3: only rank 0 on the console"
ports=$(cat "$d"/out/env.* | sed 's/.*MASTER_PORT=\([0-9]*\).*/\1/' | sort -u | wc -l)
[ "$ports" = 1 ] && ok "nproc3: one master port for all" || fail "nproc3: $ports different ports"
assert_gone nproc3 "$d"

# ---- 2. A crash (exit 3) stops the others -----------------------------------------------------
for how in exit3 segv; do
  d=$(case_dir "crash_$how")
  t0=$(now_ms)
  timeout 60 "$L" --nproc_per_node=3 --program="$P" --log_dir="$d/logs" --stop_grace_s=5 -- \
    --out_dir="$d/out" --crash_rank=1 --crash=$how --crash_after_ms=500 --sleep_s=120 --lines=15 \
    --spawn_child > "$d/stdout" 2> "$d/stderr"
  rc=$?; took=$(( $(now_ms) - t0 ))
  expect_rc "crash_$how" 1 $rc
  # The others sleep 120 s: exit code 1 (not `timeout 60`'s 124) says the launcher stopped them.
  echo "     (stopped in ${took} ms)"
  if [ $how = exit3 ]; then
    expect_grep "crash_$how" "^braid launcher: rank 1 \(node 0, host [^,]+, pid [0-9]+\) exited with code 3\. Last 10 line\(s\) of $d/logs/workerlog.1:" "$d/stderr"
  else
    expect_grep "crash_$how" "^braid launcher: rank 1 \(node 0, .*\) was killed by signal 11 \(SIGSEGV: Segmentation fault" "$d/stderr"
  fi
  expect_grep "crash_$how tail" "^  \| probe: rank 1 crashing on purpose \($how\)$" "$d/stderr"
  expect_grep "crash_$how tail" "^  \| probe: rank 1 line 15$" "$d/stderr"
  n=$(grep -c "^braid launcher: rank 1 " "$d/stderr")
  [ "$n" = 1 ] && ok "crash_$how: one message" || fail "crash_$how: $n messages about rank 1"
  grep -q "line 5$" "$d/stderr" && fail "crash_$how: more than 10 lines of tail" || ok "crash_$how: tail is 10 lines"
  [ "$(ls "$d"/out/pid.*[0-9] | wc -l)" = 3 ] && ok "crash_$how: 3 workers ran" || fail "crash_$how: $(ls "$d"/out/pid.*[0-9] | wc -l) pid files"
  assert_gone "crash_$how" "$d"
done

# ---- 3. --max_restarts restarts the whole group ------------------------------------------------
d=$(case_dir restart)
timeout 60 "$L" --nproc_per_node=3 --program="$P" --log_dir="$d/logs" --max_restarts=1 -- \
  --out_dir="$d/out" --crash_rank=2 --crash_attempts=1 --crash_after_ms=200 --sleep_s=1 --exchange \
  > "$d/stdout" 2> "$d/stderr"
expect_rc restart 0 $?
expect_grep restart "rank 2 .* exited with code 3" "$d/stderr"
expect_grep restart "Restarting the worker group \(restart 1 of --max_restarts=1\)" "$d/stderr"
for r in 0 1 2; do
  [ -s "$d/out/env.$r.1" ] && ok "restart: rank $r ran again" || fail "restart: rank $r did not run a second time"
done
expect_grep restart "^----- braid launcher: restart 1 of 1 -----$" "$d/logs/workerlog.2"
expect_grep restart "crashing on purpose" "$d/logs/workerlog.2"  # the first attempt is kept
expect_grep restart "exchange ok, sum 8 over 3 ranks" "$d/logs/workerlog.2"
assert_gone restart "$d"

d=$(case_dir restarts_exhausted)
timeout 60 "$L" --nproc_per_node=2 --program="$P" --log_dir="$d/logs" --max_restarts=2 -- \
  --out_dir="$d/out" --crash_rank=0 --sleep_s=60 > "$d/stdout" 2> "$d/stderr"
expect_rc restarts_exhausted 1 $?
n=$(grep -c "Restarting the worker group" "$d/stderr")
[ "$n" = 2 ] && ok "restarts_exhausted: restarted twice" || fail "restarts_exhausted: restarted $n times"
[ -s "$d/out/env.0.2" ] && ok "restarts_exhausted: third attempt ran" || fail "restarts_exhausted: no third attempt"
assert_gone restarts_exhausted "$d"

# ---- 4. Signals to the launcher reach every worker ----------------------------------------------
for sig in TERM INT; do
  d=$(case_dir "signal_$sig")
  # env --default-signal: a background job of a script starts with SIGINT ignored.
  # A grace of 60 s: a job that ended well within it ended by the forwarded signal, not by the
  # SIGKILL after the grace.
  env --default-signal=INT "$L" --nproc_per_node=3 --program="$P" --log_dir="$d/logs" --stop_grace_s=60 -- \
    --out_dir="$d/out" --sleep_s=120 --spawn_child > "$d/stdout" 2> "$d/stderr" &
  lp=$!; bg+=($lp)
  wait_for_pids "$d" 3 || fail "signal_$sig: workers did not start"
  t0=$(now_ms)
  kill -$sig $lp
  wait_bounded $lp 30; rc=$RC; took=$(( $(now_ms) - t0 ))
  want=$([ $sig = TERM ] && echo 143 || echo 130)
  expect_rc "signal_$sig" $want "$rc"
  echo "     (done in ${took} ms)"
  expect_grep "signal_$sig" "received SIG$sig; stopping the job" "$d/stderr"
  assert_gone "signal_$sig" "$d"
done

# A worker that ignores SIGTERM is killed after --stop_grace_s.
d=$(case_dir sigterm_ignored)
"$L" --nproc_per_node=2 --program="$P" --log_dir="$d/logs" --stop_grace_s=1.5 -- \
  --out_dir="$d/out" --sleep_s=120 --ignore_sigterm --spawn_child > "$d/stdout" 2> "$d/stderr" &
lp=$!; bg+=($lp)
wait_for_pids "$d" 2 || fail "sigterm_ignored: workers did not start"  # SIG_IGN installed
t0=$(now_ms)
kill -TERM $lp
wait_bounded $lp 30; rc=$RC; took=$(( $(now_ms) - t0 ))
expect_rc sigterm_ignored 143 "$rc"
# At least the grace (its clock starts after t0, so load only adds; 0.1 s for clock granularity);
# a hang ends in wait_bounded's "timeout" instead of 143.
[ $took -ge 1400 ] && ok "sigterm_ignored: SIGKILL after the grace (${took} ms)" \
  || fail "sigterm_ignored: took ${took} ms (want at least the 1.5 s grace)"
assert_gone sigterm_ignored "$d"

# SIGKILL to the launcher: its workers die with it (PR_SET_PDEATHSIG).
d=$(case_dir sigkill)
"$L" --nproc_per_node=2 --program="$P" --log_dir="$d/logs" -- --out_dir="$d/out" --sleep_s=120 \
  > "$d/stdout" 2> "$d/stderr" &
lp=$!; bg+=($lp)
wait_for_pids "$d" 2 || fail "sigkill: workers did not start"
kill -KILL $lp; wait $lp 2>/dev/null
assert_gone sigkill "$d" zombies-ok  # waits (bounded) for PR_SET_PDEATHSIG to do its work

# ---- 5. Rendezvous errors: each clear, each within its bound --------------------------------------
tok_a=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
tok_b=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

# Two nodes on loopback, disagreeing on the world size.
d=$(case_dir world_size)
take_port
common=(--nnodes=2 --master_addr=127.0.0.1 --master_port=$port --program="$P" --rdzv_timeout_s=60)
t0=$(now_ms)
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=0 --nproc_per_node=2 --log_dir="$d/logs" -- \
  --out_dir="$d/out" > "$d/stdout0" 2> "$d/stderr0" &
p0=$!; bg+=($p0)
BRAID_JOB_TOKEN=$tok_a timeout 60 "$L" "${common[@]}" --node_rank=1 --nproc_per_node=3 --log_dir="$d/logs" -- \
  --out_dir="$d/out" > "$d/stdout1" 2> "$d/stderr1"
rc1=$?
wait_bounded $p0 30; rc0=$RC; took=$(( $(now_ms) - t0 ))
expect_rc "world_size node 1" 2 $rc1
expect_rc "world_size node 0" 2 "$rc0"
# They failed on the disagreement (the message below), not by waiting out the rendezvous timeout.
echo "     (both failed in ${took} ms)"
for n in 0 1; do
  expect_grep "world_size node $n" "world size disagreement between node . \(host [^:]+: --nnodes=2 --nproc_per_node=.\): world size ., and node . \(host [^:]+: --nnodes=2 --nproc_per_node=.\): world size ." "$d/stderr$n"
  expect_grep "world_size node $n" "world size 4" "$d/stderr$n"
  expect_grep "world_size node $n" "world size 6" "$d/stderr$n"
done
[ -z "$(ls "$d/out")" ] && ok "world_size: no worker started" || fail "world_size: workers started"

# A node with the wrong token.
d=$(case_dir wrong_token)
take_port
common=(--nnodes=2 --master_addr=127.0.0.1 --master_port=$port --program="$P")
# Node 1 must reach node 0 within node 0's rendezvous timeout: 10 s leaves room for a slow start.
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=0 --rdzv_timeout_s=10 --log_dir="$d/logs" -- \
  --out_dir="$d/out" > "$d/stdout0" 2> "$d/stderr0" &
p0=$!; bg+=($p0)
t0=$(now_ms)
BRAID_JOB_TOKEN=$tok_b timeout 60 "$L" "${common[@]}" --node_rank=1 --connect_timeout_s=120 \
  --log_dir="$d/logs" -- --out_dir="$d/out" > "$d/stdout1" 2> "$d/stderr1"
rc1=$?; took=$(( $(now_ms) - t0 ))
expect_rc "wrong_token node 1" 2 $rc1
# Retrying would go on for the 120 s connect timeout, past `timeout 60` (exit code 124): exit
# code 2 and the message say it gave up at the refusal.
echo "     (refused in ${took} ms)"
expect_grep "wrong_token node 1" "node 1 cannot use the rendezvous store at 127.0.0.1:$port: job token rejected" "$d/stderr1"
wait_bounded $p0 30; rc0=$RC
expect_rc "wrong_token node 0" 2 "$rc0"
expect_grep "wrong_token node 0 logs the stranger" "braid launcher: braid store 127.0.0.1:$port: rejected connection from 127.0.0.1:[0-9]+: wrong job token" "$d/stderr0"
expect_grep "wrong_token node 0" "only 1 of 2 launchers checked in within 10s; missing: node 1" "$d/stderr0"

# A master nobody serves.
d=$(case_dir unreachable)
take_port  # held: bound, nobody listening, so every attempt is refused
t0=$(now_ms)
BRAID_JOB_TOKEN=$tok_a timeout 60 "$L" --nnodes=2 --node_rank=1 --master_addr=127.0.0.1 --master_port=$port \
  --connect_timeout_s=3 --program="$P" --log_dir="$d/logs" -- --out_dir="$d/out" > "$d/stdout" 2> "$d/stderr"
rc=$?; took=$(( $(now_ms) - t0 ))
expect_rc unreachable 2 $rc
# At least the 3 s (counted from the launcher's start, after t0; 0.1 s for clock granularity);
# a hang ends in `timeout 60`'s exit code 124 instead of 2.
[ $took -ge 2900 ] && ok "unreachable: gave up in ${took} ms" || fail "unreachable: gave up in ${took} ms, before the 3 s"
expect_grep unreachable "node 1 cannot use the rendezvous store at 127.0.0.1:$port: could not connect to the Braid store at 127.0.0.1:$port within 3s" "$d/stderr"
# Meanwhile it said what it was waiting for (after 1 s; the attempts come at about 1.3 and 2.3 s).
expect_grep unreachable "node 1 is waiting for the rendezvous store at 127.0.0.1:$port \(node 0's launcher serves it\): [0-9]+s so far, [0-9]+ attempt\(s\), last error: .*Connection refused" "$d/stderr"

# Node 0 on a port that is taken.
d=$(case_dir port_in_use)
# A listener on a port of its own (bind(0), so no one else's): it prints its pid and port once it
# listens.
read -r hp port < <(python3 -c '
import os, socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(os.getpid(), s.getsockname()[1], flush=True)
sys.stdout.close()
time.sleep(120)')
bg+=($hp)
BRAID_JOB_TOKEN=$tok_a timeout 60 "$L" --nnodes=2 --node_rank=0 --master_addr=127.0.0.1 --master_port=$port \
  --program="$P" --log_dir="$d/logs" -- --out_dir="$d/out" > "$d/stdout" 2> "$d/stderr"
expect_rc port_in_use 2 $?
expect_grep port_in_use "node 0 cannot serve the rendezvous store at 127.0.0.1:$port: .*port $port is already in use" "$d/stderr"
kill $hp 2>/dev/null

# Several nodes without a token. (Launchers on one machine, a loopback master, share a token
# through a file: the master must be another machine. 192.0.2.1 is TEST-NET-1, never contacted:
# the launcher stops before connecting.)
d=$(case_dir no_token)
timeout 60 "$L" --nnodes=2 --node_rank=1 --master_addr=192.0.2.1 --master_port=29500 --program="$P" \
  --connect_timeout_s=1 --log_dir="$d/logs" > "$d/stdout" 2> "$d/stderr"
expect_rc no_token 2 $?
expect_grep no_token "export BRAID_JOB_TOKEN=\\\$\(openssl rand -hex 32\)" "$d/stderr"

# ---- 6. Two launchers on loopback: a job, then a failure on node 1 stops node 0 ------------------
d=$(case_dir two_launchers)
take_port
common=(--nnodes=2 --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=$port --program="$P")
# Node 1 first: it must wait for the master. The launcher prints nothing while it retries, so a
# gate shows it: a listener on the master's port that accepts node 1's first attempt and closes
# it before any greeting ("not up yet": node 1 retries), closes, then says so. Only then does
# node 0 start.
exec {gate}< <(python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1)
print("listening", flush=True)
s.settimeout(60)
c, _ = s.accept()
c.close(); s.close()
print("node 1 dialed", flush=True)' $port)
read -r -t 60 -u $gate line || line=""
[ "$line" = listening ] || fail "two_launchers: the gate did not start"
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=1 --log_dir="$d/logs1" -- --out_dir="$d/out" \
  --exchange > "$d/stdout1" 2> "$d/stderr1" &
p1=$!; bg+=($p1)
read -r -t 60 -u $gate line || line=""
exec {gate}<&-
[ "$line" = "node 1 dialed" ] && ok "two_launchers: node 1 dialed before the master was up" \
  || fail "two_launchers: node 1 never dialed the master's port"
BRAID_JOB_TOKEN=$tok_a timeout 60 "$L" "${common[@]}" --node_rank=0 --log_dir="$d/logs0" -- \
  --out_dir="$d/out" --exchange > "$d/stdout0" 2> "$d/stderr0"
expect_rc "two_launchers node 0" 0 $?
wait_bounded $p1 30
expect_rc "two_launchers node 1" 0 "$RC"
for r in 0 1 2 3; do
  n=$((r / 2)); l=$((r % 2))
  expect_grep "two_launchers env $r" "^RANK=$r LOCAL_RANK=$l WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 NODE_RANK=$n " "$d/out/env.$r.0"
  expect_grep "two_launchers log $r" "exchange ok, sum 18 over 4 ranks" "$d/logs$n/workerlog.$r"
done
assert_gone two_launchers "$d"

d=$(case_dir remote_failure)
take_port
common=(--nnodes=2 --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=$port --program="$P" --stop_grace_s=3)
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=0 --log_dir="$d/logs0" -- --out_dir="$d/out" \
  --sleep_s=120 --spawn_child --crash_rank=3 --crash_after_ms=1000 > "$d/stdout0" 2> "$d/stderr0" &
p0=$!; bg+=($p0)
t0=$(now_ms)
BRAID_JOB_TOKEN=$tok_a timeout 60 "$L" "${common[@]}" --node_rank=1 --log_dir="$d/logs1" -- \
  --out_dir="$d/out" --sleep_s=120 --spawn_child --crash_rank=3 --crash_after_ms=1000 \
  > "$d/stdout1" 2> "$d/stderr1"
rc1=$?
wait_bounded $p0 30; rc0=$RC; took=$(( $(now_ms) - t0 ))
expect_rc "remote_failure node 1" 1 $rc1
expect_rc "remote_failure node 0" 1 "$rc0"
# The others sleep 120 s: exit code 1 on both (not a timeout) and node 0's message below say
# they were stopped.
echo "     (both stopped in ${took} ms)"
expect_grep "remote_failure node 1" "^braid launcher: rank 3 \(node 1, .*\) exited with code 3" "$d/stderr1"
# Node 0 prints the same cause, tail included, and says it stopped its own workers.
expect_grep "remote_failure node 0" "^braid launcher: rank 3 \(node 1, .*\) exited with code 3" "$d/stderr0"
expect_grep "remote_failure node 0" "^  \| probe: rank 3 crashing on purpose" "$d/stderr0"
expect_grep "remote_failure node 0" "^node 0 stopped its workers" "$d/stderr0"
[ "$(ls "$d"/out/pid.*[0-9] | wc -l)" = 4 ] && ok "remote_failure: 4 workers ran" || fail "remote_failure: $(ls "$d"/out/pid.*[0-9] | wc -l) pid files"
assert_gone remote_failure "$d"

# --max_restarts across nodes: a crash on node 1 restarts the workers of both nodes.
d=$(case_dir remote_restart)
take_port
common=(--nnodes=2 --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=$port --program="$P"
        --max_restarts=1)
job=(--out_dir="$d/out" --exchange --crash_rank=3 --crash_attempts=1 --crash_after_ms=300)
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=0 --log_dir="$d/logs0" -- "${job[@]}" \
  > "$d/stdout0" 2> "$d/stderr0" &
p0=$!; bg+=($p0)
BRAID_JOB_TOKEN=$tok_a timeout 60 "$L" "${common[@]}" --node_rank=1 --log_dir="$d/logs1" -- "${job[@]}" \
  > "$d/stdout1" 2> "$d/stderr1"
expect_rc "remote_restart node 1" 0 $?
wait_bounded $p0 30
expect_rc "remote_restart node 0" 0 "$RC"
for n in 0 1; do
  expect_grep "remote_restart node $n" "Restarting the worker group \(restart 1 of --max_restarts=1\)" "$d/stderr$n"
done
for r in 0 1 2 3; do
  [ -s "$d/out/env.$r.1" ] && ok "remote_restart: rank $r ran again" || fail "remote_restart: rank $r did not run again"
done
expect_grep "remote_restart" "exchange ok, sum 18 over 4 ranks" "$d/logs0/workerlog.0"
assert_gone remote_restart "$d"

# Ctrl-C on node 1 ends the job on node 0 too, even with restarts left.
d=$(case_dir remote_interrupt)
take_port
common=(--nnodes=2 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=$port --program="$P"
        --max_restarts=3)
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=0 --log_dir="$d/logs0" -- --out_dir="$d/out" \
  --sleep_s=120 > "$d/stdout0" 2> "$d/stderr0" &
p0=$!; bg+=($p0)
BRAID_JOB_TOKEN=$tok_a env --default-signal=INT "$L" "${common[@]}" --node_rank=1 --log_dir="$d/logs1" -- \
  --out_dir="$d/out" --sleep_s=120 > "$d/stdout1" 2> "$d/stderr1" &
p1=$!; bg+=($p1)
wait_for_pids "$d" 2 || fail "remote_interrupt: workers did not start"
t0=$(now_ms)
kill -INT $p1
wait_bounded $p1 30; rc1=$RC
wait_bounded $p0 30; rc0=$RC; took=$(( $(now_ms) - t0 ))
expect_rc "remote_interrupt node 1" 130 "$rc1"
expect_rc "remote_interrupt node 0" 1 "$rc0"
# Node 0 was told (the message below), it did not wait out the 60 s heartbeat timeout, which
# wait_bounded's 30 s would have ended as "timeout".
echo "     (both ended in $took ms)"
expect_grep "remote_interrupt node 0" "node 1's launcher received SIGINT; stopping the job" "$d/stderr0"
grep -q Restarting "$d/stderr0" && fail "remote_interrupt: node 0 restarted" || ok "remote_interrupt: no restart"
assert_gone remote_interrupt "$d"

# A launcher that vanishes (SIGKILL): node 0 notices the missing heartbeat; node 1 notices
# node 0's store is gone.
d=$(case_dir vanished)
take_port
# 4 s: short, yet a loaded machine does not starve a live launcher's heartbeat that long.
common=(--nnodes=2 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=$port --program="$P"
        --heartbeat_timeout_s=4)
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=0 --log_dir="$d/logs0" -- --out_dir="$d/out" \
  --sleep_s=120 > "$d/stdout0" 2> "$d/stderr0" &
p0=$!; bg+=($p0)
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=1 --log_dir="$d/logs1" -- --out_dir="$d/out" \
  --sleep_s=120 > "$d/stdout1" 2> "$d/stderr1" &
p1=$!; bg+=($p1)
wait_for_pids "$d" 2 || fail "vanished: workers did not start"
t0=$(now_ms)
kill -KILL $p1; wait $p1 2>/dev/null
wait_bounded $p0 30; rc0=$RC; took=$(( $(now_ms) - t0 ))
expect_rc "vanished node 0" 1 "$rc0"
# Node 1 beats once a second, so its last beat may precede the kill by a second (more on a loaded
# machine), and node 0 counts the 4 s from there: at least 2 s after the kill; a hang ends in
# wait_bounded's "timeout".
[ $took -ge 2000 ] && ok "vanished: noticed in $took ms" || fail "vanished: noticed in $took ms, before 2 s"
expect_grep vanished "node 1's launcher \(host [^)]+\) stopped responding: no heartbeat for 4 s" "$d/stderr0"
assert_gone vanished "$d" zombies-ok

d=$(case_dir master_vanished)
take_port
# The default heartbeat timeout (60 s): a short one could end the job before the kill on a
# loaded machine.
common=(--nnodes=2 --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=$port --program="$P")
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=0 --log_dir="$d/logs0" -- \
  --out_dir="$d/out" --sleep_s=120 > "$d/stdout0" 2> "$d/stderr0" &
p0=$!; bg+=($p0)
BRAID_JOB_TOKEN=$tok_a "$L" "${common[@]}" --node_rank=1 --log_dir="$d/logs1" -- \
  --out_dir="$d/out" --sleep_s=120 > "$d/stdout1" 2> "$d/stderr1" &
p1=$!; bg+=($p1)
wait_for_pids "$d" 2 || fail "master_vanished: workers did not start"
t0=$(now_ms)
kill -KILL $p0; wait $p0 2>/dev/null
wait_bounded $p1 30; rc1=$RC; took=$(( $(now_ms) - t0 ))
expect_rc "master_vanished node 1" 1 "$rc1"
# Node 1 noticed the store was gone (the message below), not a silence: waiting out the 60 s
# heartbeat timeout would have ended in wait_bounded's "timeout" at 30 s.
echo "     (noticed in $took ms)"
expect_grep master_vanished "node 1 lost the rendezvous store at 127.0.0.1:$port \(node 0's launcher ended or the network failed\)" "$d/stderr1"
assert_gone master_vanished "$d" zombies-ok

# ---- 7. Under a scheduler each launcher is one worker: Slurm and Open MPI variables ---------------
# Two tasks on one node, as `srun -n2` would start them (the master on loopback).
d=$(case_dir slurm)
take_port
for t in 1 0; do
  BRAID_JOB_TOKEN=$tok_a MASTER_ADDR=127.0.0.1 MASTER_PORT=$port SLURM_STEP_ID=0 SLURM_PROCID=$t \
    SLURM_NTASKS=2 SLURM_LOCALID=$t SLURM_NODEID=0 SLURM_NNODES=1 SLURM_TASKS_PER_NODE=2 \
    SLURM_JOB_NODELIST=localhost timeout 60 "$L" --program="$P" --log_dir="$d/logs" -- \
    --out_dir="$d/out" --exchange > "$d/stdout$t" 2> "$d/stderr$t" &
  eval "ps$t=$!"; bg+=($!)
done
wait_bounded $ps0 60; expect_rc "slurm task 0" 0 "$RC"
wait_bounded $ps1 60; expect_rc "slurm task 1" 0 "$RC"
for r in 0 1; do
  expect_grep "slurm env $r" "^RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port " "$d/out/env.$r.0"
  expect_grep "slurm log $r" "exchange ok, sum 3 over 2 ranks" "$d/logs/workerlog.$r"
done
[ "$(ls "$d"/out/pid.*[0-9] | wc -l)" = 2 ] && ok "slurm: one worker per task" || fail "slurm: $(ls "$d"/out/pid.*[0-9] | wc -l) workers"
assert_gone slurm "$d"

# Three processes of `mpirun -np 3` on one node.
d=$(case_dir mpi)
take_port
for t in 2 1 0; do
  BRAID_JOB_TOKEN=$tok_a OMPI_COMM_WORLD_RANK=$t OMPI_COMM_WORLD_SIZE=3 OMPI_COMM_WORLD_LOCAL_RANK=$t \
    OMPI_COMM_WORLD_LOCAL_SIZE=3 timeout 60 "$L" --master_addr=127.0.0.1 --master_port=$port \
    --program="$P" --log_dir="$d/logs" -- --out_dir="$d/out" --exchange > "$d/stdout$t" 2> "$d/stderr$t" &
  eval "pm$t=$!"; bg+=($!)
done
for t in 0 1 2; do eval "wait_bounded \$pm$t 60"; expect_rc "mpi process $t" 0 "$RC"; done
for r in 0 1 2; do
  expect_grep "mpi env $r" "^RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 NODE_RANK=0 " "$d/out/env.$r.0"
  expect_grep "mpi log $r" "exchange ok, sum 8 over 3 ranks" "$d/logs/workerlog.$r"
done
assert_gone mpi "$d"

# ---- 8. torchrun's interface, Kubernetes' variables, the token from a file ----------------------
# An unknown flag is the launcher's own error, before anything starts.
d=$(case_dir unknown_flag)
timeout 60 "$L" --nproc-per-node=2 --rdzv-backend=c10d --nproc_per_nod=2 --program="$P" \
  --log_dir="$d/logs" -- --out_dir="$d/out" > "$d/stdout" 2> "$d/stderr"
expect_rc unknown_flag 2 $?
expect_grep unknown_flag "^braid launcher: unknown launcher flag --nproc_per_nod; did you mean --nproc_per_node\? Arguments for the program go after --" "$d/stderr"
[ -z "$(ls -A "$d/out")$(ls -A "$d/logs")" ] && ok "unknown_flag: no worker started" || fail "unknown_flag: something started"

# A torchrun command line, the program as a positional argument; --tee=3 puts every rank on the
# console, each line prefixed.
d=$(case_dir torchrun_style)
timeout 60 "$L" --standalone --nproc-per-node=2 --rdzv-backend=c10d --rdzv-id=t1 --role=probe \
  --tee=3 --log-dir="$d/logs" "$P" --out_dir="$d/out" --exchange > "$d/stdout" 2> "$d/stderr"
expect_rc torchrun_style 0 $?
for r in 0 1; do
  expect_grep "torchrun_style env $r" "^RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 " "$d/out/env.$r.0"
  expect_grep "torchrun_style console $r" "^\[probe$r\]:probe: rank $r on .*exchange ok, sum 3 over 2 ranks$" "$d/stdout"
done
grep -qv '^\[probe[01]\]:' "$d/stdout" && fail "torchrun_style: an unprefixed console line" || ok "torchrun_style: every console line prefixed"
assert_gone torchrun_style "$d"

# The token from a file (a mounted secret): what the workers get.
d=$(case_dir token_file)
printf '%s\n' "${tok_b:0:40}" > "$d/token"
timeout 60 "$L" --job_token_file="$d/token" --program="$P" --log_dir="$d/logs" -- --out_dir="$d/out" \
  > "$d/stdout" 2> "$d/stderr"
expect_rc token_file 0 $?
expect_grep token_file " TOKEN_LEN=40 " "$d/out/env.0.0"

# Two pods of an Indexed Job: the same command, JOB_COMPLETION_INDEX tells them apart.
d=$(case_dir indexed_job)
take_port
printf '%s\n' "$tok_a" > "$d/token"
for i in 1 0; do
  JOB_COMPLETION_INDEX=$i timeout 60 "$L" --nnodes=2 --nproc_per_node=1 --master_addr=127.0.0.1 \
    --master_port=$port --job_token_file="$d/token" --program="$P" --log_dir="$d/logs$i" -- \
    --out_dir="$d/out" --exchange > "$d/stdout$i" 2> "$d/stderr$i" &
  eval "pi$i=$!"; bg+=($!)
done
wait_bounded $pi0 60; expect_rc "indexed_job pod 0" 0 "$RC"
wait_bounded $pi1 60; expect_rc "indexed_job pod 1" 0 "$RC"
for r in 0 1; do
  expect_grep "indexed_job env $r" "^RANK=$r LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 NODE_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TOKEN_LEN=64 " "$d/out/env.$r.0"
done
assert_gone indexed_job "$d"

# A PyTorchJob's master and worker pods, with the operator's variables (nprocPerNode: "2").
d=$(case_dir pytorchjob)
take_port
pet() {  # NODE_RANK: the operator's variables for that pod
  echo MASTER_ADDR=127.0.0.1 PET_MASTER_ADDR=127.0.0.1 MASTER_PORT=$port PET_MASTER_PORT=$port \
    WORLD_SIZE=4 RANK=$1 PET_NODE_RANK=$1 PET_NNODES=2 PET_NPROC_PER_NODE=2 PYTHONUNBUFFERED=0
}
for n in 1 0; do
  env $(pet $n) BRAID_JOB_TOKEN=$tok_a timeout 60 "$L" --program="$P" --log_dir="$d/logs$n" -- \
    --out_dir="$d/out" --exchange > "$d/stdout$n" 2> "$d/stderr$n" &
  eval "pj$n=$!"; bg+=($!)
done
wait_bounded $pj0 60; expect_rc "pytorchjob master" 0 "$RC"
wait_bounded $pj1 60; expect_rc "pytorchjob worker" 0 "$RC"
for r in 0 1 2 3; do
  n=$((r / 2)); l=$((r % 2))
  expect_grep "pytorchjob env $r" "^RANK=$r LOCAL_RANK=$l WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 NODE_RANK=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port " "$d/out/env.$r.0"
  expect_grep "pytorchjob log $r" "exchange ok, sum 18 over 4 ranks" "$d/logs$n/workerlog.$r"
done
assert_gone pytorchjob "$d"
# Two sources that disagree: one message naming both, nothing started.
d=$(case_dir pytorchjob_disagree)
env $(pet 1) BRAID_JOB_TOKEN=$tok_a timeout 60 "$L" --nnodes=3 --program="$P" --log_dir="$d/logs" -- \
  --out_dir="$d/out" > "$d/stdout" 2> "$d/stderr"
expect_rc pytorchjob_disagree 2 $?
expect_grep pytorchjob_disagree "^braid launcher: --nnodes=3 disagrees with PET_NNODES=2 from the environment" "$d/stderr"

# --dry_run: what a pod would do, and nothing else.
d=$(case_dir dry_run)
JOB_COMPLETION_INDEX=1 timeout 60 "$L" --dry_run --nnodes=2 --nproc_per_node=2 --master_addr=10.0.0.1 \
  --program="$P" --log_dir="$d/logs" > "$d/stdout" 2> "$d/stderr"
expect_rc dry_run 0 $?
expect_grep dry_run "^worker rank=3 local_rank=1$" "$d/stdout"
[ -z "$(ls "$d/logs")" ] && ok "dry_run: nothing started" || fail "dry_run: wrote logs"

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
