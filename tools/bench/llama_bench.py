#!/usr/bin/env python3
"""llama-mini beside gpt-mini (about the same parameter count): training throughput, one process.

The two are run alternately (gpt-mini, llama-mini, gpt-mini, ...) through the training program
with their shipped configs (launcher/configs/gpt-mini.pbtxt, llama-mini.pbtxt: micro-batch 16 x
context 128, AdamW), so that machine noise hits both alike; the figure quoted is the median over
rounds of each run's steady-state median tokens/s, and the ratio of those medians.

  bazel build //launcher:train && /usr/bin/python3 tools/bench/llama_bench.py --rounds 3

Prints one JSON object per run and a summary object.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(model, threads, steps, tmp, i):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               BRAID_DATA_DIR=os.path.join(ROOT, "data"))
    out = os.path.join(tmp, f"{model}-{i}")
    cmd = [os.path.join(ROOT, "bazel-bin/launcher/train"),
           f"--config={os.path.join(ROOT, 'launcher/configs', model + '.pbtxt')}",
           f"--steps={steps}", f"--threads={threads}", f"--log_dir={out}"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{model} failed: {r.stderr}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    s = [x for x in recs if x.get("summary")][0]
    return {"model": model, "tokens_per_s": s["median_tokens_per_s"],
            "final_loss": s["final_loss"], "peak_tensor_mib": round(s["peak_bytes"] / 2**20, 1)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    got = {"gpt-mini": [], "llama-mini": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            for model in got:
                r = run(model, a.threads, a.steps, tmp, i)
                print(json.dumps(dict(r, round=i, threads=a.threads)), flush=True)
                got[model].append(r["tokens_per_s"])
    g, l = statistics.median(got["gpt-mini"]), statistics.median(got["llama-mini"])
    print(json.dumps({"summary": True, "threads": a.threads, "gpt_mini_tokens_per_s": g,
                      "llama_mini_tokens_per_s": l, "llama_over_gpt": round(l / g, 3)}))


if __name__ == "__main__":
    main()
