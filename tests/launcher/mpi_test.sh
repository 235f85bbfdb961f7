#!/usr/bin/env bash
# Real MPI starts Braid: Debian's Open MPI (`mpirun.openmpi -np 2`) or MPICH (`mpiexec.mpich -n
# 2`), by the name that does not depend on where the `mpirun` alternative points; the first
# argument says which. mpirun starts one launcher per rank, each runs one worker with the
# rank and size MPI gave it (OMPI_COMM_WORLD_* or Hydra's PMI_RANK/PMI_SIZE and
# MPI_LOCALRANKID/MPI_LOCALNRANKS), and the two train gpt-mini with DDP together.
#   layout - the launcher's --dry_run under mpirun names the MPI as the layout's source;
#   train  - 3 steps of launcher/configs/gpt-mini-ddp.pbtxt under mpirun: every step's loss of
#            both ranks exactly as the launcher's own --nproc_per_node=2 run of the same config
#            (the same processes doing the same arithmetic; only who started them differs);
#   crash  - rank 1's worker exits with code 3: mpirun ends non-zero, both launchers name the
#            rank and its exit code, and no worker is left running.
# Open MPI refuses to run as root unless told (--allow-run-as-root): the test tells it when it
# runs as root. Ports are held, never guessed (tests/testing/hold_ports.py).
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" "mpi_${1:?which MPI: openmpi or mpich}"
which=$1
P="$TEST_SRCDIR/braid/tests/launcher/probe"
config="$(readlink -f "$TEST_SRCDIR/braid/launcher/configs/gpt-mini-ddp.pbtxt")"
ok() { echo "ok   $1"; }
expect_grep() {  # NAME PATTERN FILE
  if grep -qE -- "$2" "$3"; then ok "$1: /$2/"; else fail "$1: /$2/ not in $3:"; tail -20 "$3" | sed 's/^/     /'; fi
}
case "$which" in
  openmpi)
    mpirun=(mpirun.openmpi -np 2 -x BRAID_JOB_TOKEN)
    [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
    source_name="Open MPI"; size_var=OMPI_COMM_WORLD_SIZE ;;
  mpich)
    # Hydra passes the whole environment on by default (-genvall).
    mpirun=(mpiexec.mpich -n 2)
    source_name="MPICH"; size_var=PMI_SIZE ;;
  *) echo "FAIL: unknown MPI '$which' (openmpi or mpich)"; exit 1 ;;
esac
command -v "${mpirun[0]}" >/dev/null ||
  { echo "FAIL: ${mpirun[0]} is not installed, but this target requires it (tools/setup.sh)"; exit 1; }

read -r holder ports < <(python3 "$TEST_SRCDIR/braid/tests/testing/hold_ports.py" $$ 3)
ports=($ports)
[ ${#ports[@]} = 3 ] || { echo "FAIL: could not hold ports"; exit 1; }
trap 'kill -KILL $holder 2>/dev/null' EXIT
export BRAID_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
cd "$T"

# ---- layout ------------------------------------------------------------------------------------
bounded "${mpirun[@]}" "$L" --dry_run --master_port=${ports[0]} > layout.out 2> layout.err
rc=$?
[ $rc = 0 ] && ok "layout: exit code 0" || { fail "layout: $(ended $rc)"; tail -20 layout.err; }
expect_grep "layout: the MPI is the source" "^layout: $source_name: $size_var=2, one worker per task \(from $source_name\)$" layout.out
for r in 0 1; do
  expect_grep "layout: rank $r" "^worker rank=$r local_rank=$r$" layout.out
done
[ "$(grep -c '^world_size=2 nnodes=1 node_rank=0 local_world_size=2$' layout.out)" = 2 ] &&
  ok "layout: both launchers see one node of 2" || fail "layout: $(grep '^world_size' layout.out)"

# ---- train -------------------------------------------------------------------------------------
# The launcher's own run, then the same under mpirun; both write metrics.jsonl (rank 0) and
# metrics.jsonl.rank1 into their --log_dir.
train=(-- --config="$config" --steps=3)
t0=$SECONDS
bounded "$L" --nproc_per_node=2 --master_port=${ports[1]} --log_dir="$T/ref" "${train[@]}" \
  > ref.out 2> ref.err || { fail "reference run $(ended $?)"; tail -20 ref.err ref/workerlog.*; }
echo "   ran the launcher's own run: $((SECONDS - t0)) s"
t0=$SECONDS
bounded "${mpirun[@]}" "$L" --master_port=${ports[1]} --log_dir="$T/mpi" "${train[@]}" \
  > mpi.out 2> mpi.err
rc=$?
echo "   ran under $which: $((SECONDS - t0)) s"
[ $rc = 0 ] && ok "train: exit code 0" || { fail "train: $(ended $rc)"; tail -20 mpi.err mpi/workerlog.*; }
expect_grep "train: DDP over the two MPI ranks" "^braid: training gpt-mini .* strategy ddp, 3 step\(s\) .* x 2 data-parallel rank\(s\)" mpi.out
for r in 0 1; do
  expect_grep "train: rank $r's launcher" "^braid launcher: rank $r's launcher \([^)]*\) started rank $r of 2; store 127\.0\.0\.1:${ports[1]}" mpi.err
done
# Every step's loss, as the program wrote it (8 decimals), rank by rank: equal as text, and
# numbers (a NaN would be equal to itself as text, so it is refused first).
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1"; }
for f in metrics.jsonl metrics.jsonl.rank1; do
  losses "ref/$f" > "ref.$f.losses"; losses "mpi/$f" > "mpi.$f.losses"
  n=$(wc -l < "ref.$f.losses")
  if [ "$n" != 3 ] || grep -qviE '^[0-9]+ -?[0-9]+\.[0-9]+$' "ref.$f.losses"; then
    fail "train: the reference's $f has not 3 finite losses:"; cat "ref.$f.losses"
  elif cmp -s "ref.$f.losses" "mpi.$f.losses"; then
    ok "train: $f: the 3 losses equal the launcher's own run exactly: $(cut -d' ' -f2 "mpi.$f.losses" | tr '\n' ' ')"
  else
    fail "train: $f: the losses differ (step loss, launcher's own run then $which):"
    paste "ref.$f.losses" "mpi.$f.losses" | sed 's/^/     /'
  fi
done

# ---- crash -------------------------------------------------------------------------------------
mkdir -p crash/out
bounded "${mpirun[@]}" "$L" --master_port=${ports[2]} --log_dir="$T/crash/logs" --stop_grace_s=3 \
  --program="$P" -- --out_dir="$T/crash/out" --sleep_s=120 --crash_rank=1 --crash_after_ms=500 \
  > crash.out 2> crash.err
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && [ $rc != 125 ] && [ $rc != 137 ] && ok "crash: $which exited $rc" ||
  { fail "crash: $(ended $rc)"; tail -20 crash.err; }
# Each launcher says it, node 0's and rank 1's own (the message travels through the store).
n=$(grep -cE "^braid launcher: rank 1 \(rank 1's launcher, host [^,]+, pid [0-9]+\) exited with code 3" crash.err)
[ "$n" = 2 ] && ok "crash: both launchers name rank 1 and its exit code 3" ||
  { fail "crash: $n launcher(s) named rank 1's exit code 3, want 2:"; sed 's/^/     /' crash.err | tail -20; }
[ "$(ls crash/out/pid.*[0-9] 2>/dev/null | wc -l)" = 2 ] && ok "crash: 2 workers ran" ||
  fail "crash: $(ls crash/out/pid.*[0-9] 2>/dev/null | wc -l) pid files, want 2"
# The launchers reap their workers before they return, so once mpirun has returned none may be
# left (checked by name: a recorded pid may have been reused since).
left=""
for p in $(cat crash/out/pid.*[0-9] 2>/dev/null); do
  [ "$(cat /proc/$p/comm 2>/dev/null)" = probe ] && left="$left $p"
done
[ -z "$left" ] && ok "crash: no worker left running" || fail "crash: workers still running:$left"
finish
