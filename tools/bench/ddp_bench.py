#!/usr/bin/env python3
"""gpt-mini DDP on 2 ranks (1 thread each) vs 1 rank: Braid (through //launcher, Gloo) and
PyTorch 1.13 DDP over Gloo, alternated in the same run so that machine noise hits all alike.

  bazel build //launcher:all && /usr/bin/python3 tools/bench/ddp_bench.py --rounds 3

Prints one JSON object per run and a summary: median tokens/s of each, Braid's scaling efficiency
(2-rank tokens/s / (2 x 1-rank tokens/s)), its exposed-communication share, and the ratio to
PyTorch's 2-rank tokens/s.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV1 = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", BRAID_NUM_THREADS="1",
            BRAID_DATA_DIR=os.path.join(ROOT, "data"))


def braid(nproc, steps, tmp, tag):
    out = os.path.join(tmp, tag)
    cfg = os.path.join(ROOT, "launcher/configs/gpt-mini-ddp.pbtxt" if nproc > 1
                       else "launcher/configs/gpt-mini.pbtxt")
    cmd = [os.path.join(ROOT, "bazel-bin/launcher/launcher"), f"--nproc_per_node={nproc}",
           f"--log_dir={out}-workers", "--", f"--config={cfg}", f"--steps={steps}",
           f"--log_dir={out}"]
    r = subprocess.run(cmd, env=ENV1, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"braid failed: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    steps_ = [x for x in recs if "step" in x]
    s = [x for x in recs if x.get("summary")][0]
    warm = steps_[min(5, len(steps_) // 5):]
    step_s = sum(x["step_s"] for x in warm)
    exposed = sum(x["comm_exposed_s"] for x in warm)
    return {"tokens_per_s": s["median_tokens_per_s"], "final_loss": s["final_loss"],
            "exposed_comm_share": round(exposed / step_s, 4)}


def torch(nproc, steps):
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "tools/bench/gpt_mini_torch.py"),
           f"--steps={steps}", "--threads=1", f"--world_size={nproc}", "--quiet"]
    r = subprocess.run(cmd, env=ENV1, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"torch failed: {r.stderr[-2000:]}")
    s = json.loads(r.stdout.strip().splitlines()[-1])
    return {"tokens_per_s": s["tokens_per_s"], "final_loss": s["final_loss"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    res = {"braid1": [], "braid2": [], "torch1": [], "torch2": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            row = {"braid2": braid(2, a.steps, tmp, f"b2-{r}"), "torch2": torch(2, a.steps),
                   "braid1": braid(1, a.steps, tmp, f"b1-{r}"), "torch1": torch(1, a.steps)}
            for k, v in row.items():
                res[k].append(v)
            print(json.dumps({"round": r, **row}), flush=True)
    med = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in res.items()}
    print(json.dumps({
        "summary": True, "rounds": a.rounds, "steps": a.steps,
        "braid_1rank_tokens_per_s": med["braid1"], "braid_2rank_tokens_per_s": med["braid2"],
        "torch_1rank_tokens_per_s": med["torch1"], "torch_2rank_tokens_per_s": med["torch2"],
        "braid_scaling_efficiency": round(med["braid2"] / (2 * med["braid1"]), 3),
        "torch_scaling_efficiency": round(med["torch2"] / (2 * med["torch1"]), 3),
        "braid_exposed_comm_share": statistics.median(x["exposed_comm_share"] for x in res["braid2"]),
        "braid_vs_torch_2rank": round(med["braid2"] / med["torch2"], 3)}), flush=True)


if __name__ == "__main__":
    main()
