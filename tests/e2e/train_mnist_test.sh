#!/usr/bin/env bash
# End to end: the MNIST MLP trains through the launcher and classifies held-out digits well.
# The run's time is bounded by the target's own timeout (lib.sh): a hang fails with its output.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" mnist
set -e
out="$T/run"
bounded "$L" --config="$TEST_SRCDIR/braid/launcher/configs/mnist-mlp.pbtxt" \
  --log_dir="$out" > "$out.stdout" 2>&1 || { cat "$out.stdout"; echo "FAIL: training exited non-zero"; exit 1; }
cat "$out.stdout"
acc=$(sed -n 's/^braid: test accuracy \([0-9.]*\)%.*/\1/p' "$out.stdout")
[ -n "$acc" ] || { echo "FAIL: no test accuracy reported"; exit 1; }
awk -v a="$acc" 'BEGIN { exit !(a >= 90.0) }' || { echo "FAIL: test accuracy $acc% < 90%"; exit 1; }
echo PASS
