#!/usr/bin/env python3
"""gpt-mini trained in f32, bf16, fp16 and with 8-bit AdamW (issue 13): quality, speed, memory.

  bazel build //launcher:all //plugins/... && /usr/bin/python3 tools/bench/precision_bench.py

Runs the built training program (bazel-bin/launcher/train) on four shipped configs, one process
and one thread each, as tools/bench/adam8bit_bench.py does (its run() is reused):
  f32       launcher/configs/gpt-mini.pbtxt           (the reference run)
  bf16      launcher/configs/gpt-mini-bf16.pbtxt
  fp16      launcher/configs/gpt-mini-fp16.pbtxt      (dynamic loss scaling)
  adam8bit  launcher/configs/gpt-mini-adam8bit.pbtxt
A missing config is skipped with a line saying so. Quality: one --steps run (default 500) of
each, deterministic (same seed, same batches): the final step's loss and the mean of the last 50
steps, each against f32's. Speed: tokens/s is the median over every run of a variant; with
--speed_rounds R, R more rounds of --speed_steps-step runs follow, each round running every
variant once, in an order that rotates from round to round (so no variant always runs first or
last on a machine whose load drifts). Memory: the allocator's peak tensor memory; the optimizer
state (Adam8bit's own report, else 8 B x parameters for AdamW's two f32 moments, 12 B with the
f32 master weights of a bf16/fp16 run); and, where the
strategy reports them (the summary's "model state per rank (peak)" line: parameters, gradients,
optimizer state, ...), those peaks by kind. fp16: the final loss scale and the skipped steps (the
summary's "loss_scale" and "skipped_steps"; per step, metrics' "loss_scale" and "skipped").

Writes, under --out (default runs/precision-bench-<time>): each run's folder (metrics.jsonl,
train.log), results.jsonl (one JSON line per run, also printed), and the loss curves of the
quality runs drawn by tools/plot_metrics.py to loss.png and loss.svg (needs matplotlib; skipped
with a line if /usr/bin/python3 cannot import it). Then a table.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import adam8bit_bench as base  # noqa: E402  (run(), TRAIN, ROOT: one way to run the program)

ROOT = base.ROOT
VARIANTS = [("f32", "launcher/configs/gpt-mini.pbtxt"),
            ("bf16", "launcher/configs/gpt-mini-bf16.pbtxt"),
            ("fp16", "launcher/configs/gpt-mini-fp16.pbtxt"),
            ("adam8bit", "launcher/configs/gpt-mini-adam8bit.pbtxt")]
PLOTTER = os.path.join(ROOT, "tools", "plot_metrics.py")
PYTHON = "/usr/bin/python3"  # Debian's, where tools/setup.sh installs matplotlib


def fp16_fields(folder):
    """Loss scale at the end and skipped steps: the summary's, else counted from the steps."""
    out = {}
    path = os.path.join(folder, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path) if line.strip()]
    steps = [r for r in rows if "step" in r and not r.get("summary")]
    summary = ([r for r in rows if r.get("summary")] or [{}])[-1]
    if "loss_scale" in summary:
        out["final_loss_scale"] = summary["loss_scale"]
    elif steps and "loss_scale" in steps[-1]:
        out["final_loss_scale"] = steps[-1]["loss_scale"]
    if "skipped_steps" in summary:
        out["skipped_steps"] = summary["skipped_steps"]
    elif steps and "skipped" in steps[0]:
        out["skipped_steps"] = sum(1 for r in steps if r["skipped"])
    if "precision" in summary:
        out["precision"] = summary["precision"]
    return out


PEAKS_RE = re.compile(r"braid: model state per rank \(peak\):(.*?);")
KIND_RE = re.compile(r"\s*([A-Za-z][A-Za-z _-]*?) ([\d.]+) MiB")


def state_peaks(folder):
    """{kind: MiB} from the summary's "model state per rank (peak)" line, if it has one."""
    log = os.path.join(folder, "train.log")
    if not os.path.exists(log):
        return {}
    m = PEAKS_RE.search(open(log).read())
    if not m:
        return {}
    return {k.strip(): float(v) for k, v in (KIND_RE.match(part).groups()
                                             for part in m.group(1).split(",")
                                             if KIND_RE.match(part))}


def plot(out, curves):
    """Both figures of the quality runs' losses with tools/plot_metrics.py; returns the files."""
    if subprocess.run([PYTHON, "-c", "import matplotlib"], capture_output=True).returncode != 0:
        print(f"precision_bench: no figures: {PYTHON} cannot import matplotlib "
              "(tools/setup.sh installs python3-matplotlib)")
        return []
    files = []
    for ext in ("png", "svg"):
        target = os.path.join(out, f"loss.{ext}")
        cmd = [PYTHON, PLOTTER, *[m for _, m in curves], "-o", target, "--smooth", "10",
               "--title", "gpt-mini, loss (mean of the last 10 steps)"]
        for label, _ in curves:
            cmd += ["--label", label]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"precision_bench: plotting failed: {(r.stdout + r.stderr).strip()}")
            continue
        files.append(target)
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500, help="steps of each quality run")
    ap.add_argument("--only", default="",
                    help="comma-separated variants to run (default: all of "
                         + ", ".join(n for n, _ in VARIANTS) + ")")
    ap.add_argument("--speed_rounds", type=int, default=1,
                    help="extra rounds of short runs for tokens/s, every variant once per round")
    ap.add_argument("--speed_steps", type=int, default=60, help="steps of each speed run")
    ap.add_argument("--out", default="", help="output folder (default runs/precision-bench-<time>)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    args = ap.parse_args()
    if not os.access(base.TRAIN, os.X_OK):
        sys.exit(f"{base.TRAIN} not found: run `bazel build //launcher:all //plugins/...` first")
    only = [v for v in args.only.split(",") if v]
    unknown = [v for v in only if v not in dict(VARIANTS)]
    if unknown:
        sys.exit(f"--only: unknown variant(s) {', '.join(unknown)}; known: "
                 + ", ".join(n for n, _ in VARIANTS))
    variants = []
    for name, config in VARIANTS:
        if only and name not in only:
            continue
        if not os.path.exists(os.path.join(ROOT, config)):
            print(f"precision_bench: skipping {name}: {config} does not exist")
            continue
        variants.append((name, config))
    if not variants:
        sys.exit("precision_bench: nothing to run")
    out = args.out or os.path.join(ROOT, "runs", time.strftime("precision-bench-%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)

    plan = [(n, c, args.steps, "quality") for n, c in variants]
    for r in range(args.speed_rounds):
        k = (r + 1) % len(variants)  # rotate: round r starts with variant r+1
        plan += [(n, c, args.speed_steps, f"speed{r}") for n, c in variants[k:] + variants[:k]]
    results = []
    with open(os.path.join(out, "results.jsonl"), "w") as log:
        for i, (name, config, steps, kind) in enumerate(plan):
            tag = f"{i:02d}-{name}-{kind}"
            res, _ = base.run(name, os.path.join(ROOT, config), steps, out, tag, args.timeout)
            res["kind"], res["config"], res["folder"] = kind, config, os.path.join(out, tag)
            if "error" not in res:
                res.update(fp16_fields(res["folder"]))
                if "precision" in res and "tensors_8bit" not in res and res.get("parameters"):
                    # Mixed precision: AdamW's two f32 moments plus the f32 master weights it
                    # steps (the model holds the half-precision copy): 12 B/param, counted so.
                    res["state_bytes"] = 12 * res["parameters"]
                    res["state_bytes_per_param"] = 12.0
                peaks = state_peaks(res["folder"])
                if peaks:
                    res["model_state_peaks_mib"] = peaks
            print(json.dumps(res), flush=True)
            log.write(json.dumps(res) + "\n")
            results.append(res)

    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"precision_bench: {r['run']} ({r['kind']}) failed: {r['error']}")
    quality = {r["run"]: r for r in results if r["kind"] == "quality" and "error" not in r}
    names = [n for n, _ in variants if n in quality]
    if not names:
        sys.exit(1)
    ref = quality.get("f32")

    def vs_f32(name, key):
        v = quality[name][key]
        if ref is None or name == "f32":
            return f"{v:.4f}"
        return f"{v:.4f} ({100 * (v / ref[key] - 1):+.2f}%)"

    tps = {n: statistics.median(r["tokens_per_s"] for r in results
                                if r["run"] == n and "error" not in r) for n in names}
    runs_per = {n: sum(1 for r in results if r["run"] == n and "error" not in r) for n in names}
    kinds = []
    for n in names:
        for k in quality[n].get("model_state_peaks_mib", {}):
            if k not in kinds:
                kinds.append(k)
    rows = [("", *names)]
    rows.append((f"final loss (step {args.steps})", *[vs_f32(n, "final_loss") for n in names]))
    rows.append(("mean loss, last 50 steps", *[vs_f32(n, "mean_loss_last50") for n in names]))
    rows.append(("tokens/s (median)", *[
        f"{tps[n]:.0f} of {runs_per[n]}" + ("" if ref is None or n == "f32"
                                             else f" ({100 * (tps[n] / tps['f32'] - 1):+.1f}%)")
        for n in names]))
    rows.append(("peak tensor memory", *[f"{quality[n]['peak_tensor_mib']:.1f} MiB" for n in names]))
    rows.append(("peak RSS", *[f"{quality[n]['peak_rss_mib']:.1f} MiB" for n in names]))
    rows.append(("optimizer state", *[
        f"{quality[n]['state_bytes'] / base.MIB:.2f} MiB ({quality[n]['state_bytes_per_param']:.3f} B/param)"
        if quality[n].get("state_bytes") else "?" for n in names]))
    for k in kinds:
        rows.append((f"peak {k}", *[f"{quality[n]['model_state_peaks_mib'][k]:.2f} MiB"
                                    if k in quality[n].get("model_state_peaks_mib", {}) else "-"
                                    for n in names]))
    rows.append(("loss scale at the end / skipped steps", *[
        f"{quality[n]['final_loss_scale']:g} / {quality[n].get('skipped_steps', '?')}"
        if "final_loss_scale" in quality[n] else "-" for n in names]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    print(f"gpt-mini on Moby Dick, {args.steps} steps, 1 process, 1 thread; results in {out}")
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    if not kinds:
        print("(no peaks by kind: the strategy's summary has no \"model state per rank\" line)")
    if ref is not None:
        for n in names:
            if n != "f32":
                d = quality[n]["final_loss"] / ref["final_loss"] - 1
                print(f"{n}: final loss {100 * d:+.2f}% from f32's (goal: within 1%: "
                      f"{'yes' if abs(d) <= 0.01 else 'no'})")
    curves = [(n, os.path.join(quality[n]["folder"], "metrics.jsonl")) for n in names]
    for f in plot(out, curves):
        print(f"loss curves: {f}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
