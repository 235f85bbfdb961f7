#!/usr/bin/env bash
# Starting Braid over ssh for real (the first argument picks the cases: "hostfile" or "mpi").
# Two network namespaces joined by a veth pair are two hosts,
# 10.123.0.1 (where the launcher is started) and 10.123.0.2, which runs OpenSSH's sshd on port
# 2222 (free by construction: the namespace is new) with keys made in this test's folder. The
# launcher reads a hostfile listing both, runs node 0 itself and starts node 1's launcher over
# ssh (BatchMode: keys only), the job token on its standard input.
#   train - gpt-mini with DDP, 2 nodes x 1 rank, 3 steps: every loss of both ranks exactly as
#           the launcher's own --nproc_per_node=2 run on one host; each node's output comes
#           back prefixed with its host; the token is on no process's command line.
#   kill  - node 1's launcher is killed (SIGKILL) while training (collective_timeout_s: 20): the
#           launcher on the first host names node 1 and stops node 0, and every process of the
#           job is gone.
# With "mpi", the same two hosts run real MPI across them, ssh being each MPI's remote agent:
#   openmpi, mpich - mpirun.openmpi -np 2 --host A:1,B:1 and mpiexec.mpich -n 2 -hosts A:1,B:1
#           start one launcher per rank on each host; gpt-mini DDP, every loss as above.
# With "mpi_kill", each MPI runs a long job across the hosts (collective_timeout_s: 20) and the
# launcher on the second host is killed (SIGKILL) once rank 1 trains: mpirun names the killed
# rank, and every process of the job on both hosts is gone.
# sshd runs in a private mount namespace with its own /run, so it changes nothing on the machine.
#
# Needs root with network-admin rights and OpenSSH; Bazel runs it only where third_party/host
# found them (SKIPPED elsewhere), so here a failure to set them up is a failure of the test.
set -uo pipefail
cases=${1:?which cases: hostfile, mpi or mpi_kill}
L="$TEST_SRCDIR/braid/launcher/launcher"
config_src="$(readlink -f "$TEST_SRCDIR/braid/launcher/configs/gpt-mini-ddp.pbtxt")"
# The checkout's data/ (through a source file of ours): given to every node as BRAID_DATA_DIR.
export BRAID_DATA_DIR="$(dirname "$(dirname "$(dirname "$(readlink -f "$TEST_SRCDIR/braid/tests/twonode/BUILD")")")")/data"
T="${TEST_TMPDIR:-$(mktemp -d)}/hostfile_ssh"
rm -rf "$T" && mkdir -p "$T" && chmod 700 "$T"
fails=0
ok() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
expect_grep() {  # NAME PATTERN FILE
  if grep -qE -- "$2" "$3"; then ok "$1: /$2/"; else fail "$1: /$2/ not in $3:"; sed 's/^/     /' "$3" | tail -20; fi
}
# Waits (bounded) until COMMAND succeeds: the readiness signals below are files and log lines.
wait_until() {  # SECONDS COMMAND...
  local end=$(( $(date +%s) + $1 )); shift
  until "$@"; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.05
  done
}

id="$(( $$ % 100000 ))$(printf '%04x' $((RANDOM % 65536)))"
ns0="braid_h0_$id"; ns1="braid_h1_$id"
v0="bh0_$id"; v1="bh1_$id"
addr0=10.123.0.1; addr1=10.123.0.2
cleanup() {
  for ns in "$ns0" "$ns1"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
}
trap cleanup EXIT
setup() {
  ip netns add "$ns0" && ip netns add "$ns1" &&
    ip -n "$ns0" link add "$v0" type veth peer name "$v1" netns "$ns1" &&
    ip -n "$ns0" addr add "$addr0/24" dev "$v0" && ip -n "$ns1" addr add "$addr1/24" dev "$v1" &&
    ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
    ip -n "$ns0" link set "$v0" up && ip -n "$ns1" link set "$v1" up
}
if ! err=$(setup 2>&1); then
  echo "FAIL: running as root but cannot create the namespaces and veth pair: $err"
  exit 1
fi
ok "hosts $addr0 ($ns0) and $addr1 ($ns1)"

# ---- sshd on the second host, keys of this test only ----------------------------------------
ssh-keygen -q -t ed25519 -N '' -C braid-test-host -f "$T/host_key" &&
  ssh-keygen -q -t ed25519 -N '' -C braid-test-client -f "$T/client_key" ||
  { echo "FAIL: ssh-keygen"; exit 1; }
cp "$T/client_key.pub" "$T/authorized_keys"
echo "[$addr1]:2222 $(cut -d' ' -f1,2 "$T/host_key.pub")" > "$T/known_hosts"
cat > "$T/sshd_config" <<EOF
Port 2222
ListenAddress $addr1
HostKey $T/host_key
PidFile none
AuthorizedKeysFile $T/authorized_keys
# The test's folder is not root's home: its modes are the test's business.
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
EOF
cat > "$T/ssh_config" <<EOF
Host *
  User $(id -un)
  IdentityFile $T/client_key
  IdentitiesOnly yes
  UserKnownHostsFile $T/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  LogLevel ERROR
EOF
# sshd needs its privilege-separation folder /run/sshd: a tmpfs /run of its own mount namespace.
ip netns exec "$ns1" unshare --mount sh -c \
  'mount -t tmpfs -o size=1m,mode=755 tmpfs /run && mkdir -m 755 /run/sshd && exec /usr/sbin/sshd -D -e -f "$1"' \
  sh "$T/sshd_config" 2> "$T/sshd.log" &
sshd_pid=$!
disown $sshd_pid  # killed by cleanup: no "Killed" line from the shell
wait_until 30 grep -q "Server listening on $addr1 port 2222" "$T/sshd.log" ||
  { echo "FAIL: sshd did not start:"; cat "$T/sshd.log"; exit 1; }
ok "sshd listens on $addr1:2222"
# The launcher's ssh takes the test's keys and known hosts from this (documented) variable.
export BRAID_SSH_OPTIONS="-F $T/ssh_config"
printf '# the two namespaces\n%s slots=1\n%s slots=1  # sshd on port 2222\n' "$addr0" "$addr1" > "$T/hostfile"
export BRAID_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE

# The reference: the launcher's own 2 ranks on the first host (port free by construction).
ip netns exec "$ns0" timeout 120 "$L" --nproc_per_node=2 --master_port=29501 --log_dir="$T/ref" \
  -- --config="$config_src" --steps=3 > "$T/ref.out" 2> "$T/ref.err" ||
  { fail "reference run: exit code $?"; tail -20 "$T/ref.err"; }
# Every step's loss of both ranks, as the program wrote it (8 decimals): equal as text to the
# reference's, which must be 3 numbers (a NaN would equal itself as text).
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1"; }
expect_losses() {  # NAME RUN_LOG_DIR
  local f
  for f in metrics.jsonl metrics.jsonl.rank1; do
    losses "$T/ref/$f" > "$T/ref.$f.losses"; losses "$2/$f" > "$2.$f.losses"
    if [ "$(wc -l < "$T/ref.$f.losses")" != 3 ] || grep -qviE '^[0-9]+ -?[0-9]+\.[0-9]+$' "$T/ref.$f.losses"; then
      fail "$1: the reference's $f has not 3 finite losses:"; cat "$T/ref.$f.losses"
    elif cmp -s "$T/ref.$f.losses" "$2.$f.losses"; then
      ok "$1: $f: the 3 losses equal the launcher's own run exactly: $(cut -d' ' -f2 "$2.$f.losses" | tr '\n' ' ')"
    else
      fail "$1: $f: the losses differ (step loss, launcher's own run then this one):"
      paste "$T/ref.$f.losses" "$2.$f.losses" | sed 's/^/     /'
    fi
  done
}
# Whether the job's processes are gone from the first host (left0) and from the second but sshd
# (left1). Where the callers poll them, for up to 240 s, that is a guard against a hang rather than
# a bound on how fast: sshd's session and an MPI's mpirun may end before the processes they
# started have finished stopping.
nothing_left0() {
  left0=$(ip netns pids "$ns0" | tr '\n' ' ')
  [ -z "$left0" ]
}
only_sshd_left() {
  left1=""
  for p in $(ip netns pids "$ns1"); do [ "$p" = "$sshd_pid" ] || left1="$left1 $p($(cat /proc/$p/comm 2>/dev/null))"; done
  [ -z "$left1" ]
}

if [ "$cases" = hostfile ]; then
# ---- train ---------------------------------------------------------------------------------
ip netns exec "$ns0" timeout 120 "$L" --hostfile="$T/hostfile" --ssh_port=2222 --log_dir="$T/train" \
  -- --config="$config_src" --steps=3 > "$T/train.out" 2> "$T/train.err" &
driver=$!
# While it runs: the token is on no command line (ps would show it), here or on node 1.
wait_until 60 test -s "$T/train/workerlog.1" || fail "train: rank 1 never started"
# (grep reads the token from a file: on its own command line it would find itself.)
printf '%s\n' "$BRAID_JOB_TOKEN" > "$T/token"
hits=$(grep -l -F -f "$T/token" /proc/[0-9]*/cmdline 2>/dev/null | wc -l)
[ "$hits" = 0 ] && ok "train: the token is on no process's command line" || fail "train: the token is on $hits command line(s)"
wait $driver; rc=$?
[ $rc = 0 ] && ok "train: exit code 0" || { fail "train: exit code $rc"; tail -20 "$T/train.err" "$T/train.out"; }
expect_grep "train: both nodes" "^braid launcher: hostfile job of 2 node\(s\): node 0 on $addr0 \(here\), node 1 on $addr1 \(ssh\)" "$T/train.err"
expect_grep "train: node 1's launcher, started over ssh, prefixed" "^$addr1: braid launcher: node 1 \([^)]*\) started rank 1 of 2; store $addr0:29500" "$T/train.out"
expect_grep "train: node 0's rank 0, prefixed" "^$addr0: braid: training gpt-mini .* x 2 data-parallel rank\(s\)" "$T/train.out"
expect_losses train "$T/train"
# Nothing of the job is left on either host: here at once (the launcher reaps what it started),
# on the second host once sshd has closed the session (bounded).
# Braid's launcher reaps every process it started before it exits: nothing may be left now.
nothing_left0 && ok "train: nothing left on $addr0" || fail "train: still running on $addr0: $left0"
wait_until 240 only_sshd_left && ok "train: nothing left on $addr1 but sshd" || fail "train: still running on $addr1:$left1"

# ---- kill node 1's launcher ------------------------------------------------------------------
# A long run with a short collective timeout; node 1's launcher is killed once rank 1 trains.
{ cat "$config_src"; echo "collective_timeout_s: 20"; } > "$T/kill.pbtxt"
ip netns exec "$ns0" timeout 300 "$L" --hostfile="$T/hostfile" --ssh_port=2222 --log_dir="$T/kill" \
  --stop_grace_s=3 -- --config="$T/kill.pbtxt" --steps=100000 > "$T/kill.out" 2> "$T/kill.err" &
driver=$!
wait_until 120 grep -qE "^step +1/" "$T/kill/workerlog.1" || fail "kill: rank 1 never trained"
node1_launcher=""
for p in $(ip netns pids "$ns1"); do
  if [ "$(cat /proc/$p/comm 2>/dev/null)" = launcher ] && tr '\0' ' ' < /proc/$p/cmdline | grep -q -- "--node_rank=1 "; then
    node1_launcher=$p
  fi
done
[ -n "$node1_launcher" ] && ok "kill: node 1's launcher is pid $node1_launcher in $ns1" || fail "kill: no launcher of node 1 in $ns1"
kill -KILL $node1_launcher
killed_at=$(date +%s%N)
# The job ends once the first host names the lost node (the message below); a hang would run on
# to `timeout 300`, whose exit code is 124, not 1.
wait $driver; rc=$?
echo "     (the launcher on the first host ended $(( ($(date +%s%N) - killed_at) / 1000000 )) ms after the kill)"
[ $rc = 1 ] && ok "kill: exit code 1" || fail "kill: exit code $rc, want 1"
expect_grep "kill: node 1 named" "^braid launcher: node 1 \(host $addr1, over ssh\): its launcher exited with code 255 \(ssh's code for a connection that failed or broke, or a remote launcher killed by a signal\); stopping every node" "$T/kill.err"
expect_grep "kill: node 0 stopped its workers, and says why" "^$addr0: braid launcher: .*(node 0: standard input closed|rank 0 \(node 0, .*\) exited with code|lost the rendezvous)" "$T/kill.out"
# Braid's launcher reaps every process it started before it exits: nothing may be left now.
nothing_left0 && ok "kill: nothing left on $addr0" || fail "kill: still running on $addr0: $left0"
wait_until 240 only_sshd_left && ok "kill: nothing left on $addr1 but sshd" || fail "kill: still running on $addr1:$left1"
echo "     what the launchers said:"
cat "$T/kill.err" <(grep "braid launcher" "$T/kill.out") | sed 's/^/     | /'

fi

# Each MPI starts its remote daemon (orted, hydra_pmi_proxy) with this ssh.
printf '#!/bin/sh\nexec ssh -F %s -p 2222 "$@"\n' "$T/ssh_config" > "$T/ssh"
chmod +x "$T/ssh"
as_root=(); [ "$(id -u)" = 0 ] && as_root=(--allow-run-as-root)
mpirun_for() {  # MPI: sets mpirun, its command line across the two hosts
  case $1 in
    openmpi) mpirun=(mpirun.openmpi "${as_root[@]}" -np 2 --host $addr0:1,$addr1:1
                     --mca plm_rsh_agent "$T/ssh" -x BRAID_JOB_TOKEN -x BRAID_DATA_DIR) ;;
    # Hydra passes the whole environment on by default.
    mpich) mpirun=(mpiexec.mpich -n 2 -hosts $addr0:1,$addr1:1 -launcher ssh -launcher-exec "$T/ssh") ;;
  esac
}

if [ "$cases" = mpi_kill ]; then
# ---- kill the second host's launcher under each MPI ------------------------------------------
{ cat "$config_src"; echo "collective_timeout_s: 20"; } > "$T/kill.pbtxt"
for mpi in openmpi mpich; do
  mpirun_for $mpi
  ip netns exec "$ns0" timeout 300 "${mpirun[@]}" "$L" --master_addr=$addr0 --log_dir="$T/${mpi}_kill" \
    --stop_grace_s=3 -- --config="$T/kill.pbtxt" --steps=100000 > "$T/${mpi}_kill.out" 2> "$T/${mpi}_kill.err" &
  driver=$!
  wait_until 120 test -s "$T/${mpi}_kill/metrics.jsonl.rank1" || fail "$mpi kill: rank 1 never trained"
  node1_launcher=""
  for p in $(ip netns pids "$ns1"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = launcher ] && node1_launcher=$p; done
  [ -n "$node1_launcher" ] && ok "$mpi kill: rank 1's launcher is pid $node1_launcher on $addr1" || fail "$mpi kill: no launcher on $addr1"
  kill -KILL $node1_launcher
  killed_at=$(date +%s%N)
  # mpirun and everything it started end once the loss is noticed (collective_timeout_s is 20 s);
  # a hang would run on to `timeout 300`, whose exit code 124 fails below.
  wait $driver; rc=$?
  echo "     ($mpi: mpirun ended $(( ($(date +%s%N) - killed_at) / 1000000 )) ms after the kill)"
  [ $rc != 0 ] && [ $rc != 124 ] && ok "$mpi kill: exit code $rc" || fail "$mpi kill: exit code $rc, want a failure"
  # Each MPI's own words for the killed process, naming its pid and host.
  cat "$T/${mpi}_kill.out" "$T/${mpi}_kill.err" > "$T/${mpi}_kill.all"
  case $mpi in
    openmpi) said="noticed that process rank 1 with PID $node1_launcher on node $addr1 exited on signal 9" ;;
    mpich) said="PID $node1_launcher RUNNING AT $addr1" ;;
  esac
  expect_grep "$mpi kill: the killed process named" "$said" "$T/${mpi}_kill.all"
  wait_until 240 nothing_left0 && ok "$mpi kill: nothing left on $addr0" || fail "$mpi kill: still running on $addr0: $left0"
  wait_until 240 only_sshd_left && ok "$mpi kill: nothing left on $addr1 but sshd" || fail "$mpi kill: still running on $addr1:$left1"
  echo "     what $mpi and the launchers said:"
  grep -hvE "^(step|braid: (training|config|plugins|MFU)|-+$|$)" "$T/${mpi}_kill.all" | head -20 | sed 's/^/     | /'
done
fi

if [ "$cases" = mpi ]; then
# ---- real MPI across the two hosts -----------------------------------------------------------
for mpi in openmpi mpich; do
  mpirun_for $mpi
  sessions=$(grep -c "Accepted publickey" "$T/sshd.log")
  ip netns exec "$ns0" timeout 120 "${mpirun[@]}" "$L" --master_addr=$addr0 --log_dir="$T/$mpi" \
    -- --config="$config_src" --steps=3 > "$T/$mpi.out" 2> "$T/$mpi.err"
  rc=$?
  [ $rc = 0 ] && ok "$mpi: exit code 0" || { fail "$mpi: exit code $rc"; tail -20 "$T/$mpi.err" "$T/$mpi.out"; }
  # The MPI went through the second host's sshd (for its daemon there, which started rank 1).
  [ "$(grep -c "Accepted publickey" "$T/sshd.log")" -gt "$sessions" ] &&
    ok "$mpi: reached the second host over ssh" || fail "$mpi: no ssh session on the second host"
  expect_grep "$mpi: rank 1's launcher" "^braid launcher: rank 1's launcher \([^)]*\) started rank 1 of 2; store $addr0:29500" "$T/$mpi.err"
  expect_grep "$mpi: DDP over both hosts" "^braid: training gpt-mini .* x 2 data-parallel rank\(s\)" "$T/$mpi.out"
  expect_losses "$mpi" "$T/$mpi"
  wait_until 240 nothing_left0 && ok "$mpi: nothing left on $addr0" || fail "$mpi: still running on $addr0: $left0"
  wait_until 240 only_sshd_left && ok "$mpi: nothing left on $addr1 but sshd" || fail "$mpi: still running on $addr1:$left1"
done
fi

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
