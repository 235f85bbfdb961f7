#!/usr/bin/env bash
# The launcher finds the training program and the training program finds its plugins however
# they are started (issue: `bazel run //launcher` failed with "plugin 'ddp' not found" because
# Bazel builds a runfiles tree for the launcher only, never for the training program inside it).
# Each case trains gpt-mini for 2 steps on 2 workers (DDP over Gloo), with no runfiles variables
# of the test around:
#   bazel_run  - the launcher in bazel-bin with its runfiles tree beside it, started from inside
#                that tree, as `bazel run //launcher` does;
#   bazel_bin  - the same binary by a relative path from another folder (bazel-bin/launcher/launcher);
#   installed  - a copy of the bazel-bin layout (launcher/, plugins/, backends/) with no runfiles.
#
# Each case's time is bounded by what is left of the target's own timeout (bounded, lib.sh).
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" layouts
src="$TEST_SRCDIR/braid"
tmp="$T"
config="$(readlink -f "$src/launcher/configs/gpt-mini-ddp.pbtxt")"
# The checkout (through a source file of ours), for its data/ folder.
data="$(dirname "$(dirname "$(dirname "$(readlink -f "$src/tests/e2e/BUILD")")")")/data"

# A bazel-bin: the launcher binary with its runfiles tree (this test's runfiles hold everything
# the launcher's do) and no tree for the training program.
mkdir -p "$tmp/bin/launcher"
cp "$(readlink -f "$src/launcher/launcher")" "$tmp/bin/launcher/launcher"
ln -s "$TEST_SRCDIR" "$tmp/bin/launcher/launcher.runfiles"
[ ! -e "$tmp/bin/launcher/launcher.runfiles/braid/launcher/train.runfiles" ] ||
  { echo "FAIL: the training program has a runfiles tree here; the test would prove nothing"; exit 1; }

# An installed copy: files only, no symbolic links, no runfiles.
inst="$tmp/inst"
mkdir -p "$inst/launcher"
cp -L "$src/launcher/launcher" "$src/launcher/train" "$inst/launcher/"
for so in "$src"/plugins/*/libbraid_*.so "$src"/backends/*/libbraid_*.so; do
  rel="${so#$src/}"
  mkdir -p "$inst/$(dirname "$rel")"
  cp -L "$so" "$inst/$rel"
done

clean_env=(env -u RUNFILES_DIR -u RUNFILES_MANIFEST_FILE -u RUNFILES_MANIFEST_ONLY -u TEST_SRCDIR
           -u JAVA_RUNFILES -u BUILD_WORKSPACE_DIRECTORY -u BRAID_PLUGIN_PATH -u BRAID_JOB_TOKEN)
run_case() {  # NAME DIR ORIGIN -- launcher command...
  local name=$1 dir=$2 origin=$3; shift 4
  local out="$tmp/$name"
  mkdir -p "$out"
  (cd "$dir" && bounded "${clean_env[@]}" BRAID_DATA_DIR="$data" "$@" --nproc_per_node=2 \
     --log_dir="$out/logs" --config="$config" --steps=2 > "$out/stdout" 2> "$out/stderr")
  local rc=$?
  if [ $rc = 0 ] && grep -q '^braid: done: ' "$out/stdout" && grep -q 'strategy ddp' "$out/stdout"; then
    echo "ok   $name: trained 2 steps with DDP"
    if grep -qE "^braid: plugins $origin" "$out/logs/train.log"; then
      echo "ok   $name: $(grep '^braid: plugins' "$out/logs/train.log")"
    else
      echo "FAIL $name: plugins not found $origin:"; grep '^braid: plugins' "$out/logs/train.log"
      fails=$((fails + 1))
    fi
  else
    echo "FAIL $name: $(ended $rc)"; tail -15 "$out/stdout" "$out/stderr" "$out"/logs/workerlog.* 2>/dev/null
    fails=$((fails + 1))
  fi
}
# The runfiles cases must find the plugins through the launcher's runfiles (the environment it
# hands the training program), not by luck of the folder layout.
run_case bazel_run "$tmp/bin/launcher/launcher.runfiles/braid" "from the runfiles at $tmp/bin/launcher/launcher.runfiles/braid\$" \
  -- "$tmp/bin/launcher/launcher"
run_case bazel_bin "$tmp/bin" "from the runfiles at $tmp/bin/launcher/launcher.runfiles/braid\$" -- launcher/launcher
run_case installed / "from the folders beside the program at $inst/launcher/..\$" -- "$inst/launcher/launcher"
[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
