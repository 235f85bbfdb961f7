#!/usr/bin/env bash
# env.sh's choice of GCC's runtime by the machine's glibc, driven with a fake getconf (the glibc
# version) and a fake ldconfig (the loader cache's libstdc++.so.6 and libgcc_s.so.1, fake files
# that have, or lack, the GLIBCXX version the bundle needs), on PATH before the real ones. A
# bundle of Debian 12 wants glibc 2.34 for its programs and 2.36 for its libstdc++:
#   2.36          the bundled libstdc++: no fallback, no problem, nothing printed;
#   2.35, 2.34    the system's libstdc++ if it has GLIBCXX_<glibcxx_min>: links to it first on
#                 LD_LIBRARY_PATH and a line naming it; else a PROBLEM naming what is missing;
#   2.33          a PROBLEM: below what the programs need.
# Needs only bash and coreutils, what env.sh itself needs: where they are missing this fails.
set -uo pipefail
R="$TEST_SRCDIR/braid/tools/bundle"
T="${TEST_TMPDIR:-$(mktemp -d)}/env_glibc"
rm -rf "$T"; mkdir -p "$T"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
for tool in sort mktemp awk grep; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool missing: env.sh cannot run here"; exit 1; }
done

B="$T/bundle"  # the bundle's env.sh beside a BUNDLE_INFO; no NVIDIA library needed
mkdir -p "$B/bin" "$B/plugins" "$B/data"
cp "$R/env.sh" "$B/env.sh"
cat > "$B/BUNDLE_INFO" <<'INFO'
glibc_min=2.34
glibc_min_gcc_runtime=2.36
glibcxx_min=3.4.30
nvidia_needed=
INFO

# Fake system libraries: the GLIBCXX strings a real libstdc++ holds in its version table.
L="$T/syslib"
mkdir -p "$L/new" "$L/old"
printf 'ELF GLIBCXX_3.4.29\0GLIBCXX_3.4.30\0GLIBCXX_3.4.31\0' > "$L/new/libstdc++.so.6"
printf 'ELF GLIBCXX_3.4.28\0GLIBCXX_3.4.29\0' > "$L/old/libstdc++.so.6"
for d in new old; do printf 'ELF GCC_7.0.0\0' > "$L/$d/libgcc_s.so.1"; done

# Runs env.sh in a fresh bash with glibc $1 and the loader cache listing $2's libraries ("none":
# no libstdc++ in the cache). Prints env.sh's output, then PROBLEMS= and LDP= lines.
run() {
  local glibc="$1" which="$2" fake="$T/fake-$1-$2"
  mkdir -p "$fake" "$T/tmp"
  printf '#!/bin/sh\n[ "$1" = GNU_LIBC_VERSION ] && echo "glibc %s" && exit 0\nexit 1\n' "$glibc" > "$fake/getconf"
  {
    echo '#!/bin/sh'
    echo 'echo "42 libs found in cache \`/etc/ld.so.cache'"'"'"'
    if [ "$which" != none ]; then
      echo "echo '	libstdc++.so.6 (libc6,x86-64) => $L/$which/libstdc++.so.6'"
      echo "echo '	libgcc_s.so.1 (libc6,x86-64) => $L/$which/libgcc_s.so.1'"
    fi
    echo "echo '	libc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6'"
  } > "$fake/ldconfig"
  chmod +x "$fake/getconf" "$fake/ldconfig"
  env -i HOME="$T" TMPDIR="$T/tmp" PATH="$fake:/usr/bin:/bin" BRAID_PYTHON=/nonexistent/python3 \
    LD_LIBRARY_PATH=/keep/me bash -c \
    'source "$1/env.sh"; echo "PROBLEMS=$BRAID_ENV_PROBLEMS"; echo "LDP=$LD_LIBRARY_PATH"' _ "$B" 2>&1
}

# glibc 2.36: the bundled libstdc++ serves, whatever the system has.
for which in new old none; do
  out=$(run 2.36 "$which")
  echo "--- glibc 2.36, system libstdc++ $which:"; echo "$out"
  grep -qx 'PROBLEMS=' <<< "$out" || fail "2.36/$which: a problem was reported"
  grep -qx 'LDP=/keep/me' <<< "$out" || fail "2.36/$which: LD_LIBRARY_PATH changed"
  ! grep -q 'older than\|env.sh: PROBLEM' <<< "$out" || fail "2.36/$which: a fallback or problem was printed"
done

# glibc 2.35 and 2.34: fall back to a new enough system libstdc++, or say what is missing.
for glibc in 2.35 2.34; do
  out=$(run "$glibc" new)
  echo "--- glibc $glibc, system libstdc++ new enough:"; echo "$out"
  grep -qx 'PROBLEMS=' <<< "$out" || fail "$glibc/new: a problem was reported"
  grep -qxF "env.sh: glibc $glibc is older than the bundled libstdc++ wants (2.36): using the system's $L/new/libstdc++.so.6 and $L/new/libgcc_s.so.1" <<< "$out" ||
    fail "$glibc/new: the fallback line is missing or wrong"
  first=$(sed -n 's/^LDP=//p' <<< "$out" | cut -d: -f1)
  case "$first" in "$T/tmp/braid-gcc-runtime."*) ;; *) fail "$glibc/new: LD_LIBRARY_PATH does not start with the links folder: $first" ;; esac
  [ "$(readlink "$first/libstdc++.so.6" 2>/dev/null)" = "$L/new/libstdc++.so.6" ] ||
    fail "$glibc/new: libstdc++.so.6 does not link to the system's"
  [ "$(readlink "$first/libgcc_s.so.1" 2>/dev/null)" = "$L/new/libgcc_s.so.1" ] ||
    fail "$glibc/new: libgcc_s.so.1 does not link to the system's"
  sed -n 's/^LDP=//p' <<< "$out" | grep -q ':/keep/me$' || fail "$glibc/new: the caller's LD_LIBRARY_PATH was dropped"

  out=$(run "$glibc" old)
  echo "--- glibc $glibc, system libstdc++ too old:"; echo "$out"
  want="glibc $glibc here is older than the bundled libstdc++ needs (2.36), and the system's libstdc++ ($L/old/libstdc++.so.6) lacks GLIBCXX_3.4.30: install a newer libstdc++6, or build the bundle on an older distribution"
  grep -qxF "PROBLEMS=$want" <<< "$out" || fail "$glibc/old: BRAID_ENV_PROBLEMS is not the expected message"
  grep -qxF "env.sh: PROBLEM: $want" <<< "$out" || fail "$glibc/old: the PROBLEM line is missing"
  grep -qx 'LDP=/keep/me' <<< "$out" || fail "$glibc/old: LD_LIBRARY_PATH changed"

  out=$(run "$glibc" none)
  echo "--- glibc $glibc, no system libstdc++:"; echo "$out"
  grep -qF "the system's libstdc++ (none) lacks GLIBCXX_3.4.30" <<< "$out" || fail "$glibc/none: the problem does not say there is none"
done

# glibc 2.33: below what the programs themselves need.
out=$(run 2.33 new)
echo "--- glibc 2.33:"; echo "$out"
grep -qxF "PROBLEMS=glibc 2.33 here, the bundle's programs need >= 2.34: build the bundle on an older distribution" <<< "$out" ||
  fail "2.33: BRAID_ENV_PROBLEMS is not the expected message"
! grep -q 'using the system' <<< "$out" || fail "2.33: fell back instead of refusing"

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
