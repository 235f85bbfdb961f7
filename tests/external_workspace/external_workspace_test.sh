#!/usr/bin/env bash
# A strategy plugin built in a user's own Bazel workspace that depends on Braid as @braid, as
# docs/WRITING_A_STRATEGY.md tells a user to set it up, then trained by Braid's training program
# from a config's `strategy { path: ... }` given relative to the folder the user runs from.
#
# The workspace is made here, in the test's scratch folder, from the lines the guide documents;
# an inner Bazel (--batch: no server left behind, its own output root) builds the plugin. It
# reaches only Braid's headers (//core:headers, named by braid_plugin through Label()) and the
# Debian libraries; nothing is downloaded.
set -euo pipefail
tmp="${TEST_TMPDIR:-$(mktemp -d)}/user_ws"
rm -rf "$tmp"; mkdir -p "$tmp/my_strategy"
# Braid's own tree (not the runfiles' links): a source file in the runfiles leads back to it.
braid=$(cd "$(dirname "$(readlink -f "$TEST_SRCDIR/braid/tests/external_workspace/BUILD")")/../.." && pwd)
[ -f "$braid/WORKSPACE" ] || { echo "FAIL: cannot find Braid's workspace from the runfiles ($braid)"; exit 1; }

# The WORKSPACE lines of docs/WRITING_A_STRATEGY.md ("A plugin in your own workspace").
sed -n '/^# ---- user WORKSPACE ----$/,/^# ---- end ----$/p' "$braid/docs/WRITING_A_STRATEGY.md" |
  sed '1d;$d' | sed "s|/path/to/braid|$braid|" > "$tmp/WORKSPACE"
grep -q 'local_repository' "$tmp/WORKSPACE" ||
  { echo "FAIL: the guide's WORKSPACE lines were not found between its markers"; exit 1; }
cp "$braid/tests/external_plugin/external_example.cc" "$tmp/my_strategy/"
cat > "$tmp/my_strategy/BUILD" <<'BUILD'
load("@braid//core:plugin.bzl", "braid_plugin")

braid_plugin(
    name = "external_example",
    srcs = ["external_example.cc"],
)
BUILD
# Bazel reads the user's settings: keep them to this scratch folder.
export HOME="$tmp/home"; mkdir -p "$HOME"
(cd "$tmp" && bazel --batch --output_user_root="$tmp/bazel_root" build \
   --nosandbox_debug --spawn_strategy=processwrapper-sandbox --cxxopt=-std=c++17 \
   //my_strategy:libbraid_external_example.so) > "$tmp/build.log" 2>&1 ||
  { echo "FAIL: the plugin did not build in the user's workspace:"; tail -30 "$tmp/build.log"; exit 1; }
so="$tmp/bazel-bin/my_strategy/libbraid_external_example.so"
[ -f "$so" ] || { echo "FAIL: no $so"; exit 1; }
echo "ok   built my_strategy:libbraid_external_example.so against @braid"

# Trained by Braid's training program as `bazel run` starts it: in another folder (the runfiles
# tree; here /), with BUILD_WORKSPACE_DIRECTORY naming the user's workspace, and the paths as the
# guide writes them, relative to that workspace.
cat > "$tmp/tiny.pbtxt" <<'CFG'
model { name: "gpt-mini" n_layer: 1 n_head: 2 n_embd: 32 block_size: 16 }
train_micro_batch_size_per_gpu: 2
steps: 2
strategy { name: "external_example" path: "bazel-bin/my_strategy/libbraid_external_example.so" }
CFG
train="$TEST_SRCDIR/braid/launcher/train"
case "$train" in /*) ;; *) train="$PWD/$train" ;; esac
out=$(cd / && env BRAID_PLUGIN_PATH= BUILD_WORKSPACE_DIRECTORY="$tmp" "$train" \
        --config="$tmp/tiny.pbtxt" --log_dir="$tmp/run" 2>&1) || { echo "FAIL: training with the plugin exited $?:"; echo "$out" | tail -20; exit 1; }
echo "$out" | grep -q '^external_example: set up on' ||
  { echo "FAIL: the plugin's code did not run:"; echo "$out" | tail -20; exit 1; }
echo "$out" | grep -q '^braid: done: 2 steps' ||
  { echo "FAIL: no summary of 2 steps:"; echo "$out" | tail -20; exit 1; }
echo "ok   trained 2 steps with it, its path relative to the user's folder"
echo PASS
