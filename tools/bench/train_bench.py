#!/usr/bin/env python3
"""gpt-mini training throughput and memory: Braid vs PyTorch 1.13, in the same run.

The two are run alternately (Braid, PyTorch, Braid, PyTorch, ...) for each thread count, so
that machine noise hits both alike; the figure quoted is the median over rounds of each run's
steady-state median tokens/s, and the ratio of those medians.

  bazel build //launcher:train && /usr/bin/python3 tools/bench/train_bench.py --rounds 3

Prints one JSON object per run and a summary object per thread count.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_braid(threads, steps, tmp):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               BRAID_NUM_THREADS=str(threads), BRAID_DATA_DIR=os.path.join(ROOT, "data"))
    out = os.path.join(tmp, f"braid-{threads}")
    cmd = [os.path.join(ROOT, "bazel-bin/launcher/train"), f"--steps={steps}",
           f"--threads={threads}", f"--log_dir={out}"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"braid failed: {r.stderr}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    s = [x for x in recs if x.get("summary")][0]
    # Tensor memory is the allocator's peak; RSS is the whole process, like PyTorch's figure.
    return {"tokens_per_s": s["median_tokens_per_s"], "final_loss": s["final_loss"],
            "peak_tensor_mib": round(s["peak_bytes"] / 2**20, 1),
            "peak_rss_mib": round(s["peak_rss_bytes"] / 2**20, 1)}


def run_torch(threads, steps, script="gpt_mini_torch.py"):
    """One run of a PyTorch twin (tools/bench/<script>) on `threads` threads: its summary."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "tools/bench", script),
           f"--steps={steps}", f"--threads={threads}", "--quiet"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the PyTorch twin {script} failed: {r.stderr}")
    s = json.loads(r.stdout.strip().splitlines()[-1])
    return {"tokens_per_s": s["tokens_per_s"], "final_loss": s["final_loss"],
            "peak_rss_mib": s["peak_rss_mib"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", default="1,2")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for threads in [int(t) for t in a.threads.split(",")]:
            braid, torch = [], []
            for r in range(a.rounds):
                b = run_braid(threads, a.steps, tmp)
                t = run_torch(threads, a.steps)
                braid.append(b)
                torch.append(t)
                print(json.dumps({"round": r, "threads": threads, "braid": b, "torch": t}), flush=True)
            mb = statistics.median(x["tokens_per_s"] for x in braid)
            mt = statistics.median(x["tokens_per_s"] for x in torch)
            print(json.dumps({"summary": True, "threads": threads, "steps": a.steps,
                              "rounds": a.rounds, "braid_tokens_per_s": mb,
                              "torch_tokens_per_s": mt, "ratio": round(mb / mt, 3),
                              "braid_peak_tensor_mib": braid[-1]["peak_tensor_mib"],
                              "braid_peak_rss_mib": braid[-1]["peak_rss_mib"],
                              "torch_peak_rss_mib": torch[-1]["peak_rss_mib"]}), flush=True)


if __name__ == "__main__":
    main()
