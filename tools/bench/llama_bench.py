#!/usr/bin/env python3
"""llama-mini beside gpt-mini (about the same parameter count) and beside its PyTorch twin:
training throughput, one process.

The three are run alternately (gpt-mini, llama-mini, the twin, gpt-mini, ...): Braid's two through
the training program with their shipped configs (launcher/configs/gpt-mini.pbtxt,
llama-mini.pbtxt: micro-batch 16 x context 128, AdamW), the twin as tools/bench/llama_mini_torch.py
(the same shape, data stream and optimizer), so that machine noise hits all alike; the figure
quoted is the median over rounds of each run's steady-state median tokens/s, the ratios of those
medians, and the per-round ratios.

  bazel build //launcher:train && /usr/bin/python3 tools/bench/llama_bench.py --rounds 3

With --kernel_sum, each round also times every kernel of one training step alone
(tools/bench/llama_kernel_bench for llama-mini, gemm_bench's step_estimate for gpt-mini: no
autograd, allocation or bookkeeping) and reports each model's measured tokens/s as a share of that
limit, both measured in the same round (--no_torch leaves the twin out):

  bazel build //launcher:train //tools/bench:gemm_bench //tools/bench:llama_kernel_bench && \
    /usr/bin/python3 tools/bench/llama_bench.py --rounds 3 --steps 20 --kernel_sum --no_torch

With --clock cpu as well, both sides of the share are CPU time instead of elapsed time, which
the load of other jobs on a shared machine moves far less: the kernels are timed in the kernel
benches' CPU time (their --clock=cpu), and the trainer's step is the difference of the CPU time
(user + system, from the operating system's accounting of the finished child) of a run of
--steps + 2 steps and one of 2 steps, divided by --steps (start-up and the first two steps cancel
out); its tokens/s is reported as cpu_tokens_per_s:

  /usr/bin/python3 tools/bench/llama_bench.py --rounds 3 --steps 20 --kernel_sum --no_torch \
    --clock cpu

Prints one JSON object per run and a summary object.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bench  # noqa: E402  (run_torch: one run of a PyTorch twin)


def kernel_limit(bin_dir, model, threads, clock="wall"):
    """The step's kernel-sum limit in tokens/s (medians of the kernels' timed runs), and the ms."""
    cmd = ([os.path.join(bin_dir, "tools/bench/llama_kernel_bench"), f"--threads={threads}"]
           if model == "llama-mini" else
           [os.path.join(bin_dir, "tools/bench/gemm_bench"), f"--threads={threads}"])
    cmd.append(f"--clock={clock}")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed: {r.stderr}")
    for line in r.stdout.splitlines():
        x = json.loads(line)
        if x.get("bench") in ("step_estimate", "llama_step_estimate") and x["of"] == "median":
            return x["tokens_per_s"], x["total_ms"]
    sys.exit(f"{cmd[0]} printed no step estimate")


def run(model, threads, steps, tmp, i, bin_dir):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               BRAID_DATA_DIR=os.path.join(ROOT, "data"))
    out = os.path.join(tmp, f"{model}-{i}")
    cmd = [os.path.join(bin_dir, "launcher/train"),
           f"--config={os.path.join(ROOT, 'launcher/configs', model + '.pbtxt')}",
           f"--steps={steps}", f"--threads={threads}", f"--log_dir={out}"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{model} failed: {r.stderr}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    s = [x for x in recs if x.get("summary")][0]
    return {"model": model, "tokens_per_s": s["median_tokens_per_s"],
            "final_loss": s["final_loss"], "peak_tensor_mib": round(s["peak_bytes"] / 2**20, 1)}


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_tokens_per_s(model, threads, steps, tmp, i, bin_dir):
    """Tokens per CPU-second of the trainer's steady steps: (CPU of steps + 2) - (CPU of 2)."""
    cpu = []
    for n in (2, steps + 2):
        before = children_cpu_s()
        run(model, threads, n, tmp, f"{i}-cpu{n}", bin_dir)
        cpu.append(children_cpu_s() - before)
    out = os.path.join(tmp, f"{model}-{i}-cpu{steps + 2}", "metrics.jsonl")
    rec = [x for x in map(json.loads, open(out)) if "step_s" in x and "tokens_per_s" in x][-1]
    tokens_per_step = round(rec["tokens_per_s"] * rec["step_s"])
    return round(tokens_per_step * steps / (cpu[1] - cpu[0]), 1)


def run_torch(threads, steps):
    return dict(train_bench.run_torch(threads, steps, "llama_mini_torch.py"), model="torch-llama-mini")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kernel_sum", action="store_true",
                   help="also each model's share of its step's kernel-sum limit, per round")
    p.add_argument("--no_torch", action="store_true", help="leave the PyTorch twin out")
    p.add_argument("--bin_dir", default=os.path.join(ROOT, "bazel-bin"),
                   help="where the built programs are")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="with --kernel_sum: compare elapsed time or CPU time (see above)")
    a = p.parse_args()
    got = {"gpt-mini": [], "llama-mini": [], "torch-llama-mini": []}
    if a.no_torch:
        del got["torch-llama-mini"]
    share = {"gpt-mini": [], "llama-mini": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            for model in got:
                r = (run_torch(a.threads, a.steps) if model.startswith("torch")
                     else run(model, a.threads, a.steps, tmp, i, a.bin_dir))
                if a.kernel_sum and model in share:
                    limit, ms = kernel_limit(a.bin_dir, model, a.threads, a.clock)
                    measured = r["tokens_per_s"]
                    if a.clock == "cpu":
                        measured = cpu_tokens_per_s(model, a.threads, a.steps, tmp, i, a.bin_dir)
                        r.update(cpu_tokens_per_s=measured)
                    r.update(kernel_sum_tokens_per_s=limit, kernel_sum_ms=ms, clock=a.clock,
                             share_of_limit=round(measured / limit, 3))
                    share[model].append(r["share_of_limit"])
                print(json.dumps(dict(r, round=i, threads=a.threads)), flush=True)
                got[model].append(r["tokens_per_s"])
    g, l = statistics.median(got["gpt-mini"]), statistics.median(got["llama-mini"])
    if a.no_torch:
        summary = {"summary": True, "threads": a.threads, "gpt_mini_tokens_per_s": g,
                   "llama_mini_tokens_per_s": l, "llama_over_gpt": round(l / g, 3)}
        if a.kernel_sum:
            summary.update({f"{m.replace('-', '_')}_share_of_limit": statistics.median(v)
                            for m, v in share.items()},
                           per_round_share=share)
        print(json.dumps(summary))
        return
    t = statistics.median(got["torch-llama-mini"])
    print(json.dumps({"summary": True, "threads": a.threads, "gpt_mini_tokens_per_s": g,
                      "llama_mini_tokens_per_s": l, "torch_llama_mini_tokens_per_s": t,
                      "llama_over_gpt": round(l / g, 3), "llama_over_torch": round(l / t, 3),
                      "per_round_llama_over_gpt": [round(x / y, 3) for x, y in
                                                   zip(got["llama-mini"], got["gpt-mini"])],
                      "per_round_llama_over_torch": [round(x / y, 3) for x, y in
                                                     zip(got["llama-mini"], got["torch-llama-mini"])]}))


if __name__ == "__main__":
    main()
