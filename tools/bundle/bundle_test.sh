#!/usr/bin/env bash
# The bundling of tools/gpu_bundle.sh on a CPU build (the same make_bundle.sh; CI cannot afford a
# --config=cuda build): the bundle's programs, plugins and libraries pass check_bundle.sh (every
# NEEDED inside the bundle or the C library; RUNPATHs only $ORIGIN-relative, checked with
# readelf and with ldd), they run from it, and check_bundle.sh does fail on a missing library and
# on a RUNPATH leading out (a checker that cannot fail proves nothing).
source "$TEST_SRCDIR/braid/tools/bundle/testlib.sh"
B="$T/braid-gpu"
make_cpu_bundle

"$R/check_bundle.sh" "$B" || fail "check_bundle.sh on a fresh bundle"
for f in "$B"/bin/* "$B"/plugins/*; do
  rp=$(readelf -d "$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]$/\1/p')
  [ "$rp" = '$ORIGIN/../lib' ] || fail "$f: RUNPATH '$rp', want \$ORIGIN/../lib"
done
[ -e "$B/lib/libstdc++.so.6" ] || fail "libstdc++.so.6 is not in lib/"
[ -e "$B/lib/libc.so.6" ] && fail "lib/ holds the C library"
grep -q '^glibc_min=2\.[0-9]' "$B/BUNDLE_INFO" || fail "BUNDLE_INFO has no glibc_min: $(cat "$B/BUNDLE_INFO")"

# Moved elsewhere, the programs still find everything (their own libraries, the plugins).
mv "$B" "$T/moved" && B="$T/moved"
out=$(env -i PATH=/usr/bin:/bin "$B/bin/train" --help 2>&1 | head -3)
grep -q -i 'usage\|flags' <<<"$out" || fail "bin/train --help from the moved bundle: $out"

# A library missing from lib/: named.
cp -a "$B" "$T/broken1"
lib=$(cd "$T/broken1/lib" && ls libabsl_strings.so.* | head -1)
rm "$T/broken1/lib/$lib"
out=$("$R/check_bundle.sh" "$T/broken1" 2>&1) && fail "check_bundle.sh passed a bundle without $lib"
grep -q "needs $lib" <<<"$out" || fail "check_bundle.sh did not name the missing $lib: $out"

# A RUNPATH that leads out of the bundle: named.
cp -a "$B" "$T/broken2"
patchelf --set-rpath /usr/lib/x86_64-linux-gnu "$T/broken2/bin/train"
out=$("$R/check_bundle.sh" "$T/broken2" 2>&1) && fail "check_bundle.sh passed a RUNPATH outside the bundle"
grep -q "bin/train: RUNPATH entry '/usr/lib/x86_64-linux-gnu' is not relative" <<<"$out" ||
  fail "check_bundle.sh did not name the outside RUNPATH: $out"

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
