#!/usr/bin/env bash
# Start-up time of a 2-node job by each way of starting Braid: the same gpt-mini DDP run
# (launcher/configs/gpt-mini-ddp.pbtxt, 2 nodes x P ranks, --steps=2) started
#   launchers - by hand: one launcher per node (--nnodes=2 --node_rank=0|1 --nproc_per_node=P);
#   hostfile  - launcher --hostfile on the first node (slots=P), the second over ssh;
#   openmpi   - mpirun.openmpi -np 2P --host A:P,B:P (orted over ssh; a launcher per rank);
#   mpich     - mpiexec.mpich -n 2P -hosts A:P,B:P (hydra's proxy over ssh; a launcher per rank).
# The two nodes are network namespaces joined by a veth pair (as tests/twonode), the second
# running sshd on port 2222 with keys made here; so it needs root, iproute2 and OpenSSH.
# Engines alternate within each round; prints one JSON line per run and the medians:
#   startup_s - from the command's start to the start of the first training step (rank 0's
#               metrics: the first step's time stamp less its step_s);
#   wall_s    - the whole command.
#
# Usage: bazel build //launcher && tools/bench/launch_startup.sh [ROUNDS [P]]   (default 3, 1)
set -uo pipefail
rounds=${1:-3}
P=${2:-1}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
L="$here/bazel-bin/launcher/launcher"
config="$here/launcher/configs/gpt-mini-ddp.pbtxt"
export BRAID_DATA_DIR="${BRAID_DATA_DIR:-$here/data}"
[ -x "$L" ] || { echo "launch_startup: build the launcher first: bazel build //launcher" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "launch_startup: needs root (network namespaces, sshd)" >&2; exit 2; }
T=$(mktemp -d); chmod 700 "$T"
id=$$; ns0=bb0_$id; ns1=bb1_$id; a0=10.124.0.1; a1=10.124.0.2
cleanup() {
  for ns in $ns0 $ns1; do
    for p in $(ip netns pids $ns 2>/dev/null); do kill -KILL $p 2>/dev/null; done
    ip netns del $ns 2>/dev/null
  done
  rm -rf "$T"
}
trap cleanup EXIT
ip netns add $ns0 && ip netns add $ns1 &&
  ip -n $ns0 link add bbv0_$id type veth peer name bbv1_$id netns $ns1 &&
  ip -n $ns0 addr add $a0/24 dev bbv0_$id && ip -n $ns1 addr add $a1/24 dev bbv1_$id &&
  for ns in $ns0 $ns1; do ip -n $ns link set lo up; done &&
  ip -n $ns0 link set bbv0_$id up && ip -n $ns1 link set bbv1_$id up || exit 1
ssh-keygen -q -t ed25519 -N '' -f "$T/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$T/id" || exit 1
cp "$T/id.pub" "$T/authorized_keys"
echo "[$a1]:2222 $(cut -d' ' -f1,2 "$T/host_key.pub")" > "$T/known_hosts"
printf 'Port 2222\nListenAddress %s\nHostKey %s/host_key\nPidFile none\nAuthorizedKeysFile %s/authorized_keys\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\n' \
  $a1 "$T" "$T" > "$T/sshd_config"
printf 'Host *\n  User %s\n  IdentityFile %s/id\n  IdentitiesOnly yes\n  UserKnownHostsFile %s/known_hosts\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n' \
  "$(id -un)" "$T" "$T" > "$T/ssh_config"
printf '#!/bin/sh\nexec ssh -F %s/ssh_config -p 2222 "$@"\n' "$T" > "$T/ssh"; chmod +x "$T/ssh"
ip netns exec $ns1 unshare --mount sh -c \
  'mount -t tmpfs -o size=1m tmpfs /run && mkdir -m 755 /run/sshd && exec /usr/sbin/sshd -D -e -f "$1"' \
  sh "$T/sshd_config" 2> "$T/sshd.log" &
disown
for _ in $(seq 200); do grep -q "Server listening" "$T/sshd.log" && break; sleep 0.05; done
grep -q "Server listening" "$T/sshd.log" || { cat "$T/sshd.log"; exit 1; }
printf '%s slots=%s\n%s slots=%s\n' $a0 $P $a1 $P > "$T/hosts"
export BRAID_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export BRAID_SSH_OPTIONS="-F $T/ssh_config"
train=(-- --config="$config" --steps=2)
cd "$here"

run() {  # ENGINE LOGDIR
  local d=$2
  case $1 in
    launchers)
      ip netns exec $ns1 "$L" --nnodes=2 --node_rank=1 --nproc_per_node=$P --master_addr=$a0 --log_dir="$d" "${train[@]}" >/dev/null 2>&1 &
      local p1=$!
      ip netns exec $ns0 "$L" --nnodes=2 --node_rank=0 --nproc_per_node=$P --master_addr=$a0 --log_dir="$d" "${train[@]}" >/dev/null 2>&1
      wait $p1 ;;
    hostfile)
      ip netns exec $ns0 "$L" --hostfile="$T/hosts" --ssh_port=2222 --log_dir="$d" "${train[@]}" >/dev/null 2>&1 ;;
    openmpi)
      ip netns exec $ns0 mpirun.openmpi --allow-run-as-root -np $((2 * P)) --host $a0:$P,$a1:$P \
        --mca plm_rsh_agent "$T/ssh" -x BRAID_JOB_TOKEN -x BRAID_DATA_DIR \
        "$L" --master_addr=$a0 --log_dir="$d" "${train[@]}" >/dev/null 2>&1 ;;
    mpich)
      ip netns exec $ns0 mpiexec.mpich -n $((2 * P)) -hosts $a0:$P,$a1:$P -launcher ssh -launcher-exec "$T/ssh" \
        "$L" --master_addr=$a0 --log_dir="$d" "${train[@]}" >/dev/null 2>&1 ;;
  esac
}

engines=(launchers hostfile openmpi mpich)
for ((r = 1; r <= rounds; ++r)); do
  for e in "${engines[@]}"; do
    d="$T/$e.$r"
    t0=$(date +%s.%N)
    run $e "$d"; rc=$?
    t1=$(date +%s.%N)
    python3 - "$e" "$r" "$rc" "$t0" "$t1" "$d/metrics.jsonl" <<'EOF' | tee -a "$T/results"
import json, sys
e, r, rc, t0, t1, path = sys.argv[1:]
first = json.loads(open(path).readline()) if rc == "0" else {}
startup = first["time"] - first["step_s"] - float(t0) if first else None
print(json.dumps({"engine": e, "round": int(r), "rc": int(rc),
                  "startup_s": round(startup, 3) if startup is not None else None,
                  "wall_s": round(float(t1) - float(t0), 3)}))
EOF
  done
done
python3 - "$T/results" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
for e in dict.fromkeys(r["engine"] for r in runs):
    ok = [r for r in runs if r["engine"] == e and r["rc"] == 0]
    if not ok:
        print(f"{e}: every run failed"); continue
    print(json.dumps({"engine": e, "runs": len(ok),
                      "median_startup_s": round(statistics.median(r["startup_s"] for r in ok), 2),
                      "median_wall_s": round(statistics.median(r["wall_s"] for r in ok), 2)}))
EOF
