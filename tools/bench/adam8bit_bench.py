#!/usr/bin/env python3
"""8-bit AdamW (the Adam8bit plugin, plugins/adam8bit) against core's 32-bit AdamW on the reference
run: gpt-mini on Moby Dick, one process, one thread, launcher/configs/gpt-mini.pbtxt and
launcher/configs/gpt-mini-adam8bit.pbtxt (identical but for optimizer.type).

  bazel build //launcher:all //plugins/... && /usr/bin/python3 tools/bench/adam8bit_bench.py

Quality: one run of --steps steps (default 500) per optimizer. Runs are deterministic (same seed,
same batches), so one run each is the comparison: the final step's loss, the mean loss over the
last 50 steps (less noisy than one batch), and the mean |loss difference| to AdamW over the first
30 steps. What a difference means needs a yardstick, because this run is chaotic: when gpt-mini
leaves its early plateau (around steps 40-150) depends on tiny changes, and the loss at step 500
moves by a few percent with it. So AdamW also runs with its learning rate times each --band factor
(default 1.05), a change nobody would call a different optimizer; Adam8bit's differences are to be
read against that run's.

Speed and memory: the training program's own figures from metrics.jsonl (median tokens/s over the
steady steps, mean optimizer seconds per step, the allocator's peak tensor memory during training,
the process's peak RSS). Throughput is noisy on a shared VM, so --speed_rounds extra pairs of
--speed_steps-step runs of AdamW and Adam8bit follow, alternating which goes first; tokens/s is the
median over every run of an optimizer at its configured learning rate.

Optimizer state bytes: Adam8bit's from its own report (the "braid: Adam8bit: optimizer state N
bytes" line it prints at its first step, counted from the tensors it holds); AdamW's is two f32
moments per parameter, 8 bytes x the parameter count the program prints.

With --stable, both optimizers also train gpt-mini with model.stable_embedding (a LayerNorm after
the token embedding; Adam8bit then keeps the token embedding's states in 32 bits). With --seeds
S1,S2,..., each seed (the model's initialisation and the data sampler's) adds a pair of quality
runs, and the mean over seeds of Adam8bit's difference to AdamW is printed with its spread: one
seed cannot resolve 1% on a run this chaotic.

One JSON object per run on stdout, then a table. The defaults take about 11 minutes on 2 cores.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "bazel-bin/launcher/train")
ENV1 = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", BRAID_NUM_THREADS="1",
            BRAID_DATA_DIR=os.path.join(ROOT, "data"))
CONFIGS = {"AdamW": "launcher/configs/gpt-mini.pbtxt",
           "Adam8bit": "launcher/configs/gpt-mini-adam8bit.pbtxt"}
MIB = 2 ** 20

PARAMS_RE = re.compile(r"braid: training \S+ \((\d+) parameters\)")
STATE_RE = re.compile(r"braid: Adam8bit: optimizer state (\d+) bytes .* \(([\d.]+) B/param; "
                      r"8-bit states for (\d+) tensors, 32-bit for (\d+)[;)]")


def variant_config(optimizer, tmp, factor=1.0, stable=False, seed=None):
    """`optimizer`'s shipped config with its learning rate times `factor`, with
    model.stable_embedding, and/or with `seed` as both the init and the data seed."""
    text = open(os.path.join(ROOT, CONFIGS[optimizer])).read()
    tag = optimizer.lower()
    if factor != 1.0:
        text, k = re.subn(r"lr: ([0-9.e-]+)", lambda m: f"lr: {float(m.group(1)) * factor:g}", text)
        assert k == 1, "lr not found in " + CONFIGS[optimizer]
        tag += f"-lr-x{factor:g}"
    if stable:
        text, k = re.subn(r'model \{ name: "gpt-mini" \}',
                          'model { name: "gpt-mini" stable_embedding: true }', text)
        assert k == 1, "model section not found in " + CONFIGS[optimizer]
        tag += "-stable"
    if seed is not None:
        text, k = re.subn(r"seed: \d+", f"seed: {seed}", text)  # the data section's
        assert k == 1, "data seed not found in " + CONFIGS[optimizer]
        text += f"seed: {seed}\n"  # the model's initialisation
        tag += f"-seed{seed}"
    path = os.path.join(tmp, tag + ".pbtxt")
    with open(path, "w") as f:
        f.write(text)
    return path


def band_config(factor, tmp):
    """The AdamW config with its learning rate times `factor`."""
    return variant_config("AdamW", tmp, factor=factor)


def run(name, config, steps, tmp, tag, timeout):
    """One run of the training program: its figures and per-step losses, or {"error": ...}."""
    out = os.path.join(tmp, tag)
    cmd = [TRAIN, f"--config={config}", f"--steps={steps}", f"--log_dir={out}"]
    t0 = time.time()
    res = {"run": name, "steps": steps}
    try:
        r = subprocess.run(cmd, env=ENV1, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(res, error=f"timed out after {timeout} s"), []
    res["wall_s"] = round(time.time() - t0, 1)
    if r.returncode != 0:
        return dict(res, error=f"exit {r.returncode}: {(r.stdout + r.stderr)[-600:]}"), []
    text = r.stdout + r.stderr
    m = PARAMS_RE.search(text)
    res["parameters"] = int(m.group(1)) if m else None
    m = STATE_RE.search(text)
    if m:
        res["state_bytes"] = int(m.group(1))
        res["tensors_8bit"], res["tensors_32bit"] = int(m.group(3)), int(m.group(4))
    elif res["parameters"]:
        res["state_bytes"] = 8 * res["parameters"]  # AdamW: exp_avg + exp_avg_sq, f32 each
    if res.get("state_bytes") and res["parameters"]:
        res["state_bytes_per_param"] = round(res["state_bytes"] / res["parameters"], 4)
    records = []
    metrics = os.path.join(out, "metrics.jsonl")
    for n, line in enumerate(open(metrics), start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            return dict(res, error=f"{metrics}:{n}: not JSON ({e.msg} at column {e.colno}): "
                                   f"{line.strip()[:300]}"), []
    step_recs = [x for x in records if "step" in x and "summary" not in x]
    summary = [x for x in records if x.get("summary")][-1]
    losses = [x["loss"] for x in step_recs]
    res["final_loss"] = summary["final_loss"]
    res["mean_loss_last50"] = round(statistics.fmean(losses[-50:]), 6)
    res["tokens_per_s"] = summary["median_tokens_per_s"]
    res["optimizer_ms_per_step"] = round(
        1e3 * statistics.fmean(x["optimizer_s"] for x in step_recs), 2)
    res["peak_tensor_mib"] = round(summary["peak_bytes"] / MIB, 1)
    res["peak_rss_mib"] = round(summary["peak_rss_bytes"] / MIB, 1)
    return res, losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500, help="steps of the quality runs")
    ap.add_argument("--band", default="1.05",
                    help="comma-separated learning-rate factors of extra AdamW quality runs")
    ap.add_argument("--speed_rounds", type=int, default=1,
                    help="extra alternating pairs for tokens/s")
    ap.add_argument("--speed_steps", type=int, default=60, help="steps of each extra speed run")
    ap.add_argument("--stable", action="store_true",
                    help="also run both optimizers with model.stable_embedding (a LayerNorm after "
                         "the token embedding; Adam8bit keeps wte's states in 32 bits)")
    ap.add_argument("--seeds", default="",
                    help="comma-separated extra seeds (init and data): a pair of quality runs "
                         "each, for the mean over seeds of Adam8bit's difference to AdamW")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    args = ap.parse_args()
    if not os.access(TRAIN, os.X_OK):
        sys.exit(f"{TRAIN} not found: run `bazel build //launcher:all //plugins/...` first")
    factors = [float(f) for f in args.band.split(",") if f]

    results, losses = [], {}
    with tempfile.TemporaryDirectory(prefix="adam8bit_bench_") as tmp:
        plan = [("AdamW", CONFIGS["AdamW"], args.steps, "quality"),
                ("Adam8bit", CONFIGS["Adam8bit"], args.steps, "quality")]
        plan += [(f"AdamW lr x{f:g}", band_config(f, tmp), args.steps, "band") for f in factors]
        if args.stable:
            plan += [(f"{o} +stable", variant_config(o, tmp, stable=True), args.steps, "quality")
                     for o in CONFIGS]
        seeds = [int(x) for x in args.seeds.split(",") if x]
        for sd in seeds:
            plan += [(f"{o} seed {sd}", variant_config(o, tmp, seed=sd), args.steps, "seed")
                     for o in CONFIGS]
        for r in range(args.speed_rounds):
            pair = ["AdamW", "Adam8bit"] if r % 2 else ["Adam8bit", "AdamW"]
            plan += [(o, CONFIGS[o], args.speed_steps, f"speed{r}") for o in pair]
        for i, (name, config, steps, kind) in enumerate(plan):
            res, curve = run(name, os.path.join(ROOT, config), steps, tmp, f"{i}", args.timeout)
            res["kind"] = kind
            print(json.dumps(res), flush=True)
            results.append(res)
            if not kind.startswith("speed"):
                losses[name] = curve
        # The runs with the shipped configs' seed (1234) are one seed of the seed study.
        pairs = [("AdamW", "Adam8bit", "seed 1234")]
        pairs += [(f"AdamW seed {sd}", f"Adam8bit seed {sd}", f"seed {sd}") for sd in seeds]

    failed = [r for r in results if "error" in r]
    if failed:
        sys.exit(f"{len(failed)} run(s) failed; the first: {failed[0]['error']}")
    quality = {r["run"]: r for r in results if r["kind"] in ("quality", "band", "seed")}
    names = ["AdamW", "Adam8bit"] + [f"AdamW lr x{f:g}" for f in factors]
    if args.stable:
        names += ["AdamW +stable", "Adam8bit +stable"]
    a = quality["AdamW"]
    tps = {o: statistics.median(r["tokens_per_s"] for r in results if r["run"] == o)
           for o in CONFIGS}

    def vs_adamw(name, key):
        return f"{quality[name][key]:.4f} ({100 * (quality[name][key] / a[key] - 1):+.2f}%)"

    def early(name, n=30):  # mean |loss - AdamW's| / AdamW's over the first n steps
        pairs = zip(losses[name][:n], losses["AdamW"][:n])
        return statistics.fmean(abs(x / y - 1) for x, y in pairs)

    rows = [("", *names)]
    rows.append((f"final loss (step {args.steps})", *[vs_adamw(n, "final_loss") for n in names]))
    rows.append(("mean loss, last 50 steps", *[vs_adamw(n, "mean_loss_last50") for n in names]))
    rows.append(("mean |loss - AdamW's|, steps 1-30", *[f"{100 * early(n):.3f}%" for n in names]))
    rows.append(("optimizer state", *[f"{quality[n]['state_bytes'] / MIB:.2f} MiB "
                                      f"({quality[n]['state_bytes_per_param']:.3f} B/param)"
                                      for n in names]))
    rows.append(("peak tensor memory",
                 *[f"{quality[n]['peak_tensor_mib']:.1f} MiB" for n in names]))
    rows.append(("peak RSS", *[f"{quality[n]['peak_rss_mib']:.1f} MiB" for n in names]))
    rows.append((f"tokens/s (median of {1 + args.speed_rounds} runs)", f"{tps['AdamW']:.0f}",
                 f"{tps['Adam8bit']:.0f} ({100 * (tps['Adam8bit'] / tps['AdamW'] - 1):+.1f}%)",
                 *["" for _ in names[2:]]))
    rows.append(("optimizer time per step", *[f"{quality[n]['optimizer_ms_per_step']:.1f} ms"
                                              for n in names]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    print(f"gpt-mini on Moby Dick, {a['parameters']} parameters, {args.steps} steps, 1 thread")
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    b = quality["Adam8bit"]
    d8 = b["final_loss"] / a["final_loss"] - 1
    print(f"\nAdam8bit's final loss is {100 * d8:+.2f}% from AdamW's (goal: within 1%: "
          f"{'yes' if abs(d8) <= 0.01 else 'no'})", end="")
    for f in factors:
        d = quality[f"AdamW lr x{f:g}"]["final_loss"] / a["final_loss"] - 1
        print(f"; AdamW with lr x{f:g} is {100 * d:+.2f}% from it", end="")
    print()
    if args.stable:
        # With the stable embedding each optimizer trains a different model: compare the pair.
        sa, sb = quality["AdamW +stable"], quality["Adam8bit +stable"]
        print(f"with stable_embedding: Adam8bit {100 * (sb['final_loss'] / sa['final_loss'] - 1):+.2f}% "
              f"(final), {100 * (sb['mean_loss_last50'] / sa['mean_loss_last50'] - 1):+.2f}% "
              f"(last 50) from AdamW with stable_embedding; Adam8bit state "
              f"{sb['state_bytes_per_param']:.3f} B/param")
    if len(pairs) > 1:
        # Several seeds (initialisation and batches): the seed-to-seed spread of AdamW itself is
        # the yardstick, and the mean difference over seeds the fairer statistic.
        print(f"\nseeds (init and data), {args.steps} steps: Adam8bit vs AdamW")
        diffs = {"final_loss": [], "mean_loss_last50": []}
        for a_name, b_name, label in pairs:
            qa, qb = quality[a_name], quality[b_name]
            line = [label]
            for key in diffs:
                d = qb[key] / qa[key] - 1
                diffs[key].append(d)
                line.append(f"{key} AdamW {qa[key]:.4f} Adam8bit {qb[key]:.4f} ({100 * d:+.2f}%)")
            print("  " + "; ".join(line))
        for key, ds in diffs.items():
            ma = statistics.fmean(quality[a][key] for a, _, _ in pairs)
            mb = statistics.fmean(quality[b][key] for _, b, _ in pairs)
            spread = [quality[a][key] for a, _, _ in pairs]
            print(f"  {key}: mean over {len(pairs)} seeds AdamW {ma:.4f}, Adam8bit {mb:.4f} "
                  f"({100 * (mb / ma - 1):+.2f}%); per-seed differences mean "
                  f"{100 * statistics.fmean(ds):+.2f}%, sd {100 * statistics.stdev(ds):.2f}%; "
                  f"AdamW's own range over seeds {min(spread):.4f}-{max(spread):.4f}")


if __name__ == "__main__":
    main()
