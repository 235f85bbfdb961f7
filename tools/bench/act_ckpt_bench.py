#!/usr/bin/env python3
"""Activation checkpointing (launcher/activation_checkpointing/activation_checkpointing.h):
memory and step time against the plain model, for gpt-mini-shaped models of several depths, one
process.

  bazel build //launcher:all //plugins/... && /usr/bin/python3 tools/bench/act_ckpt_bench.py

Models: gpt-mini (n_embd 256, n_head 4, context 128, vocabulary 256) with n_layer 4, 8, 16 and 32,
micro-batch 16, strategy single, 1 thread, on Moby Dick (launcher/configs/gpt-mini.pbtxt with the
depth and an activation_checkpointing section written into a temporary copy). Variants: none (the
plain model), sqrt (the default policy: ceil(sqrt(n)) segments) and every_block. Each round runs
every (depth, variant), the variants of a depth back to back in an order reversed every round, so
that machine noise hits them alike.

Per run: the peak tensor memory (the metrics summary's peak_bytes), the activation peak = peak -
16 bytes x parameters (fp32 parameters, gradients and AdamW's two moments: all allocated at the end
of backward, where the peak falls), the median step time over the steady steps (the trainer's
window: the first min(steps / 5, 5) left out), and whether every step's loss equals the plain
model's (it must, bit for bit). Then, over rounds: medians of the step times and the overhead
against the plain model of the same depth.

One JSON object per run on stdout, then a table.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV1 = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", BRAID_NUM_THREADS="1",
            BRAID_DATA_DIR=os.path.join(ROOT, "data"))
MIB = 2 ** 20
PSI_RE = re.compile(r"braid: training (\S+) \((\d+) parameters\)")
CKPT_RE = re.compile(r"braid: activation checkpointing: (.*)")


def write_config(depth, variant, tmp):
    text = open(os.path.join(ROOT, "launcher/configs/gpt-mini.pbtxt")).read()
    text, k = re.subn(r'model \{ name: "gpt-mini" \}',
                      f'model {{ name: "gpt-mini" n_layer: {depth} }}', text)
    assert k == 1, "model line not found in gpt-mini.pbtxt"
    assert "train_micro_batch_size_per_gpu: 16" in text, "gpt-mini.pbtxt's micro-batch changed"
    if variant != "none":
        text += f'activation_checkpointing {{ policy: "{variant}" }}\n'
    path = os.path.join(tmp, f"L{depth}-{variant}.pbtxt")
    with open(path, "w") as f:
        f.write(text)
    return path


def run(depth, variant, steps, tmp, tag, timeout):
    out = os.path.join(tmp, tag)
    cmd = [os.path.join(ROOT, "bazel-bin/launcher/train"), f"--config={write_config(depth, variant, tmp)}",
           f"--steps={steps}", f"--log_dir={out}"]
    try:
        r = subprocess.run(cmd, env=ENV1, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {(r.stdout + r.stderr)[-600:]}"}
    res = {}
    m = PSI_RE.search(r.stdout)
    res["parameters"] = int(m.group(2)) if m else None
    m = CKPT_RE.search(r.stdout)
    res["checkpointing"] = m.group(1) if m else "off"
    step_s, losses = [], []
    for line in open(os.path.join(out, "metrics.jsonl")):
        x = json.loads(line)
        if x.get("summary"):
            res["peak_bytes"] = x["peak_bytes"]
            res["peak_rss_bytes"] = x["peak_rss_bytes"]
        elif "step" in x:
            step_s.append(x["step_s"])
            losses.append(x["loss"])
    steady = step_s[min(len(step_s) // 5, 5):]  # the trainer's steady window
    res["median_step_s"] = statistics.median(steady)
    res["losses"] = losses
    res["model_state_bytes"] = 16 * res["parameters"]
    res["activation_peak_bytes"] = res["peak_bytes"] - res["model_state_bytes"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", default="4,8,16,32")
    ap.add_argument("--variants", default="none,sqrt,every_block")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout_s", type=int, default=900)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(ROOT, "bazel-bin/launcher/train")):
        sys.exit("build first: bazel build //launcher:all //plugins/...")
    depths = [int(x) for x in a.depths.split(",")]
    variants = a.variants.split(",")
    assert variants[0] == "none", "the plain model comes first: the others are compared with it"
    started = datetime.datetime.utcnow()
    runs = {}  # (depth, variant) -> [result per round]
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(a.rounds):
            for depth in depths:
                order = variants if rnd % 2 == 0 else list(reversed(variants))
                for v in order:
                    r = run(depth, v, a.steps, tmp, f"r{rnd}-L{depth}-{v}", a.timeout_s)
                    print(json.dumps({"round": rnd, "n_layer": depth, "variant": v,
                                      **{k: x for k, x in r.items() if k != "losses"}}), flush=True)
                    runs.setdefault((depth, v), []).append(r)
    print(f"\nactivation checkpointing, gpt-mini shape (C 256, 4 heads, T 128, micro-batch 16), 1 process, "
          f"1 thread, {a.rounds} round(s) x {a.steps} steps, started {started:%Y-%m-%d %H:%M} UTC\n")
    print("| n_layer | policy | segments | peak tensor MiB | activation peak MiB | vs plain | "
          "median step s | overhead | losses = plain |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    summary = {}
    for depth in depths:
        plain = runs.get((depth, "none"), [])
        plain_ok = [r for r in plain if "error" not in r]
        plain_step = statistics.median(r["median_step_s"] for r in plain_ok) if plain_ok else None
        for v in variants:
            ok = [r for r in runs.get((depth, v), []) if "error" not in r]
            if not ok:
                print(f"| {depth} | {v} | failed: {runs[(depth, v)][0].get('error', '')[:80]} |")
                continue
            step = statistics.median(r["median_step_s"] for r in ok)
            act = max(r["activation_peak_bytes"] for r in ok)
            peak = max(r["peak_bytes"] for r in ok)
            same = all(r["losses"] == p["losses"] for r in ok for p in plain_ok)
            act_plain = max(r["activation_peak_bytes"] for r in plain_ok) if plain_ok else None
            seg = re.search(r"in (\d+) segment", ok[0]["checkpointing"])
            row = {"n_layer": depth, "variant": v, "peak_mib": peak / MIB, "activation_peak_mib": act / MIB,
                   "median_step_s": step, "overhead": step / plain_step - 1 if plain_step else None,
                   "activation_vs_plain": act / act_plain if act_plain else None,
                   "losses_equal_plain": same, "step_s_by_round": [r["median_step_s"] for r in ok]}
            summary[(depth, v)] = row
            overhead = "-" if v == "none" or row["overhead"] is None else f"{100 * row['overhead']:+.1f}%"
            print(f"| {depth} | {v} | {seg.group(1) if seg else '-'} | {peak / MIB:.1f} | {act / MIB:.1f} | "
                  f"{row['activation_vs_plain']:.2f} | {step:.3f} | {overhead} | {same} |")
    # Growth of the activation peak from the shallowest to the deepest model, against sqrt(n) and n.
    lo, hi = min(depths), max(depths)
    print(f"\nactivation peak growth from {lo} to {hi} layers (sqrt(n) would be x{(hi / lo) ** 0.5:.2f}, "
          f"linear x{hi / lo:.0f}):")
    for v in variants:
        if (lo, v) in summary and (hi, v) in summary:
            g = summary[(hi, v)]["activation_peak_mib"] / summary[(lo, v)]["activation_peak_mib"]
            print(f"  {v}: x{g:.2f}")
    for row in summary.values():
        print(json.dumps({"summary": True, **row}))


if __name__ == "__main__":
    main()
