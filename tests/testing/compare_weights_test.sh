#!/usr/bin/env bash
# compare_weights.py, which the multi-process equivalence tests trust to say "equal", passes equal
# files and differences within the tolerance, and fails (exit non-zero, naming the tensor) on a
# difference beyond it, on a NaN or inf in either file (also where the NaN's tensor sorts after a
# finite difference, which max() over the differences used to drop), on the same inf in both, in
# F16 as in F32, and on shapes that differ.
set -uo pipefail
CMP="$TEST_SRCDIR/braid/tests/testing/compare_weights.py"
T="${TEST_TMPDIR:-$(mktemp -d)}/compare_weights"
rm -rf "$T"; mkdir -p "$T"
# write NAME 'SPEC': SPEC is a Python dict literal {tensor: (dtype, shape, values)}.
write() {
  /usr/bin/python3 - "$T/$1.safetensors" "$2" <<'PY'
import ast, json, struct, sys
fmt = {"F32": "<f", "F16": "<e"}
header, blob = {}, b""
for name, (dtype, shape, values) in ast.literal_eval(sys.argv[2]).items():
    data = b"".join(struct.pack(fmt[dtype], float(v)) for v in values)
    offsets = [len(blob), len(blob) + len(data)]
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
    blob += data
h = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + blob)
PY
}
fails=0
# expect NAME A B TOL WANT_EXIT [TEXT]: the exit status is WANT_EXIT (0, or non-zero for "fail"),
# and the output holds TEXT.
expect() {
  out=$(/usr/bin/python3 "$CMP" "$T/$2.safetensors" "$T/$3.safetensors" "$4" 2>&1); rc=$?
  if [ "$5" = 0 ] && [ $rc -ne 0 ]; then
    echo "FAIL $1: exit $rc, want 0: $out"; fails=$((fails+1)); return
  fi
  if [ "$5" != 0 ] && [ $rc -eq 0 ]; then
    echo "FAIL $1: exit 0, want a failure: $out"; fails=$((fails+1)); return
  fi
  if [ -n "${6:-}" ] && [[ "$out" != *"$6"* ]]; then
    echo "FAIL $1: output does not name '$6': $out"; fails=$((fails+1)); return
  fi
  echo "ok   $1: exit $rc: $out"
}

write base "{'a': ('F32', [2], [0.5, -1.0]), 'b': ('F32', [3], [1.0, 2.0, 3.0])}"
write near "{'a': ('F32', [2], [0.5, -1.0]), 'b': ('F32', [3], [1.0, 2.0, 3.25])}"
write nan_b "{'a': ('F32', [2], [0.5, -1.0]), 'b': ('F32', [3], [1.0, 'nan', 3.0])}"
write nan_b_far_a "{'a': ('F32', [2], [0.75, -1.0]), 'b': ('F32', [3], [1.0, 'nan', 3.0])}"
write inf_a "{'a': ('F32', [2], ['inf', -1.0]), 'b': ('F32', [3], [1.0, 2.0, 3.0])}"
write ninf_b "{'a': ('F32', [2], [0.5, -1.0]), 'b': ('F32', [3], [1.0, 2.0, '-inf'])}"
write f16 "{'a': ('F16', [2], [0.5, -1.0]), 'b': ('F16', [3], [1.0, 2.0, 3.0])}"
write f16_nan "{'a': ('F16', [2], [0.5, 'nan']), 'b': ('F16', [3], [1.0, 2.0, 3.0])}"
write shape "{'a': ('F32', [1, 2], [0.5, -1.0]), 'b': ('F32', [3], [1.0, 2.0, 3.0])}"

expect equal base base 0 0
expect within_tolerance near base 0.25 0
expect beyond_tolerance near base 0.2 1 "(b)"
expect nan_in_a nan_b base 1 1 "b in A"
expect nan_in_b base nan_b 1 1 "b in B"
# 'a' differs by 0.25 and sorts first: the old max() kept (0.25, 'a') over (nan, 'b') and passed.
expect nan_after_a_finite_difference nan_b_far_a base 1 1 "b in A"
expect nan_in_both nan_b nan_b 1 1 "b in A"
expect inf_in_a inf_a base 1 1 "a in A"
expect minus_inf_in_b base ninf_b 1 1 "b in B"
expect same_inf_in_both inf_a inf_a 1 1 "a in B"
expect f16_equal f16 base 0 0
expect f16_nan f16_nan f16 1 1 "a in A"
expect shapes_differ shape base 1 1 "different shapes: a"

[ $fails -eq 0 ] && echo PASS || { echo "$fails failed"; exit 1; }
