#!/usr/bin/env bash
# README.md's "Train on your own text", run as written: each command of its code block, with
# `bazel run //X --` replaced by the program Bazel would run, in a scratch copy of the checkout's
# layout (the installed data linked in, the data set written there, not into the checkout), and
# `--steps=3` added to the training run. tools/setup.sh is this machine's setup: the target
# requires what it installs (the data sets and GPT-2's vocabulary).
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" readme_own_text
prep="$TEST_SRCDIR/braid/tools/prepare_data/prepare_data"
readme="$TEST_SRCDIR/braid/README.md"
# The checkout: this package's BUILD in the runfiles links back into it.
ws=$(cd "$(dirname "$(readlink -f "$TEST_SRCDIR/braid/tests/e2e/BUILD")")/../.." && pwd)
[ -d "$ws/data/node_modules" ] || { echo "FAIL no data/node_modules in $ws"; exit 1; }

work="$T/checkout"
mkdir -p "$work/data" "$work/launcher"
ln -s "$ws/data/node_modules" "$work/data/node_modules"
ln -s "$TEST_SRCDIR/braid/launcher/configs" "$work/launcher/configs"

# The section's code block.
block=$(awk '/^## Train on your own text/ {in_section=1; next}
             in_section && /^## / {exit}
             in_section && /^```/ {in_block=!in_block; next}
             in_section && in_block {print}' "$readme")
[ -n "$block" ] || { echo "FAIL README.md has no code block under \"## Train on your own text\""; exit 1; }
n=$(wc -l <<<"$block")
[ "$n" -le 5 ] || fail "the section has $n commands; it promises at most 5"

ran=0
while IFS= read -r line; do
  case "$line" in
    "tools/setup.sh") continue ;;
    "bazel run //tools:prepare_data -- "*) program="$prep"; args="${line#bazel run //tools:prepare_data -- }"; extra="" ;;
    "bazel run //launcher -- "*) program="$L"; args="${line#bazel run //launcher -- }"; extra="--steps=3 --log_dir=$T/run" ;;
    *) fail "README command this test cannot run: $line"; continue ;;
  esac
  echo "README: $line"
  # eval: the shell expands the command's glob in the checkout, as the user's shell would.
  out=$(cd "$work" && BUILD_WORKING_DIRECTORY="$work" BUILD_WORKSPACE_DIRECTORY="$work" \
        eval "bounded \"\$program\" $args $extra" 2>&1) || fail "$line: $(tail -5 <<<"$out")"
  tail -3 <<<"$out"
  ran=$((ran + 1))
done <<<"$block"
[ "$ran" = 2 ] || fail "ran $ran of the section's commands; want prepare_data and the training run"

grep -q '"tokenizer": "gpt2"' "$work/data/mobydick-gpt2/manifest.json" || fail "no gpt2 manifest"
grep -q '"documents": {"train":121,"validation":14}' "$work/data/mobydick-gpt2/manifest.json" ||
  fail "want 135 chapters, 14 held out: $(head -3 "$work/data/mobydick-gpt2/manifest.json")"
/usr/bin/python3 - "$T/run/metrics.jsonl" <<'PY' || fail "training metrics"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l and '"loss"' in l]
assert [r["step"] for r in rows] == [0, 1, 2], rows
# GPT-2's vocabulary: a fresh model starts near ln(50257) = 10.8.
assert all(math.isfinite(r["loss"]) for r in rows) and 9.5 < rows[0]["loss"] < 12, rows
PY
# The 124M config beside it validates (not trained here).
(cd "$work" && BUILD_WORKSPACE_DIRECTORY="$work" "$TR" --config=launcher/configs/gpt2-124m-mobydick.pbtxt \
   --print_config >"$T/124m.txt" 2>&1) || fail "gpt2-124m-mobydick.pbtxt: $(tail -3 "$T/124m.txt")"
[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
