#!/usr/bin/env bash
# End to end through the real training program: optimizer.type "Adam8bit" (any case) loads the
# plugin by name before validation; an unknown type fails in one line naming the known optimizers
# and the plugin files looked for. With "train" as the argument (needs tools/setup.sh's data),
# gpt-mini trains with launcher/configs/gpt-mini-adam8bit.pbtxt and reports its state bytes.
set -uo pipefail
train="$TEST_SRCDIR/braid/launcher/train"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
check() {  # check NAME PATTERN TEXT
  if grep -qE "$2" <<<"$3"; then
    echo "ok   $1"
  else
    echo "FAIL $1: no match for /$2/ in:"; tail -5 <<<"$3"; fails=$((fails+1))
  fi
}
printf 'optimizer { type: "adam8bit" }\n' > "$tmp/lower.pbtxt"
out=$(timeout 60 "$train" --config="$tmp/lower.pbtxt" --print_config 2>&1)
check lowercase-is-canonical 'type: "Adam8bit"' "$out"
check adamw-defaults 'betas: 0.95' "$out"
printf 'optimizer { type: "Sophia" }\n' > "$tmp/sophia.pbtxt"
out=$(timeout 60 "$train" --config="$tmp/sophia.pbtxt" --log_dir="$tmp/l" 2>&1); rc=$?
[ "$rc" = 1 ] || { echo "FAIL unknown-type: exit code $rc, want 1"; fails=$((fails+1)); }
check unknown-type "^braid train: [^ ]*/sophia\.pbtxt:1:13: optimizer.type: unknown optimizer 'Sophia'; known: Adam, AdamW, SGD\..*looked for libbraid_sophia.so at .*/sophia/libbraid_sophia.so" "$out"
if [ "${1:-}" = train ]; then
  out=$(timeout 300 "$train" --config="$TEST_SRCDIR/braid/launcher/configs/gpt-mini-adam8bit.pbtxt" \
    --steps=30 --log_dir="$tmp/run" 2>&1); rc=$?
  [ "$rc" = 0 ] || { echo "FAIL train: exit code $rc"; tail -5 <<<"$out"; fails=$((fails+1)); }
  check state-bytes '^braid: Adam8bit: optimizer state [0-9]+ bytes \([0-9.]+ MiB\) for 3257856 parameters \(2\.0[0-9]+ B/param' "$out"
  /usr/bin/python3 - "$tmp/run/metrics.jsonl" <<'PY' || fails=$((fails+1))
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r]
last = sum(r["loss"] for r in steps[-5:]) / 5
print(f"{'ok  ' if last < 3.5 else 'FAIL'} loss-falls: mean of the last 5 of {len(steps)} steps {last:.4f} (< 3.5)")
sys.exit(0 if last < 3.5 else 1)
PY
fi
[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
