#!/usr/bin/env bash
# tools/plot_metrics.py end to end: two small synthetic metrics files (with the trainer's summary
# line last) drawn to PNG and SVG; the PNG must start with the PNG signature and carry an IHDR of
# the figure's size, the SVG must parse as XML and hold one <g id="curve_i"> per file whose path
# has one point per step; --smooth keeps every step; run_a's validation lines (an eval section)
# are drawn beside its training loss (<g id="val_curve_0">, one point each), alone with
# --y val_loss, and skipped for other fields; a malformed line, a missing field and a wrong
# extension fail naming the file and line. Needs matplotlib: Bazel skips this test where it
# is missing (BUILD: requires("matplotlib")), so here its absence is a failure.
set -uo pipefail
py=/usr/bin/python3
script="$TEST_SRCDIR/braid/tools/plot_metrics.py"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
if ! "$py" -c 'import matplotlib' 2>/dev/null; then
  echo "FAIL: $py cannot import matplotlib although the build found it (run tools/setup.sh)"
  exit 1
fi
fails=0
check() {  # check NAME PATTERN TEXT
  if grep -qE "$2" <<<"$3"; then echo "ok   $1"; else
    echo "FAIL $1: no match for /$2/ in:"; tail -5 <<<"$3"; fails=$((fails+1)); fi
}
mkdir -p "$tmp/run_a" "$tmp/run_b"
# 30 and 20 steps of a decaying loss; the summary line last, as the trainer writes it.
"$py" - "$tmp" <<'PY'
import json, math, sys
for name, n, rate in (("run_a", 30, 0.05), ("run_b", 20, 0.08)):
    with open(f"{sys.argv[1]}/{name}/metrics.jsonl", "w") as f:
        for s in range(n):
            f.write(json.dumps({"step": s, "loss": 5.5 * math.exp(-rate * s) + 1.0,
                                "tokens_per_s": 9000 + s}) + "\n")
            if name == "run_a" and s % 10 == 9:  # eval { every_steps: 10 }: 3 validation lines
                v = 5.5 * math.exp(-rate * s) + 1.2
                f.write(json.dumps({"step": s, "val_loss": v, "val_ppl": math.exp(v)}) + "\n")
        f.write(json.dumps({"summary": True, "steps": n, "final_loss": 1.5}) + "\n")
PY
a="$tmp/run_a/metrics.jsonl"; b="$tmp/run_b/metrics.jsonl"
out=$("$py" "$script" "$a" "$b" -o "$tmp/loss.png" 2>&1); rc=$?
check png-runs "wrote .*loss.png \(2 curve\(s\) of loss and 1 of val_loss\)" "$out rc=$rc"
out=$("$py" "$script" "$a" "$b" --label first --label second --smooth 5 --logy -o "$tmp/loss.svg" 2>&1)
check svg-runs "wrote .*loss.svg \(2 curve\(s\) of loss and 1 of val_loss\)" "$out"
out=$("$py" - "$tmp" <<'PY' 2>&1
import re, struct, sys
import xml.etree.ElementTree as ET
d = sys.argv[1]
png = open(f"{d}/loss.png", "rb").read()
sig = png[:8] == b"\x89PNG\r\n\x1a\n"
w, h = struct.unpack(">II", png[16:24]) if png[12:16] == b"IHDR" else (0, 0)
print(f"png signature {sig} ihdr {w}x{h}")  # figsize 8x5 at 100 dpi
root = ET.parse(f"{d}/loss.svg").getroot()  # raises if it is not XML
ns = "{http://www.w3.org/2000/svg}"
for gid, steps in (("curve_0", 30), ("curve_1", 20), ("val_curve_0", 3), ("val_curve_1", 0)):
    g = [e for e in root.iter(ns + "g") if e.get("id") == gid]
    paths = [p for e in g for p in e.iter(ns + "path")]
    pts = len(re.findall(r"[ML]\s", paths[0].get("d"))) if paths else 0
    print(f"{gid} groups {len(g)} paths {len(paths)} points {pts} want {steps}")
texts = " ".join(t.text or "" for t in root.iter(ns + "text"))
print("svg has", len(list(root.iter(ns + "g"))), "groups")
PY
)
check png-signature "png signature True ihdr 800x500" "$out"
check svg-curve-0 "curve_0 groups 1 paths 1 points 30 want 30" "$out"
check svg-curve-1 "curve_1 groups 1 paths 1 points 20 want 20" "$out"
check svg-val-curve-0 "val_curve_0 groups 1 paths [0-9]+ points 3 want 3" "$out"
check svg-no-val-curve-1 "val_curve_1 groups 0 paths 0 points 0 want 0" "$out"
# Other fields skip the validation lines; --y val_loss draws them alone.
out=$("$py" "$script" "$a" "$b" --y tokens_per_s -o "$tmp/tps.png" 2>&1)
check skip-val-lines "wrote .*tps.png \(2 curve\(s\) of tokens_per_s\)$" "$out"
out=$("$py" "$script" "$a" --y val_loss -o "$tmp/val.png" 2>&1)
check val-alone "wrote .*val.png \(1 curve\(s\) of val_loss\)$" "$out"
out=$("$py" "$script" "$b" --y val_loss -o "$tmp/noval.png" 2>&1)
check no-val-lines "run_b/metrics.jsonl: no validation lines \(the run had no eval section\)" "$out"
# Malformed input: the error names the file and the line.
cp "$a" "$tmp/bad.jsonl"; sed -i '4s/.*/{"step": 3, "loss": 2.0/' "$tmp/bad.jsonl"
out=$("$py" "$script" "$tmp/bad.jsonl" -o "$tmp/bad.png" 2>&1); rc=$?
[ "$rc" = 1 ] || { echo "FAIL malformed: exit $rc, want 1"; fails=$((fails+1)); }
check malformed-line "^plot_metrics.py: .*/bad.jsonl:4: not a JSON object" "$out"
[ ! -e "$tmp/bad.png" ] || { echo "FAIL malformed: wrote a figure anyway"; fails=$((fails+1)); }
out=$("$py" "$script" "$a" --y loss_scale -o "$tmp/ls.png" 2>&1)
check missing-field "run_a/metrics.jsonl:1: no field \"loss_scale\" to plot .*choose one with --y" "$out"
out=$("$py" "$script" "$a" -o "$tmp/loss.jpg" 2>&1)
check bad-extension "the extension must be .png or .svg" "$out"
out=$("$py" "$script" "$a" "$b" --label one -o "$tmp/l.png" 2>&1)
check label-count "1 --label for 2 files" "$out"
[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
