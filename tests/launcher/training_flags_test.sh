#!/usr/bin/env bash
# The launcher accepts the training program's own flags before "--" (README's
# `launcher --nproc_per_node=2 --config=...`) from a list of its own (launch_flags.cc), and
# refuses every other unknown flag. That list must be the training program's flags: a flag added
# to launcher/train_main.cc and missing here would be refused before "--", one removed there
# would reach the program and fail in every worker. Also: such a flag reaches the program.
set -uo pipefail
L="$TEST_SRCDIR/braid/launcher/launcher"
TR="$TEST_SRCDIR/braid/launcher/train"
T="${TEST_TMPDIR:-$(mktemp -d)}/training_flags_test"
mkdir -p "$T"
fails=0

# The training program's flags, from its own help (absl lists them by file).
train=$("$TR" --helpfull 2>&1 | sed -n '/Flags from launcher\/train_main.cc:/,/^$/p' |
        sed -n 's/^    --\([a-z_0-9]*\) .*/\1/p' | sort)
# --log_dir is the launcher's own flag (it forwards it to the training program itself).
train=$(echo "$train" | grep -vx log_dir)
# The launcher's list, from its usage.
listed=$("$L" --help | tr '\n' ' ' | sed -n 's/.*passed on to it too: \([^.]*\)\..*/\1/p' |
         tr -d ' ' | tr ',' '\n' | sed 's/^--//' | sort)
[ -n "$train" ] && [ -n "$listed" ] || { echo "FAIL: could not read the flags (train: '$train', launcher: '$listed')"; exit 1; }
if [ "$train" = "$listed" ]; then
  echo "ok   the launcher passes on exactly the training program's flags: $(echo $train)"
else
  echo "FAIL the training program's flags and the launcher's list differ (launch_flags.cc, TrainingProgramFlags):"
  diff <(echo "$train") <(echo "$listed") | sed 's/^/     /'
  fails=$((fails + 1))
fi

# One of them, before "--", reaches the training program through the launcher.
timeout 120 "$L" --log_dir="$T/logs" --print_config --steps=7 > "$T/stdout" 2> "$T/stderr"
rc=$?
if [ $rc = 0 ] && grep -q '^steps: 7$' "$T/stdout"; then
  echo "ok   --print_config --steps=7 before -- reached the training program"
else
  echo "FAIL --print_config --steps=7 through the launcher: exit $rc"; tail -5 "$T/stdout" "$T/stderr"
  fails=$((fails + 1))
fi

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
