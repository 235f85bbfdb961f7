#!/usr/bin/env bash
# gpu_check.sh from a bundle on a machine without a GPU: it must say so plainly, write its JSON
# with every check "not run" (none passed), and exit non-zero.
source "$TEST_SRCDIR/braid/tools/bundle/testlib.sh"
make_cpu_bundle
B="$T/braid-gpu"

"$B/gpu_check.sh" --out "$T/results" > "$T/check.out" 2>&1
rc=$?
cat "$T/check.out"
[ "$rc" != 0 ] || fail "gpu_check.sh exited 0 without a GPU"
grep -q 'NOT RUN: no usable NVIDIA GPU' "$T/check.out" || fail "gpu_check.sh did not say plainly that there is no GPU"
[ -s "$T/results/gpu_check.log" ] || fail "no gpu_check.log"
/usr/bin/python3 - "$T/results/gpu_check.json" <<'PY' || fail "the JSON"
import json, sys
r = json.load(open(sys.argv[1]))
checks = r["checks"]
names = [c["name"] for c in checks]
statuses = {c["status"] for c in checks}
print("checks:", names, "statuses:", statuses)
assert statuses == {"not run"}, f"every check must be 'not run', got {statuses}"
for want in ["allocator_streams", "gpt_mini_f32", "gpt_mini_bf16", "gpt2_124m", "nccl_2proc"]:
    assert want in names, f"{want} missing from {names}"
assert r["all_passed"] is False, "all_passed must be false"
assert r["gpu"] is None, f"gpu must be null, got {r['gpu']}"
assert "no usable NVIDIA GPU" in r["not_run_reason"], r["not_run_reason"]
assert "glibc_min=" in r["bundle"], r["bundle"]
PY

[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
