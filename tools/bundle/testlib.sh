# Sourced by the bundle tests: makes a CPU bundle (the default build's launcher, training program
# and plugins, from the test's runfiles) with make_bundle.sh, as tools/gpu_bundle.sh --cpu_only
# would, at "$T/braid-gpu". Sets R (this package in the runfiles) and T (a fresh folder).
set -uo pipefail
R="$TEST_SRCDIR/braid/tools/bundle"
T="${TEST_TMPDIR:-$(mktemp -d)}/bundle"
rm -rf "$T"; mkdir -p "$T"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

make_cpu_bundle() {  # extra make_bundle.sh arguments...
  local args=(--bin "$TEST_SRCDIR/braid/launcher/launcher" --bin "$TEST_SRCDIR/braid/launcher/train")
  local so
  while IFS= read -r so; do args+=(--plugin "$so"); done < <(
    find -L "$TEST_SRCDIR/braid/plugins" "$TEST_SRCDIR/braid/backends" -name 'libbraid_*.so' | sort)
  args+=(--config "$TEST_SRCDIR/braid/launcher/configs/gpt-mini.pbtxt")
  args+=(--file "gpu_check.sh=$TEST_SRCDIR/braid/tools/gpu_check.sh")
  "$R/make_bundle.sh" "$T/braid-gpu" "${args[@]}" "$@" > "$T/make_bundle.out" 2>&1 ||
    { cat "$T/make_bundle.out"; echo "FAIL: make_bundle.sh"; exit 1; }
  cat "$T/make_bundle.out"
}
