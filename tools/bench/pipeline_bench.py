#!/usr/bin/env python3
"""gpt-mini with 2 pipeline stages on 2 ranks (1 thread each) beside Braid DDP on 2 ranks, both
through //launcher over Gloo, alternated in the same run so that machine noise hits all alike.

  bazel build //launcher:all && /usr/bin/python3 tools/bench/pipeline_bench.py --rounds 3

For m = 4, 8, 16 micro-batches per step (16 sequences per step in every run: micro-batch 16/m
for the pipeline, 8 per rank for DDP), 1F1B and GPipe: tokens/s, each stage's measured idle
share beside the formula (p-1)/(m+p-1), and each stage's peak activations (the device memory a
step holds above its start). Prints one JSON object per run and a summary table.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV1 = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
            BRAID_DATA_DIR=os.path.join(ROOT, "data"))
BASE = """model {{ name: "gpt-mini" }}
data {{ dataset: "moby-dick" sampler: "random" seed: 1234 }}
train_micro_batch_size_per_gpu: {micro}
gradient_accumulation_steps: {accum}
optimizer {{ type: "AdamW" params {{ lr: 1e-3 betas: [0.9, 0.95] eps: 1e-8 weight_decay: 0.1 }} }}
communicator: "gloo"
threads: 1
{strategy}
"""
SUMMARY = re.compile(r"braid: pipeline \(stage (\d) of 2, (\d+) micro-batch\(es\), (\w+)\): idle ([\d.]+)% "
                     r".*bubble formula ([\d.]+)%; peak activations held ([\d.]+) MiB")


def run(tmp, tag, cfg_text, steps):
    cfg = os.path.join(tmp, tag + ".pbtxt")
    with open(cfg, "w") as f:
        f.write(cfg_text)
    out = os.path.join(tmp, tag)
    cmd = [os.path.join(ROOT, "bazel-bin/launcher/launcher"), "--nproc_per_node=2",
           f"--log_dir={out}-workers", "--", f"--config={cfg}", f"--steps={steps}", f"--log_dir={out}"]
    r = subprocess.run(cmd, env=ENV1, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{tag} failed: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    s = [x for x in recs if x.get("summary")][0]
    res = {"run": tag, "tokens_per_s": s["median_tokens_per_s"]}
    logs = [os.path.join(out + "-workers", f"workerlog.{i}") for i in (0, 1)]
    for log in logs:
        for m in SUMMARY.finditer(open(log).read()):
            stage = m.group(1)
            res[f"idle_stage{stage}"] = float(m.group(4)) / 100
            res["bubble_formula"] = float(m.group(5)) / 100
            res[f"activations_mib_stage{stage}"] = float(m.group(6))
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    configs = {"ddp": BASE.format(micro=8, accum=1, strategy='strategy { name: "ddp" '
                                  'options { key: "bucket_cap_mb" value: "1" } }')}
    for m in (4, 8, 16):
        for sched in ("1f1b", "gpipe"):
            configs[f"pipe_{sched}_m{m}"] = BASE.format(
                micro=16 // m, accum=m,
                strategy=f'strategy {{ name: "pipeline" options {{ key: "stages" value: "2" }} '
                         f'options {{ key: "schedule" value: "{sched}" }} }}')
    results = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for tag, text in configs.items():
                res = run(tmp, f"{tag}-{r}", text, a.steps)
                results[tag].append(res)
                print(json.dumps({"round": r, **res}), flush=True)
    ddp = statistics.median(x["tokens_per_s"] for x in results["ddp"])
    rows = []
    for tag, runs in results.items():
        row = {"config": tag, "tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs)}
        row["vs_ddp"] = round(row["tokens_per_s"] / ddp, 3)
        for key in ("idle_stage0", "idle_stage1", "bubble_formula", "activations_mib_stage0",
                    "activations_mib_stage1"):
            vals = [x[key] for x in runs if key in x]
            if vals:
                row[key] = round(statistics.median(vals), 4)
        rows.append(row)
        print(json.dumps({"summary": True, **row}), flush=True)
    print(f"\n{'config':18} {'tok/s':>8} {'vs DDP':>7} {'idle s0':>8} {'idle s1':>8} {'formula':>8} "
          f"{'act s0 MiB':>10} {'act s1 MiB':>10}")
    for row in rows:
        f = lambda k, scale=1, fmt="{:.1f}": fmt.format(row[k] * scale) if k in row else "-"
        print(f"{row['config']:18} {row['tokens_per_s']:8.0f} {row['vs_ddp']:7.2f} "
              f"{f('idle_stage0', 100):>8} {f('idle_stage1', 100):>8} {f('bubble_formula', 100):>8} "
              f"{f('activations_mib_stage0'):>10} {f('activations_mib_stage1'):>10}")


if __name__ == "__main__":
    main()
