#!/usr/bin/env bash
# A real Slurm cluster of two nodes on one machine: network namespaces joined by a veth pair,
# each with its own host name (UTS namespace) n0 = 10.126.0.1 and n1 = 10.126.0.2, its own /etc/hosts
# naming both and its own /run (private mount namespaces: nothing on the machine changes).
# Debian's munged (a key made here), slurmctld on n0 and one slurmd on each node; then
#   sbatch --wait launcher/examples/slurm/train.sbatch --steps=3
# trains gpt-mini with DDP, one launcher per node (srun --ntasks-per-node=1), node 0's address
# taken from SLURM_JOB_NODELIST: every loss of both ranks exactly as the launcher's own
# --nproc_per_node=2 run. Then one Slurm task per rank (sbatch --ntasks-per-node=2, each
# task's launcher runs one worker): every loss of the 4 ranks as the launcher's own 4-rank run.
# Then a long job is scancel'ed: every launcher and worker is gone, the launchers saying why. Ports 6817/6818/29500 are free by construction (new namespaces).
# With the argument "failure" (//tests/twonode:slurm_failure_test), the same cluster runs instead:
#   restart - rank 1's worker on n1 dies (SIGKILL, BRAID_FAULT=kill_at_step:1) in a job with
#             BRAID_LAUNCHER_FLAGS=--max_restarts=1: both launchers name it, restart the group
#             as on one machine, and the job succeeds with the losses of the launcher's own run;
#   kill    - node 1's launcher is killed (SIGKILL) once rank 1 trains, collective_timeout_s: 20:
#             every launcher and worker on both nodes is gone, node 0's launcher naming the
#             failed rank and Slurm the killed task.
#
# Needs root with network-admin rights, Slurm and munge; Bazel runs it only where
# third_party/host found them (SKIPPED elsewhere), so here a failed setup is a failure.
set -uo pipefail
cases=${1:-main}
L="$(readlink -f "$TEST_SRCDIR/braid/launcher/launcher")"
SBATCH_SCRIPT="$TEST_SRCDIR/braid/launcher/examples/slurm/train.sbatch"
config_src="$(readlink -f "$TEST_SRCDIR/braid/launcher/configs/gpt-mini-ddp.pbtxt")"
export BRAID_DATA_DIR="$(dirname "$(dirname "$(dirname "$(readlink -f "$TEST_SRCDIR/braid/tests/twonode/BUILD")")")")/data"
T="${TEST_TMPDIR:-$(mktemp -d)}/slurm"
rm -rf "$T" && mkdir -p "$T" && chmod 755 "$T"
fails=0
ok() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
expect_grep() {  # NAME PATTERN FILE
  if grep -qE -- "$2" "$3"; then ok "$1: /$2/"; else fail "$1: /$2/ not in $3:"; sed 's/^/     /' "$3" | tail -20; fi
}
wait_until() {  # SECONDS COMMAND...: bounded wait for a readiness signal
  local end=$(( $(date +%s) + $1 )); shift
  until "$@"; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.1
  done
}

id="$(( $$ % 100000 ))$(printf '%04x' $((RANDOM % 65536)))"
ns0="braid_s0_$id"; ns1="braid_s1_$id"
addr0=10.126.0.1; addr1=10.126.0.2
# munged's socket and slurmd's step sockets (in its spool folder) must have paths of at most
# 108 bytes: a short folder of their own, not the test's.
M=$(mktemp -d /tmp/braid-slurm.XXXXXX) && chmod 755 "$M" && mkdir -p "$M/ctld" "$M/spool/n0" "$M/spool/n1"
cleanup() {
  for ns in "$ns0" "$ns1"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$M"
}
trap cleanup EXIT
setup() {
  ip netns add "$ns0" && ip netns add "$ns1" &&
    ip -n "$ns0" link add "bs0_$id" type veth peer name "bs1_$id" netns "$ns1" &&
    ip -n "$ns0" addr add "$addr0/24" dev "bs0_$id" && ip -n "$ns1" addr add "$addr1/24" dev "bs1_$id" &&
    ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
    ip -n "$ns0" link set "bs0_$id" up && ip -n "$ns1" link set "bs1_$id" up
}
if ! err=$(setup 2>&1); then
  echo "FAIL: running as root but cannot create the namespaces and veth pair: $err"
  exit 1
fi
printf '127.0.0.1 localhost\n%s n0\n%s n1\n' "$addr0" "$addr1" > "$T/hosts"

# Runs COMMAND as on node NAME (n0 in ns0, n1 in ns1): its host name, /etc/hosts, an empty /run,
# and the cgroup v1 hierarchies slurmd insists on finding (ip netns exec mounts a fresh /sys).
on() {  # NAME COMMAND...
  local name=$1 ns; shift
  [ "$name" = n0 ] && ns=$ns0 || ns=$ns1
  ip netns exec "$ns" unshare --mount --uts sh -c '
    hostname "$1" && mount --bind "$2" /etc/hosts && mount -t tmpfs tmpfs /run &&
    mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup || exit 1
    for c in cpu cpuacct cpuset memory devices freezer pids; do
      mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c 2>/dev/null
    done
    mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
    shift 2; exec "$@"' sh "$name" "$T/hosts" "$@"
}

# ---- the cluster ------------------------------------------------------------------------------
head -c 1024 /dev/urandom > "$T/munge.key" && chmod 400 "$T/munge.key"
# munged's socket is a file: every node's daemons and jobs reach it whatever their namespace.
ip netns exec "$ns0" /usr/sbin/munged --force --key-file="$T/munge.key" --socket="$M/socket" \
  --pid-file="$T/munged.pid" --log-file="$T/munged.log" --seed-file="$T/munged.seed" ||
  { echo "FAIL: munged did not start:"; cat "$T/munged.log"; exit 1; }
cat > "$T/slurm.conf" <<EOF
ClusterName=braidtest
SlurmctldHost=n0($addr0)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket=$M/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$M/ctld
SlurmdSpoolDir=$M/spool/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.%n.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.%n.log
# No cgroups of our own: processes are tracked by parentage, nothing is confined.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Two "nodes" share this machine's CPUs: take the configured counts.
SlurmdParameters=config_overrides
ReturnToService=2
# scancel: SIGTERM to every step's processes, SIGKILL 5 s later.
KillWait=5
NodeName=n0 NodeAddr=$addr0 CPUs=2 State=UNKNOWN
NodeName=n1 NodeAddr=$addr1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n0,n1 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$T/slurm.conf"
on n0 /usr/sbin/slurmctld -D -f "$T/slurm.conf" > "$T/slurmctld.out" 2>&1 &
on n0 /usr/sbin/slurmd -D -f "$T/slurm.conf" -N n0 > "$T/slurmd.n0.out" 2>&1 &
on n1 /usr/sbin/slurmd -D -f "$T/slurm.conf" -N n1 > "$T/slurmd.n1.out" 2>&1 &
disown -a  # killed by cleanup: no "Killed" lines from the shell
both_idle() {
  on n0 sinfo -h -o "%n %T" > "$T/sinfo" 2>&1 && grep -q "^n0 idle" "$T/sinfo" && grep -q "^n1 idle" "$T/sinfo"
}
if wait_until 60 both_idle; then
  ok "cluster: n0 and n1 idle"
else
  echo "FAIL: the cluster did not come up: $(cat "$T/sinfo")"
  tail -5 "$T"/slurmctld.out "$T"/slurmd.n*.out "$T"/slurmd.n*.log
  exit 1
fi

# ---- the reference: the launcher's own 2 ranks on n0 ---------------------------------------
export BRAID_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE
ip netns exec "$ns0" timeout 120 "$L" --nproc_per_node=2 --master_port=29501 --log_dir="$T/ref" \
  -- --config="$config_src" --steps=3 > "$T/ref.out" 2> "$T/ref.err" ||
  { fail "reference run: exit code $?"; tail -20 "$T/ref.err"; }
unset BRAID_JOB_TOKEN  # the batch script makes the job's own
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1"; }
expect_losses() {  # NAME DIR: both ranks' 3 losses exactly the reference's
  local f
  for f in metrics.jsonl metrics.jsonl.rank1; do
    losses "$T/ref/$f" > "$T/ref.$f.losses"; losses "$2/$f" > "$2.$f.losses"
    if [ "$(wc -l < "$T/ref.$f.losses")" != 3 ] || grep -qviE '^[0-9]+ -?[0-9]+\.[0-9]+$' "$T/ref.$f.losses"; then
      fail "$1: the reference's $f has not 3 finite losses:"; cat "$T/ref.$f.losses"
    elif cmp -s "$T/ref.$f.losses" "$2.$f.losses"; then
      ok "$1: $f: the 3 losses equal the launcher's own run exactly: $(cut -d' ' -f2 "$2.$f.losses" | tr '\n' ' ')"
    else
      fail "$1: $f: the losses differ (step loss, launcher's own run then the Slurm job):"
      paste "$T/ref.$f.losses" "$2.$f.losses" | sed 's/^/     /'
    fi
  done
}
job_processes() {  # the job's launchers and workers on either node
  local p
  for ns in "$ns0" "$ns1"; do
    for p in $(ip netns pids "$ns"); do
      case "$(cat /proc/$p/comm 2>/dev/null)" in launcher|train) echo "$p";; esac
    done
  done
}
# (A function, so that wait_until looks again each time; `test -z "$(job_processes)"` as its
# command would be expanded once, before the wait.)
no_job_processes() { [ -z "$(job_processes)" ]; }
mkdir -p "$T/submit"

if [ "$cases" = failure ]; then
# ---- a worker on n1 dies under --max_restarts: the group restarts on both nodes ---------------
( cd "$T/submit" && export BRAID_LAUNCHER="$L" BRAID_CONFIG="$config_src" \
    BRAID_LAUNCHER_FLAGS="--max_restarts=1" BRAID_FAULT=kill_at_step:1 &&
    on n0 timeout 240 sbatch --wait -o "$T/restart.out" "$SBATCH_SCRIPT" --steps=3 \
      --log_dir="$T/restart" > "$T/sbatch_restart.out" 2>&1 )
rc=$?
[ $rc = 0 ] && ok "restart: sbatch --wait: exit code 0" || { fail "restart: sbatch: exit code $rc"; cat "$T/sbatch_restart.out"; tail -30 "$T/restart.out"; }
expect_grep "restart: rank 1 on n1 named" "^braid launcher: rank 1 \(node 1, host n1, pid [0-9]+\) was killed by signal 9" "$T/restart.out"
n=$(grep -c "^Restarting the worker group (restart 1 of --max_restarts=1)\.$" "$T/restart.out")
[ "$n" = 2 ] && ok "restart: both launchers restart the group" || fail "restart: $n launcher(s) said they restart, want 2"
expect_grep "restart: node 1 restarted on n1" "^braid launcher: node 1 \(n1\) started rank 1 of 2 \(restart 1\); store n0:29500" "$T/restart.out"
expect_losses restart "$T/restart"

# ---- node 1's launcher killed: every process of the job gone ---------------------------------
{ cat "$config_src"; echo "collective_timeout_s: 20"; } > "$T/kill.pbtxt"
( cd "$T/submit" && export BRAID_LAUNCHER="$L" BRAID_CONFIG="$T/kill.pbtxt" &&
    on n0 sbatch --parsable -o "$T/kill.out" "$SBATCH_SCRIPT" --steps=100000 \
      --log_dir="$T/kill" > "$T/kill.jobid" 2>&1 )
jobid=$(cat "$T/kill.jobid")
wait_until 120 test -s "$T/kill/metrics.jsonl.rank1" || fail "kill: rank 1 never trained"
node1_launcher=""
for p in $(ip netns pids "$ns1"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = launcher ] && node1_launcher=$p; done
[ -n "$node1_launcher" ] && ok "kill: node 1's launcher is pid $node1_launcher on n1" || fail "kill: no launcher on n1"
kill -KILL $node1_launcher
killed_at=$(date +%s%N)
# Every process ends once the loss is noticed (collective_timeout_s is 20 s). 240 s is a guard
# against a hang, not a bound on how fast: a loaded machine may take longer than the timeout.
if wait_until 240 no_job_processes; then
  ok "kill: every launcher and worker gone ($(( ($(date +%s%N) - killed_at) / 1000000 )) ms after the kill)"
else
  fail "kill: still running 240 s after the kill (a hang): $(job_processes | tr '\n' ' ')"
fi
# The batch script's own end (srun's last words in kill.out) follows; the job leaves the queue.
job_gone() { ! on n0 squeue -h -j "$jobid" -o %i 2>/dev/null | grep -q .; }
wait_until 30 job_gone || fail "kill: job $jobid still in the queue 30 s after its processes ended"
expect_grep "kill: node 0 names the failure" "^braid launcher: (rank 0 \(node 0, host n0, pid [0-9]+\) exited with code|node 0 lost the rendezvous|node 1's launcher \(host n1\) stopped responding)" "$T/kill.out"
expect_grep "kill: Slurm names the killed task" "srun: error: n1: task 1: Killed" "$T/kill.out"
echo "     what the launchers and srun said:"
grep -E "^(braid launcher|srun)" "$T/kill.out" | sed 's/^/     | /'
fi

if [ "$cases" = main ]; then
# ---- sbatch the shipped example --------------------------------------------------------------
t0=$(date +%s%N)
( cd "$T/submit" && export BRAID_LAUNCHER="$L" BRAID_CONFIG="$config_src" &&
    on n0 timeout 240 sbatch --wait -o "$T/job.out" "$SBATCH_SCRIPT" --steps=3 --log_dir="$T/job" \
    > "$T/sbatch.out" 2>&1 )
rc=$?
t1=$(date +%s%N)
[ $rc = 0 ] && ok "sbatch --wait: exit code 0" || { fail "sbatch: exit code $rc"; cat "$T/sbatch.out"; tail -30 "$T/job.out"; }
expect_grep "one launcher per node, node 1 on n1" "^braid launcher: node 1 \(n1\) started rank 1 of 2; store n0:29500" "$T/job.out"
expect_grep "one launcher per node, node 0 on n0" "^braid launcher: node 0 \(n0\) started rank 0 of 2; store n0:29500" "$T/job.out"
expect_grep "DDP over both nodes" "^braid: training gpt-mini .* x 2 data-parallel rank\(s\)" "$T/job.out"
for f in metrics.jsonl metrics.jsonl.rank1; do
  losses "$T/ref/$f" > "$T/ref.$f.losses"; losses "$T/job/$f" > "$T/job.$f.losses"
  if [ "$(wc -l < "$T/ref.$f.losses")" != 3 ] || grep -qviE '^[0-9]+ -?[0-9]+\.[0-9]+$' "$T/ref.$f.losses"; then
    fail "the reference's $f has not 3 finite losses:"; cat "$T/ref.$f.losses"
  elif cmp -s "$T/ref.$f.losses" "$T/job.$f.losses"; then
    ok "$f: the 3 losses equal the launcher's own run exactly: $(cut -d' ' -f2 "$T/job.$f.losses" | tr '\n' ' ')"
  else
    fail "$f: the losses differ (step loss, launcher's own run then the Slurm job):"
    paste "$T/ref.$f.losses" "$T/job.$f.losses" | sed 's/^/     /'
  fi
done
# For the notes (never judged): from sbatch to the first step's start, and the whole job.
startup() {  # WHAT METRICS T0 T1
  python3 -c 'import json,sys; m=json.loads(open(sys.argv[2]).readline()); t0=int(sys.argv[3])/1e9; t1=int(sys.argv[4])/1e9
print("     %s: sbatch to the first step: %.2f s; sbatch --wait in all: %.2f s" % (sys.argv[1], m["time"]-m["step_s"]-t0, t1-t0))' \
    "$@" 2>/dev/null
}
startup "2 nodes x 1 rank, a launcher per node" "$T/job/metrics.jsonl" "$t0" "$t1"

# ---- one task per rank: sbatch --ntasks-per-node=2, no launcher fan-out ----------------------
export BRAID_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
ip netns exec "$ns0" timeout 180 "$L" --nproc_per_node=4 --master_port=29501 --log_dir="$T/ref4" \
  -- --config="$config_src" --steps=3 > "$T/ref4.out" 2> "$T/ref4.err" ||
  { fail "reference run of 4: exit code $?"; tail -20 "$T/ref4.err"; }
unset BRAID_JOB_TOKEN
t0=$(date +%s%N)
( cd "$T/submit" && export BRAID_LAUNCHER="$L" BRAID_CONFIG="$config_src" BRAID_TASK_PER_RANK=1 &&
    on n0 timeout 240 sbatch --wait --ntasks-per-node=2 -o "$T/job4.out" "$SBATCH_SCRIPT" \
      --steps=3 --log_dir="$T/job4" > "$T/sbatch4.out" 2>&1 )
rc=$?
t1=$(date +%s%N)
[ $rc = 0 ] && ok "per rank: sbatch --wait: exit code 0" || { fail "per rank: sbatch: exit code $rc"; cat "$T/sbatch4.out"; tail -30 "$T/job4.out"; }
startup "2 nodes x 2 ranks, a task per rank" "$T/job4/metrics.jsonl" "$t0" "$t1"
for r in 2 3; do
  expect_grep "per rank: rank $r's own launcher on n1" "^braid launcher: rank $r's launcher \(n1\) started rank $r of 4; store n0:29500" "$T/job4.out"
done
for r in 0 1 2 3; do
  f=metrics.jsonl; [ $r = 0 ] || f=metrics.jsonl.rank$r
  losses "$T/ref4/$f" > "$T/ref4.$r.losses"; losses "$T/job4/$f" > "$T/job4.$r.losses"
  if [ "$(wc -l < "$T/ref4.$r.losses")" != 3 ] || grep -qviE '^[0-9]+ -?[0-9]+\.[0-9]+$' "$T/ref4.$r.losses"; then
    fail "per rank: the reference's rank $r has not 3 finite losses"
  elif cmp -s "$T/ref4.$r.losses" "$T/job4.$r.losses"; then
    ok "per rank: rank $r's 3 losses equal the launcher's own 4-rank run exactly"
  else
    fail "per rank: rank $r's losses differ:"; paste "$T/ref4.$r.losses" "$T/job4.$r.losses" | sed 's/^/     /'
  fi
done

# ---- scancel stops every rank within the grace period ----------------------------------------
( cd "$T/submit" && export BRAID_LAUNCHER="$L" BRAID_CONFIG="$config_src" &&
    on n0 sbatch --parsable -o "$T/cancel.out" "$SBATCH_SCRIPT" --steps=100000 \
      --log_dir="$T/cancel" > "$T/cancel.jobid" 2>&1 )
jobid=$(cat "$T/cancel.jobid")
# (The program's own --log_dir: rank 1's first step is in its metrics once done.)
wait_until 120 test -s "$T/cancel/metrics.jsonl.rank1" || fail "scancel: rank 1 never trained"
[ -n "$(job_processes)" ] && ok "scancel: job $jobid trains on both nodes" || fail "scancel: no process of job $jobid"
on n0 scancel "$jobid"
cancelled_at=$(date +%s%N)
# Slurm signals, then kills after its grace (KillWait=5). 240 s is a guard against a hang, not a
# bound on how fast: a loaded machine may take longer.
if wait_until 240 no_job_processes; then
  ok "scancel: every launcher and worker gone ($(( ($(date +%s%N) - cancelled_at) / 1000000 )) ms after scancel)"
else
  fail "scancel: still running 240 s after scancel (a hang): $(job_processes | tr '\n' ' ')"
fi
expect_grep "scancel: the launchers say why" "^braid launcher: node [01]'s launcher received SIGTERM; stopping the job" "$T/cancel.out"
fi

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
