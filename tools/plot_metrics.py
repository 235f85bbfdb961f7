#!/usr/bin/env python3
"""Draws training runs' metrics files (the trainer's metrics.jsonl) as curves, to PNG or SVG.

Each metrics file holds one JSON object per step ({"step": 0, "loss": 5.54, ...}); the trainer's
last line, {"summary": true, ...}, is skipped. A run with an eval section also has validation
lines ({"step": 99, "val_loss": 2.1, "val_ppl": 8.2}, after the step they follow): the default
plot (--y loss) draws each file's validation loss beside its training loss, dashed with markers in
the same colour; --y val_loss or val_ppl draws them alone. One curve per file, labelled by --label
(one per file, in order) or by the file's folder name (runs/<run>/metrics.jsonl -> <run>).

Examples:
  tools/plot_metrics.py runs/a/metrics.jsonl runs/b/metrics.jsonl -o loss.png
  tools/plot_metrics.py runs/*/metrics.jsonl --y tokens_per_s --smooth 20 -o speed.svg
  tools/plot_metrics.py f32/metrics.jsonl fp16/metrics.jsonl --label f32 --label fp16 --logy -o l.png

Needs matplotlib (Debian: python3-matplotlib; tools/setup.sh installs it).
"""
import argparse
import json
import math
import os
import sys


class MetricsError(Exception):
    """A problem with an input file; the message names the file (and line)."""


EVAL_FIELDS = ("val_loss", "val_ppl")  # the fields of a validation line (the eval section)


def read_metrics(path, y, required=True):
    """Returns (steps, values) of field `y` from one metrics file, in file order.

    A validation line (it has "val_loss") is read for the validation fields and skipped for the
    others, and a step line for the others only. With required=False, a file without any line
    holding `y` gives two empty lists instead of an error."""
    steps, values = [], []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise MetricsError(f"{path}: cannot read it: {e.strerror}")
    with f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise MetricsError(f"{path}:{n}: not a JSON object ({e.msg} at column {e.colno}); "
                                   "each line of a metrics file is one JSON object")
            if not isinstance(row, dict):
                raise MetricsError(f"{path}:{n}: a JSON {type(row).__name__}, not an object; "
                                   "each line of a metrics file is one JSON object")
            if row.get("summary"):
                continue  # the trainer's summary line, not a step
            if "step" not in row:
                raise MetricsError(f'{path}:{n}: no "step" field (a step line has "step", "loss", ...)')
            if ("val_loss" in row) != (y in EVAL_FIELDS):
                continue  # a validation line when plotting a step field, or the other way round
            if y not in row:
                known = ", ".join(k for k in row if k != "step")
                raise MetricsError(f'{path}:{n}: no field "{y}" to plot (this line has: {known}); '
                                   "choose one with --y")
            v = row[y]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise MetricsError(f'{path}:{n}: field "{y}" is {json.dumps(v)}, not a number')
            s = row["step"]
            if isinstance(s, bool) or not isinstance(s, (int, float)):
                raise MetricsError(f'{path}:{n}: field "step" is {json.dumps(s)}, not a number')
            steps.append(s)
            values.append(float(v))
    if not steps and required:
        if y in EVAL_FIELDS:
            raise MetricsError(f"{path}: no validation lines (the run had no eval section)")
        raise MetricsError(f"{path}: no step lines (an empty file, or only the summary)")
    return steps, values


def moving_average(values, n):
    """Trailing mean over the last n values (fewer at the start), so curves keep their length."""
    out, total, window = [], 0.0, []
    for v in values:
        window.append(v)
        total += v
        if len(window) > n:
            total -= window.pop(0)
        out.append(total / len(window))
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="plot_metrics.py",
        description="Draw runs' metrics files (metrics.jsonl: one JSON object per step, the "
                    "last line a summary that is skipped) as one curve per file, to PNG or SVG.",
        epilog="Example: tools/plot_metrics.py runs/a/metrics.jsonl runs/b/metrics.jsonl "
               "--smooth 10 -o loss.png")
    p.add_argument("files", nargs="+", metavar="METRICS_JSONL",
                   help="metrics files, one curve each")
    p.add_argument("-o", "--output", required=True,
                   help="the figure to write; its extension picks the format: .png or .svg")
    p.add_argument("--label", action="append", default=[],
                   help="a curve's legend label; give one per file, in order "
                        "(default: each file's folder name)")
    p.add_argument("--y", default="loss",
                   help="the per-step field to plot (default: loss, with the validation loss "
                        "where the run has one; e.g. tokens_per_s, grad_norm, loss_scale, "
                        "val_loss, val_ppl)")
    p.add_argument("--smooth", type=int, default=1, metavar="N",
                   help="draw the trailing mean of the last N steps (default: 1, no smoothing)")
    p.add_argument("--logy", action="store_true", help="logarithmic y axis")
    p.add_argument("--title", default=None, help="the figure's title (default: none)")
    args = p.parse_args(argv)
    ext = os.path.splitext(args.output)[1].lower()
    if ext not in (".png", ".svg"):
        p.error(f"--output {args.output}: the extension must be .png or .svg (it picks the format)")
    if args.label and len(args.label) != len(args.files):
        p.error(f"{len(args.label)} --label for {len(args.files)} files: give one per file, or none")
    if args.smooth < 1:
        p.error(f"--smooth {args.smooth}: must be >= 1")
    return args


def default_label(path):
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return folder or path


def main(argv):
    args = parse_args(argv)
    try:
        curves = [read_metrics(f, args.y) for f in args.files]
        # Beside the training loss, each run's validation loss (none: empty).
        val = [read_metrics(f, "val_loss", required=False) if args.y == "loss" else ([], [])
               for f in args.files]
    except MetricsError as e:
        print(f"plot_metrics.py: {e}", file=sys.stderr)
        return 1
    if args.logy:
        for f, (_, values) in zip(args.files, curves):
            bad = [v for v in values if not (v > 0 and math.isfinite(v))]
            if bad:
                print(f"plot_metrics.py: {f}: --logy needs positive values of {args.y}, "
                      f"found {bad[0]}", file=sys.stderr)
                return 1
    try:
        import matplotlib
    except ImportError:
        print(f"plot_metrics.py: needs matplotlib, which {sys.executable} cannot import "
              "(Debian: tools/setup.sh installs python3-matplotlib for /usr/bin/python3)",
              file=sys.stderr)
        return 1
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    labels = args.label or [default_label(f) for f in args.files]
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (label, (steps, values)) in enumerate(zip(labels, curves)):
        ys = moving_average(values, args.smooth) if args.smooth > 1 else values
        # gid: in an SVG each curve is the group <g id="curve_<i>">, in file order, so the
        # curves can be found (and restyled) in the file.
        line, = ax.plot(steps, ys, label=label, linewidth=1.2, gid=f"curve_{i}")
        vsteps, vvalues = val[i]
        if vsteps:  # not smoothed: a few points, each an average over fixed batches already
            ax.plot(vsteps, vvalues, label=f"{label} (validation)", linestyle="--", marker="o",
                    markersize=3, color=line.get_color(), linewidth=1.2, gid=f"val_curve_{i}")
    ax.set_xlabel("step")
    ax.set_ylabel(args.y + (f" (mean of last {args.smooth} steps)" if args.smooth > 1 else ""))
    if args.logy:
        ax.set_yscale("log")
    if args.title:
        ax.set_title(args.title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(args.output)
    except OSError as e:
        print(f"plot_metrics.py: {args.output}: cannot write it: {e.strerror}", file=sys.stderr)
        return 1
    n_val = sum(1 for vsteps, _ in val if vsteps)
    extra = f" and {n_val} of val_loss" if n_val else ""
    print(f"plot_metrics.py: wrote {args.output} ({len(curves)} curve(s) of {args.y}{extra})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
