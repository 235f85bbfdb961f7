#!/usr/bin/env python3
"""Tensor parallelism (plugins/tensor_parallel) against DDP, gpt-mini on 2 ranks (1 thread each),
both through //launcher over Gloo, alternated in the same run so that machine noise hits both alike.

  bazel build //launcher:all //plugins/... && /usr/bin/python3 tools/bench/tp_bench.py

Runs, in each of --rounds rounds, launcher/configs/gpt-mini-tp.pbtxt (parallel { tensor: 2 }: the
2 ranks are one model replica reading the same 16 sequences, 2,048 tokens per step),
launcher/configs/gpt-mini-ddp.pbtxt (2 replicas of 16 sequences each, 4,096 tokens per step) and,
unless --no_single, launcher/configs/gpt-mini.pbtxt on one process (2,048 tokens per step: what
TP's speed-up is against), each for --steps steps; the order reverses from round to round. For
each: tokens/s of the job (median over rounds of each run's steady-state median), the ratios
TP / DDP and TP / one process, per-rank peak tensor memory (the allocator's peak) and process RSS,
parameters per rank, and the bytes all-reduced per step:
  - TP: the activations all-reduced forward and their gradients backward, as the strategy's summary
    line reports them for the last step, beside the formula (Megatron-LM, Shoeybi et al. 2019):
    per block 2 all-reduces of B*T*C floats forward (attention and MLP outputs) and 2 backward
    (their inputs' gradients); Braid's vocabulary-parallel embedding adds one B*T*C all-reduce
    forward and the tied head's input one B*T*C backward; the vocabulary-parallel cross-entropy
    adds 3*B*T floats forward (the max, then the sum and the target's logit packed in one).
  - DDP: the gradients reduced per step, from the per-step "comm_bytes" metric, beside 4 bytes per
    parameter.
Bytes are the size of the buffers all-reduced (what each call reduces), not the bytes on the wire.

One JSON object per run on stdout, then a summary object, then a table.
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "bazel-bin/launcher/launcher")
ENV1 = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", BRAID_NUM_THREADS="1",
            BRAID_DATA_DIR=os.path.join(ROOT, "data"))
MIB = 2 ** 20
CONFIGS = {"tp": "launcher/configs/gpt-mini-tp.pbtxt", "ddp": "launcher/configs/gpt-mini-ddp.pbtxt",
           "single": "launcher/configs/gpt-mini.pbtxt"}
NPROC = {"tp": 2, "tp_sp": 2, "ddp": 2, "single": 1}
# gpt-mini (docs/MODELS.md): micro-batch B, context T, width C, L blocks, float32.
GPT_MINI = dict(B=16, T=128, C=256, L=4, bytes_per_float=4)

PARAMS_RE = re.compile(r"braid: training (\S+) \((\d+) parameters")
TP_RE = re.compile(r"tensor parallel: (\d+) ranks(?: with sequence parallelism)?, plan (\S+): (\d+) of (\d+) parameters on this rank "
                   r"\((\d+) tensors split\); last step all-reduced ([\d.]+) MiB of activations forward, "
                   r"([\d.]+) MiB of their gradients backward")


def tp_formula(B, T, C, L, bytes_per_float):
    """Bytes all-reduced per step by Megatron-style TP with Braid's vocabulary-parallel ends."""
    btc = B * T * C * bytes_per_float
    forward = 2 * L * btc + btc + 3 * B * T * bytes_per_float  # blocks, embedding, cross-entropy
    backward = 2 * L * btc + btc  # blocks, tied head's input
    return {"forward_bytes": forward, "backward_bytes": backward,
            "forward_terms": f"2*{L}*B*T*C + B*T*C + 3*B*T floats",
            "backward_terms": f"2*{L}*B*T*C + B*T*C floats"}


def commit():
    """The checked-out commit, read from .git without running git."""
    try:
        head = open(os.path.join(ROOT, ".git/HEAD")).read().strip()
        if not head.startswith("ref: "):
            return head[:7]
        ref = head[5:]
        path = os.path.join(ROOT, ".git", ref)
        if os.path.exists(path):
            return open(path).read().strip()[:7]
        for line in open(os.path.join(ROOT, ".git/packed-refs")):
            if line.strip().endswith(" " + ref):
                return line.split()[0][:7]
    except OSError:
        pass
    return ""


def median(xs):
    return statistics.median(xs) if xs else None


def sequence_parallel_config(tmp):
    """gpt-mini-tp.pbtxt with parallel.sequence_parallel on (written once into tmp)."""
    path = os.path.join(tmp, "gpt-mini-tp-sp.pbtxt")
    if not os.path.exists(path):
        text = open(os.path.join(ROOT, CONFIGS["tp"])).read()
        assert "parallel { tensor: 2 }" in text, "gpt-mini-tp.pbtxt changed: update this benchmark"
        with open(path, "w") as f:
            f.write(text.replace("parallel { tensor: 2 }", "parallel { tensor: 2 sequence_parallel: true }"))
    return path


def run(kind, steps, tmp, tag, timeout=600):
    out = os.path.join(tmp, tag)
    n = NPROC[kind]
    config = CONFIGS[kind] if kind != "tp_sp" else sequence_parallel_config(tmp)
    cmd = [LAUNCHER, f"--nproc_per_node={n}", f"--log_dir={out}-workers", "--",
           f"--config={os.path.join(ROOT, config)}", f"--steps={steps}", f"--log_dir={out}"]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, env=ENV1, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"{tag} timed out after {timeout} s")
    if r.returncode != 0:
        sys.exit(f"{tag} failed (exit {r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
    res = {"wall_s": round(time.time() - t0, 1)}
    peak, rss, comm, fwd, bwd = [], [], [], [], []
    for rank, name in ((0, "metrics.jsonl"), (1, "metrics.jsonl.rank1"))[:n]:
        recs = [json.loads(l) for l in open(os.path.join(out, name))]
        s = [x for x in recs if x.get("summary")][0]
        peak.append(s["peak_bytes"])
        rss.append(s["peak_rss_bytes"])
        if rank == 0:
            steps_ = [x for x in recs if "step" in x]
            res["tokens_per_s"] = s["median_tokens_per_s"]
            res["final_loss"] = s["final_loss"]
            # The trainer's steady state leaves out the first min(steps/5, 5) steps; so do these.
            steady = steps_[min(len(steps_) // 5, 5):]
            comm = [x["comm_bytes"] for x in steady]
            fwd = [x["forward_s"] for x in steady]
            bwd = [x["backward_s"] for x in steady]
            res["median_step_s"] = round(median([x["step_s"] for x in steady]), 4)
    res["median_forward_s"] = round(median(fwd), 4)
    res["median_backward_s"] = round(median(bwd), 4)
    res["comm_bytes_per_step"] = int(median(comm))  # the strategy's own counter (DDP's gradients)
    res["peak_bytes_per_rank"] = peak
    res["peak_rss_bytes_per_rank"] = rss
    for rank, log in ((0, "train.log"), (1, "train.rank1.log"))[:n]:
        text = open(os.path.join(out, log)).read()
        m = PARAMS_RE.search(text)
        if m and rank == 0:
            res["params_on_rank"] = int(m.group(2))
        m = TP_RE.search(text)
        if m and rank == 0:
            res["params_on_rank"] = int(m.group(3))
            res["params_full"] = int(m.group(4))
            res["tensors_split"] = int(m.group(5))
            res["tp_forward_mib"] = float(m.group(6))
            res["tp_backward_mib"] = float(m.group(7))
    if kind in ("tp", "tp_sp") and "tp_forward_mib" not in res:
        sys.exit(f"{tag}: no 'tensor parallel:' summary line in {out}/train.log")
    return res


def emit(obj):
    print(json.dumps(obj), flush=True)


def main():
    p = argparse.ArgumentParser(description="Tensor parallelism against DDP, gpt-mini on 2 ranks "
                                "(see the file's docstring)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--no_sp", action="store_true",
                   help="leave out TP = 2 with sequence parallelism (parallel.sequence_parallel)")
    p.add_argument("--no_single", action="store_true",
                   help="leave out the one-process run (gpt-mini.pbtxt) that TP's speed-up is against")
    p.add_argument("--launcher", default=LAUNCHER,
                   help="the launcher binary (default bazel-bin/launcher/launcher; another output "
                   "root's, when built with --output_user_root)")
    a = p.parse_args()
    globals()["LAUNCHER"] = a.launcher
    if not os.access(LAUNCHER, os.X_OK):
        sys.exit(f"{LAUNCHER} not found: run `bazel build //launcher:all //plugins/...` first")
    emit({"bench": "tp_bench", "date": datetime.datetime.now().isoformat(timespec="seconds"),
          "commit": commit(), "args": vars(a), "cpus": os.cpu_count()})
    kinds = ["tp", "ddp"] + ([] if a.no_sp else ["tp_sp"]) + ([] if a.no_single else ["single"])
    res = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(a.rounds):
            order = kinds if rnd % 2 == 0 else kinds[::-1]
            for kind in order:
                load = round(os.getloadavg()[0], 2)  # other work on the machine shows here
                r = run(kind, a.steps, tmp, f"{kind}-{rnd}")
                res[kind].append(r)
                emit({"round": rnd, "run": kind, "world_size": NPROC[kind], "steps": a.steps, "load1_before": load, **r})

    f = tp_formula(**GPT_MINI)
    med = {k: median([x["tokens_per_s"] for x in v]) for k, v in res.items()}
    summary = {"summary": True, "rounds": a.rounds, "steps": a.steps,
               "tokens_per_step": {"tp": GPT_MINI["B"] * GPT_MINI["T"], "ddp": 2 * GPT_MINI["B"] * GPT_MINI["T"]},
               "median_tokens_per_s": med,
               "ratio_tp_to_ddp": round(med["tp"] / med["ddp"], 3),
               "per_round_ratio_tp_to_ddp": [round(t["tokens_per_s"] / d["tokens_per_s"], 3)
                                             for t, d in zip(res["tp"], res["ddp"])]}
    if "single" in res:
        summary["ratio_tp_to_single"] = round(med["tp"] / med["single"], 3)
        summary["per_round_ratio_tp_to_single"] = [round(t["tokens_per_s"] / o["tokens_per_s"], 3)
                                                   for t, o in zip(res["tp"], res["single"])]
    for k, v in res.items():
        summary[k] = {
            "median_step_s": median([x["median_step_s"] for x in v]),
            "median_forward_s": median([x["median_forward_s"] for x in v]),
            "median_backward_s": median([x["median_backward_s"] for x in v]),
            "params_on_rank": v[-1].get("params_on_rank"),
            "peak_tensor_mib_per_rank": [round(median([x["peak_bytes_per_rank"][i] for x in v]) / MIB, 1)
                                         for i in range(NPROC[k])],
            "peak_rss_mib_per_rank": [round(median([x["peak_rss_bytes_per_rank"][i] for x in v]) / MIB, 1)
                                      for i in range(NPROC[k])],
            "final_loss": v[-1]["final_loss"],
        }
    tp = res["tp"][-1]
    summary["tp"].update(
        params_full=tp["params_full"], tensors_split=tp["tensors_split"],
        allreduce_forward_mib=tp["tp_forward_mib"], allreduce_backward_mib=tp["tp_backward_mib"],
        formula_forward_mib=round(f["forward_bytes"] / MIB, 4),
        formula_backward_mib=round(f["backward_bytes"] / MIB, 4),
        formula_forward_bytes=f["forward_bytes"], formula_backward_bytes=f["backward_bytes"],
        formula=f"forward {f['forward_terms']}, backward {f['backward_terms']}; "
                + ", ".join(f"{k}={v}" for k, v in GPT_MINI.items()),
        # The summary line rounds to 0.01 MiB.
        matches_formula=abs(tp["tp_forward_mib"] - f["forward_bytes"] / MIB) <= 0.006
        and abs(tp["tp_backward_mib"] - f["backward_bytes"] / MIB) <= 0.006)
    if "tp_sp" in res:
        sp = res["tp_sp"][-1]
        summary["ratio_tp_sp_to_tp"] = round(med["tp_sp"] / med["tp"], 3)
        summary["per_round_ratio_tp_sp_to_tp"] = [round(s_["tokens_per_s"] / t_["tokens_per_s"], 3)
                                                  for s_, t_ in zip(res["tp_sp"], res["tp"])]
        summary["per_round_ratio_tp_sp_to_ddp"] = [round(s_["tokens_per_s"] / d_["tokens_per_s"], 3)
                                                   for s_, d_ in zip(res["tp_sp"], res["ddp"])]
        summary["tp_sp"].update(allreduce_forward_mib=sp["tp_forward_mib"],
                                allreduce_backward_mib=sp["tp_backward_mib"])
        summary["sp_peak_saving_mib_rank0"] = round(
            summary["tp"]["peak_tensor_mib_per_rank"][0] - summary["tp_sp"]["peak_tensor_mib_per_rank"][0], 1)
    ddp_full = summary["ddp"]["params_on_rank"]
    summary["ddp"].update(
        grad_allreduce_mib=round(median([x["comm_bytes_per_step"] for x in res["ddp"]]) / MIB, 3),
        formula_grad_mib=round(4 * ddp_full / MIB, 3) if ddp_full else None)
    emit(summary)

    t, d = summary["tp"], summary["ddp"]
    print(f"\ngpt-mini, 1 thread per process, {a.steps} steps, median of {a.rounds} alternating rounds")
    print("| run | tokens/step | tokens/s | / DDP | step s (fwd / bwd) | parameters per rank "
          "| peak tensor MiB (rank 0 / 1) | peak RSS MiB (rank 0 / 1) | all-reduced per step | formula |")
    print("|" + " --- |" * 10)
    print(f"| TP = 2 | 2,048 | {med['tp']:,.0f} | {summary['ratio_tp_to_ddp']:.3f} | "
          f"{t['median_step_s']:.3f} ({t['median_forward_s']:.3f} / {t['median_backward_s']:.3f}) | "
          f"{t['params_on_rank']:,} of {t['params_full']:,} | "
          f"{t['peak_tensor_mib_per_rank'][0]} / {t['peak_tensor_mib_per_rank'][1]} | "
          f"{t['peak_rss_mib_per_rank'][0]} / {t['peak_rss_mib_per_rank'][1]} | "
          f"activations {t['allreduce_forward_mib']:.2f} MiB fwd + {t['allreduce_backward_mib']:.2f} MiB bwd | "
          f"{t['formula_forward_mib']:.2f} + {t['formula_backward_mib']:.2f} MiB |")
    print(f"| DDP | 4,096 | {med['ddp']:,.0f} | 1.000 | "
          f"{d['median_step_s']:.3f} ({d['median_forward_s']:.3f} / {d['median_backward_s']:.3f}) | "
          f"{d['params_on_rank']:,} | "
          f"{d['peak_tensor_mib_per_rank'][0]} / {d['peak_tensor_mib_per_rank'][1]} | "
          f"{d['peak_rss_mib_per_rank'][0]} / {d['peak_rss_mib_per_rank'][1]} | "
          f"gradients {d['grad_allreduce_mib']:.2f} MiB | {d['formula_grad_mib']:.2f} MiB (4 B x parameters) |")
    if "tp_sp" in res:
        s = summary["tp_sp"]
        print(f"| TP = 2 + SP | 2,048 | {med['tp_sp']:,.0f} | {med['tp_sp'] / med['ddp']:.3f} | "
              f"{s['median_step_s']:.3f} ({s['median_forward_s']:.3f} / {s['median_backward_s']:.3f}) | "
              f"{s['params_on_rank']:,} | "
              f"{s['peak_tensor_mib_per_rank'][0]} / {s['peak_tensor_mib_per_rank'][1]} | "
              f"{s['peak_rss_mib_per_rank'][0]} / {s['peak_rss_mib_per_rank'][1]} | "
              f"all-gather/reduce-scatter {s['allreduce_forward_mib']:.2f} + {s['allreduce_backward_mib']:.2f} MiB "
              f"(all-reduce equivalent) | as TP |")
        print(f"sequence parallelism: peak tensor memory -{summary['sp_peak_saving_mib_rank0']} MiB on rank 0, "
              f"tokens/s x{summary['ratio_tp_sp_to_tp']} of TP (per round {summary['per_round_ratio_tp_sp_to_tp']}; "
              f"SP / DDP per round {summary['per_round_ratio_tp_sp_to_ddp']})")
    if "single" in res:
        o = summary["single"]
        print(f"| 1 process | 2,048 | {med['single']:,.0f} | {med['single'] / med['ddp']:.3f} | "
              f"{o['median_step_s']:.3f} ({o['median_forward_s']:.3f} / {o['median_backward_s']:.3f}) | "
              f"{o['params_on_rank']:,} | {o['peak_tensor_mib_per_rank'][0]} | {o['peak_rss_mib_per_rank'][0]} "
              f"| none | |")
        print(f"TP / 1 process: {summary['ratio_tp_to_single']:.3f} "
              f"(per round {summary['per_round_ratio_tp_to_single']})")
    print(f"TP / DDP per round: {summary['per_round_ratio_tp_to_ddp']}; TP formula: {t['formula']}; "
          f"matches: {t['matches_formula']}")


if __name__ == "__main__":
    main()
