#!/usr/bin/env python3
"""ZeRO (the zero strategy, plugins/zero/zero.cc) against DDP and against PyTorch 1.13's
ZeroRedundancyOptimizer: per-rank memory of the model states beside the ZeRO paper's formulas,
and gpt-mini throughput on 2 ranks, alternated in one run so that machine noise hits all alike.

  bazel build //launcher:all //plugins/... && /usr/bin/python3 tools/bench/zero_bench.py

Memory: gpt-mini (micro-batch 16) and gpt2-124m (micro-batch 1), --mem_steps steps, on Moby Dick, at
world sizes 1, 2 and 4, for DDP and ZeRO stages 1, 2 and 3. "Measured" is the zero strategy's own
per-rank peaks (its "model state per rank (peak)" line: parameters + gradients + optimizer state,
the largest over the ranks), its transient buffers reported apart; DDP prints no such line, so its
model states are the formula 4+4+8 bytes per parameter. The formulas (fp32 AdamW, Psi parameters,
N ranks): DDP 16Psi, stage 1 8Psi + 8Psi/N, stage 2 4Psi + 12Psi/N, stage 3 16Psi/N. "Documented"
adds what plugins/zero/zero_strategy.h says it holds on top: each unit (one per block, one for
the parameters outside blocks) padded to a multiple of N, and at stage 3 the units gathered in
full at once (the outside parameters and one block, one more block while prefetching, the
default; "z3np" is stage 3 with stage3_prefetch_bucket_size: 0). Every run also gives the
allocator's peak tensor memory, activations included ("alloc peak"), and, beside the bookkeeping,
the allocator's own figure for the model states ("alloc state"): the peak less the activations,
which grow in proportion to the micro-batch while the model states do not, so a second run at
another micro-batch (--probe) prices them per sequence and peak(b) - b x that is what the rank
held besides activations at its peak (model states and transients, counted by the allocator).
A run whose ranks would not fit in the machine's free memory (from the same strategy's RSS at a
smaller world size), or that would start after --mem_budget_s, is skipped and printed as skipped.

Throughput: gpt-mini on 2 ranks (1 thread each), --steps steps, in rounds of DDP, ZeRO 1, 2, 3,
PyTorch DDP + ZeroRedundancyOptimizer and PyTorch DDP (tools/bench/gpt_mini_torch.py); medians
over rounds of each run's median tokens/s, and the ratios.

One JSON object per measurement on stdout, then tables.
"""
import argparse
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The built tree the runs use: the workspace's bazel-bin, or with --bin a copy of it (launcher/,
# plugins/, backends/), which no other build can replace while the bench runs.
BIN = os.path.join(ROOT, "bazel-bin")
ENV1 = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", BRAID_NUM_THREADS="1",
            BRAID_DATA_DIR=os.path.join(ROOT, "data"))
MIB = 2 ** 20

# Layers, width, padded vocabulary, context (docs/MODELS.md); the units are zero.cc's.
MODELS = {"gpt-mini": dict(L=4, C=256, V=256, T=128, micro_batch=16),
          "gpt2-124m": dict(L=12, C=768, V=50304, T=1024, micro_batch=1),
          # 4 query heads sharing 2 K/V heads (K/V width 128), SwiGLU 768, untied head.
          "llama-mini": dict(L=4, C=256, V=256, T=128, micro_batch=16, llama=dict(KV=128, I=768))}
CONFIGS = {"ddp": "gpt-mini-ddp.pbtxt", "z1": "gpt-mini-zero1.pbtxt",
           "z2": "gpt-mini-zero2.pbtxt", "z3": "gpt-mini-zero3.pbtxt", "z3np": "gpt-mini-zero3.pbtxt"}
STAGE = {"ddp": 0, "z1": 1, "z2": 2, "z3": 3, "z3np": 3}


def units(model):
    """Element counts of zero.cc's units: [outside blocks, block, block, ...]."""
    m = MODELS[model]
    C = m["C"]
    if "llama" in m:  # q, k, v, o, gate, up, down, two RMSNorms; embedding, untied head, norm
        kv, inner = m["llama"]["KV"], m["llama"]["I"]
        block = 2 * C * C + 2 * C * kv + 3 * C * inner + 2 * C
        return [2 * m["V"] * C + C] + [block] * m["L"]
    block = 12 * C * C + 13 * C  # ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj (+ biases)
    rest = m["V"] * C + m["T"] * C + 2 * C  # wte (tied head), wpe, ln_f
    return [rest] + [block] * m["L"]


def formula(stage, psi, n):
    """Bytes of model states per rank, fp32 AdamW (ZeRO paper, K = 8 for Adam's m and v)."""
    return {0: 16 * psi, 1: 8 * psi + 8 * psi / n, 2: 4 * psi + 12 * psi / n, 3: 16 * psi / n}[stage]


def documented_extra(strat, model, n):
    """What the zero strategy holds beyond the formula (plugins/zero/zero_strategy.h,
    docs/WRITING_A_STRATEGY.md): padding of each unit to a multiple of N, and at stage 3 the units
    in use at once, gathered in full: the outside parameters and one block, plus one more block
    when prefetching (the default; z3np turns prefetch off)."""
    stage = STAGE[strat]
    if stage == 0:
        return 0.0
    u = units(model)
    pad = [math.ceil(x / n) * n for x in u]
    extra = formula(stage, sum(pad), n) - formula(stage, sum(u), n)
    if stage == 3:
        extra += 4 * (pad[0] + max(pad[1:]) * (1 if strat == "z3np" else 2))
    return extra


def write_config(model, strat, tmp, micro_batch=None):
    text = open(os.path.join(ROOT, "launcher/configs", CONFIGS[strat])).read()
    text, k = re.subn(r'model \{ name: "gpt-mini" \}', f'model {{ name: "{model}" }}', text)
    assert k == 1, "model line not found in " + CONFIGS[strat]
    text, k = re.subn(r"train_micro_batch_size_per_gpu: \d+",
                      f"train_micro_batch_size_per_gpu: {micro_batch or MODELS[model]['micro_batch']}", text)
    assert k == 1, "micro-batch line not found in " + CONFIGS[strat]
    if strat == "z3np":
        text, k = re.subn(r"zero_optimization \{ stage: 3 \}",
                          "zero_optimization { stage: 3 stage3_prefetch_bucket_size: 0 }", text)
        assert k == 1, "zero_optimization line not found in " + CONFIGS[strat]
    path = os.path.join(tmp, f"{model}-{strat}-b{micro_batch or MODELS[model]['micro_batch']}.pbtxt")
    with open(path, "w") as f:
        f.write(text)
    return path


STATE_RE = re.compile(r"model state per rank \(peak\): parameters ([\d.]+) MiB, gradients ([\d.]+) MiB, "
                      r"optimizer state ([\d.]+) MiB, transient ([\d.]+) MiB")
PSI_RE = re.compile(r"braid: training (\S+) \((\d+) parameters\)")


def braid(model, strat, n, steps, tmp, tag, timeout=900, micro_batch=None):
    """One launcher run; the largest of each figure over the ranks."""
    out = os.path.join(tmp, tag)
    cfg = write_config(model, strat, tmp, micro_batch)
    cmd = [os.path.join(BIN, "launcher/launcher"), f"--nproc_per_node={n}",
           f"--log_dir={out}-workers", "--", f"--config={cfg}", f"--steps={steps}", f"--log_dir={out}"]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, env=ENV1, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    wall = time.time() - t0
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {(r.stdout + r.stderr)[-600:]}"}
    res = {"wall_s": round(wall, 1)}
    logs = [f for f in os.listdir(out) if f.startswith("train") and f.endswith(".log")]
    states = []
    for f in logs:
        text = open(os.path.join(out, f)).read()
        m = PSI_RE.search(text)
        if m:
            res["psi"] = int(m.group(2))
        states += [[float(x) for x in s] for s in STATE_RE.findall(text)]
    if states:
        for i, k in enumerate(["params_mib", "grads_mib", "optim_mib", "transient_mib"]):
            res[k] = max(s[i] for s in states)
        res["measured_mib"] = round(max(s[0] + s[1] + s[2] for s in states), 2)
    peaks, rss = [], []
    res["peak_bytes_by_file"] = {}  # per rank (metrics.jsonl is rank 0's), for the extrapolation
    for f in os.listdir(out):
        if f.startswith("metrics.jsonl"):
            for line in open(os.path.join(out, f)):
                x = json.loads(line)
                if x.get("summary"):
                    peaks.append(x["peak_bytes"])
                    res["peak_bytes_by_file"][f] = x["peak_bytes"]
                    rss.append(x["peak_rss_bytes"])
                    if f == "metrics.jsonl":
                        res["tokens_per_s"] = x["median_tokens_per_s"]
                        res["final_loss"] = x["final_loss"]
    res["peak_tensor_mib"] = round(max(peaks) / MIB, 1)
    res["peak_rss_mib"] = round(max(rss) / MIB, 1)
    return res


def torch_run(steps, zero, timeout=900):
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "tools/bench/gpt_mini_torch.py"), f"--steps={steps}",
           "--threads=1", "--world_size=2", "--quiet"] + (["--zero"] if zero else [])
    r = subprocess.run(cmd, env=ENV1, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {r.stderr[-600:]}"}
    s = json.loads(r.stdout.strip().splitlines()[-1])
    out = {"tokens_per_s": s["tokens_per_s"], "final_loss": s["final_loss"], "peak_rss_mib": s["peak_rss_mib"]}
    if zero:
        out["optim_mib_per_rank"] = s["optimizer_state_mib"]
    return out


def mem_available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def emit(obj):
    print(json.dumps(obj), flush=True)


def memory_part(a, tmp):
    rows, skipped = [], []
    start = time.time()
    for model in a.models.split(","):
        psi_expected = sum(units(model))
        for n in [int(x) for x in a.worlds.split(",")]:
            for strat in a.mem_strategies.split(","):
                key = {"part": "memory", "model": model, "strategy": strat, "world_size": n}
                same = [r for r in rows if r["model"] == model and r["strategy"] == strat
                        and r.get("peak_rss_mib") and r["world_size"] < n]
                if same:
                    need = n * same[-1]["peak_rss_mib"] * MIB
                    if need > 0.9 * mem_available():
                        why = (f"{n} ranks x {same[-1]['peak_rss_mib']:.0f} MiB RSS (at {same[-1]['world_size']} "
                               f"rank(s)) would not fit in {mem_available() / MIB:.0f} MiB available")
                        skipped.append({**key, "skipped": why})
                        emit(skipped[-1])
                        continue
                prev = [r for r in rows if r["model"] == model and r["world_size"] == n and r.get("wall_s")]
                # With a second (and third) run at a larger micro-batch.
                probed = (n <= probes(a).get(model, (0, 0))[1]) + (n <= probes(a, a.probe_linear).get(model, (0, 0))[1])
                est = prev[-1]["wall_s"] * (1 + 2.5 * probed) if prev else 0
                if time.time() - start + est > a.mem_budget_s:
                    why = f"over the memory part's time budget ({a.mem_budget_s} s)"
                    skipped.append({**key, "skipped": why})
                    emit(skipped[-1])
                    continue
                r = braid(model, strat, n, a.mem_steps, tmp, f"mem-{model}-{strat}-{n}")
                row = {**key, **r}
                if "error" not in r:
                    psi = r.get("psi", psi_expected)
                    assert psi == psi_expected, (model, psi, psi_expected)
                    stage = STAGE[strat]
                    f = formula(stage, psi, n)
                    d = documented_extra(strat, model, n)
                    if stage == 0:  # DDP prints no model-state line: its states are the formula
                        row["measured_mib"] = round(f / MIB, 2)
                        row["measured_from"] = "formula (ddp prints no model-state line)"
                    m = row["measured_mib"] * MIB
                    row.update(psi=psi, formula_mib=round(f / MIB, 2), ratio_to_formula=round(m / f, 4),
                               documented_extra_mib=round(d / MIB, 2),
                               ratio_to_formula_plus_documented=round(m / (f + d), 4),
                               within_5pct=abs(m / (f + d) - 1) <= 0.05)
                if "error" not in r:
                    alloc_model_state(a, row, rows, tmp)
                rows.append(row)
                emit(row)
    return rows, skipped


def probes(a, spec=None):
    """{model: (micro-batch, largest world size probed)} from --probe (or --probe_linear)."""
    out = {}
    for item in filter(None, (a.probe if spec is None else spec).split(",")):
        model, rest = item.split("=")
        b, n = rest.split("@")
        out[model] = (int(b), int(n))
    return out


def alloc_model_state(a, row, rows, tmp):
    """The allocator's figure for what the run holds besides activations, per rank: its peak
    tensor memory with the activations' share taken out. Everything a step allocates for one
    sequence (activations, the graph's saved tensors, logits, the batch) grows in proportion to the
    micro-batch b at a fixed context; parameters, gradients, optimizer state and communication
    buffers do not. So a second run at micro-batch b2 gives the activations' bytes per sequence,
    slope = (peak(b2) - peak(b)) / (b2 - b), and peak(b) - b * slope is the peak without them: the
    model states and transients alive at the allocator's peak, as the allocator counted them.
    A run's ranks hold the same activations at any N and stage (the same micro-batch per rank),
    so where a second run would not fit (gpt2-124m at N = 4) or is not asked for (--probe), the
    same strategy's slope at a smaller N stands in (row["alloc_slope_from"] says which)."""
    model, strat, n = row["model"], row["strategy"], row["world_size"]
    b = MODELS[model]["micro_batch"]
    b2, max_n = probes(a).get(model, (0, 0))
    own = None
    if b2 and b2 != b and n <= max_n:
        state_est = row["measured_mib"] * MIB
        act_est = max(0.0, row["peak_tensor_mib"] * MIB - state_est)  # a guess, for the memory check
        need = n * (row["peak_rss_mib"] * MIB + max(0, b2 - b) / b * act_est)
        if need <= 0.9 * mem_available():
            own = braid(model, strat, n, a.mem_steps, tmp, f"mem-{model}-{strat}-{n}-b{b2}", micro_batch=b2)
            if "error" in own:
                row["alloc_probe_error"] = own["error"]
                own = None
        else:
            row["alloc_probe_skipped"] = (f"{n} ranks at micro-batch {b2} need ~{need / MIB:.0f} MiB, "
                                          f"{mem_available() / MIB:.0f} available")
    if own is not None:
        slopes = {f: (own["peak_bytes_by_file"][f] - p) / (b2 - b)
                  for f, p in row["peak_bytes_by_file"].items() if f in own["peak_bytes_by_file"]}
        row["alloc_probe"] = {"micro_batch": b2, "peak_tensor_mib": own["peak_tensor_mib"],
                              "peak_rss_mib": own["peak_rss_mib"], "wall_s": own["wall_s"]}
        row["alloc_slope_from"] = f"N={n}"
        # The figure is exact only if the peak is the same moment of the step at both micro-batches
        # (then peak(b) is linear in b); a third micro-batch (--probe_linear) tests that. If the
        # moment moves, peak(b) is still convex in b, so the line through two points meets b = 0
        # below the allocator's activation-free peak: the figure is then a lower bound of that.
        b3, max_n3 = probes(a, a.probe_linear).get(model, (0, 0))
        if b3 and b3 not in (b, b2) and n <= max_n3:
            third = braid(model, strat, n, a.mem_steps, tmp, f"mem-{model}-{strat}-{n}-b{b3}", micro_batch=b3)
            if "error" in third:
                row["alloc_linear_error"] = third["error"]
            else:
                slopes3 = {f: (third["peak_bytes_by_file"][f] - p) / (b3 - b)
                           for f, p in row["peak_bytes_by_file"].items() if f in third["peak_bytes_by_file"]}
                row["alloc_linear_micro_batch"] = b3
                row["alloc_state_mib_from_b3"] = round(
                    max(p - b * slopes3[f] for f, p in row["peak_bytes_by_file"].items()) / MIB, 2)
                row["alloc_linear"] = all(abs(slopes3[f] - slopes[f]) <= 1e-3 * abs(slopes[f]) for f in slopes3)
    else:
        ref = [r for r in rows if r["model"] == model and r["strategy"] == strat
               and r.get("alloc_slope_from") == f"N={r['world_size']}" and r["world_size"] < n]
        if not ref:
            return
        # Every rank of the reference holds the same activations: its median slope for each.
        slope = statistics.median(ref[-1]["alloc_act_bytes_per_seq_by_file"].values())
        slopes = {f: slope for f in row["peak_bytes_by_file"]}
        row["alloc_slope_from"] = f"N={ref[-1]['world_size']}"
    row["alloc_act_bytes_per_seq_by_file"] = slopes
    row["alloc_act_mib_per_seq"] = round(max(slopes.values()) / MIB, 3)
    state = max(p - b * slopes[f] for f, p in row["peak_bytes_by_file"].items())
    row["alloc_state_mib"] = round(state / MIB, 2)
    f, d = row["formula_mib"] * MIB, row["documented_extra_mib"] * MIB
    row["alloc_state_to_formula"] = round(state / f, 4)
    row["alloc_state_to_formula_plus_documented"] = round(state / (f + d), 4)


def throughput_part(a, tmp):
    kinds = ["ddp", "z1", "z2", "z3"] + ([] if a.no_torch else ["torch_zero", "torch_ddp"])
    res = {k: [] for k in kinds}
    for rnd in range(a.rounds):
        for k in kinds:
            load = round(os.getloadavg()[0], 2)  # other work on the machine shows here
            if k.startswith("torch"):
                r = torch_run(a.steps, zero=k == "torch_zero")
            else:
                r = braid("gpt-mini", k, 2, a.steps, tmp, f"tp-{k}-{rnd}")
                r = {x: r[x] for x in ("tokens_per_s", "final_loss", "peak_tensor_mib", "optim_mib", "error")
                     if x in r}
            if "error" in r:
                sys.exit(f"{k} failed in round {rnd}: {r['error']}")
            res[k].append(r)
            emit({"part": "throughput", "round": rnd, "run": k, "world_size": 2, "steps": a.steps,
                  "load1_before": load, **r})
    med = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in res.items()}
    summary = {"part": "throughput", "summary": True, "rounds": a.rounds, "steps": a.steps,
               "median_tokens_per_s": med,
               "ratio_to_ddp": {k: round(med[k] / med["ddp"], 3) for k in ("z1", "z2", "z3")},
               "per_round_ratio_to_ddp": {k: [round(x["tokens_per_s"] / d["tokens_per_s"], 3)
                                              for x, d in zip(res[k], res["ddp"])] for k in ("z1", "z2", "z3")}}
    goals = {"z1": 0.95, "z2": 0.95, "z3": 0.85}
    summary["meets_goal"] = {k: summary["ratio_to_ddp"][k] >= g for k, g in goals.items()}
    if not a.no_torch:
        summary["z1_vs_torch_zero"] = round(med["z1"] / med["torch_zero"], 3)
        summary["per_round_z1_vs_torch_zero"] = [round(x["tokens_per_s"] / t["tokens_per_s"], 3)
                                                 for x, t in zip(res["z1"], res["torch_zero"])]
        summary["torch_zero_vs_torch_ddp"] = round(med["torch_zero"] / med["torch_ddp"], 3)
        summary["torch_zero_optim_mib_per_rank"] = res["torch_zero"][-1]["optim_mib_per_rank"]
        summary["braid_z1_optim_mib_per_rank"] = res["z1"][-1].get("optim_mib")
    emit(summary)
    return summary


def tables(mem, skipped, tp):
    if mem:
        print("\nModel states per rank (MiB): measured = parameters + gradients + optimizer state "
              "(largest rank; DDP: the formula), transient apart; alloc state = the allocator's peak tensor "
              "memory less the activations (peak(b) - b x the bytes per sequence from a second run at "
              "micro-batch b2: model states and transients alive at the peak), largest rank")
        hdr = ("model", "N", "strategy", "measured", "formula", "meas/formula", "documented", "meas/(f+doc)",
               "transient", "alloc state", "alloc/formula", "alloc/(f+doc)", "act/seq", "slope from",
               "linear", "alloc peak")
        print("| " + " | ".join(hdr) + " |")
        print("|" + " --- |" * len(hdr))
        for r in mem:
            if "error" in r:
                print(f"| {r['model']} | {r['world_size']} | {r['strategy']} | failed: {r['error'][:80]} |")
                continue
            alloc = (f"{r['alloc_state_mib']:.2f} | {r['alloc_state_to_formula']:.3f} | "
                     f"{r['alloc_state_to_formula_plus_documented']:.3f} | {r['alloc_act_mib_per_seq']:.2f} | "
                     f"{r['alloc_slope_from']} | " if "alloc_state_mib" in r else "- | - | - | - | - | ")
            alloc += ("-" if "alloc_linear" not in r else "yes" if r["alloc_linear"] else
                      f"no (b={r['alloc_linear_micro_batch']}: {r['alloc_state_mib_from_b3']:.2f})")
            print(f"| {r['model']} | {r['world_size']} | {r['strategy']} | {r['measured_mib']:.2f} | "
                  f"{r['formula_mib']:.2f} | {r['ratio_to_formula']:.3f} | +{r['documented_extra_mib']:.2f} | "
                  f"{r['ratio_to_formula_plus_documented']:.3f}{'' if r['within_5pct'] else ' (miss)'} | "
                  f"{r.get('transient_mib', 0):.2f} | {alloc} | {r['peak_tensor_mib']:.1f} |")
        for s in skipped:
            print(f"skipped: {s['model']} {s['strategy']} N={s['world_size']}: {s['skipped']}")
    if tp:
        m = tp["median_tokens_per_s"]
        print(f"\ngpt-mini, 2 ranks, {tp['steps']} steps, median of {tp['rounds']} rounds (tokens/s):")
        print("| run | tokens/s | vs Braid DDP | goal |")
        print("| --- | --- | --- | --- |")
        print(f"| Braid ddp | {m['ddp']:,.0f} | 1.000 | |")
        for k, g in (("z1", "≥ 0.95"), ("z2", "≥ 0.95"), ("z3", "≥ 0.85")):
            print(f"| Braid zero stage {k[1]} | {m[k]:,.0f} | {tp['ratio_to_ddp'][k]:.3f} | {g}"
                  f"{'' if tp['meets_goal'][k] else ' (missed)'} |")
        if "torch_zero" in m:
            print(f"| PyTorch DDP + ZeroRedundancyOptimizer | {m['torch_zero']:,.0f} | | |")
            print(f"| PyTorch DDP | {m['torch_ddp']:,.0f} | | |")
            print(f"Braid stage 1 / PyTorch ZeRO: {tp['z1_vs_torch_zero']:.3f}x "
                  f"(per round {tp['per_round_z1_vs_torch_zero']}); PyTorch ZeRO / PyTorch DDP: "
                  f"{tp['torch_zero_vs_torch_ddp']:.3f}")


def main():
    global BIN  # --bin
    p = argparse.ArgumentParser(description="ZeRO memory and throughput against DDP, the ZeRO paper's "
                                "formulas and PyTorch's ZeroRedundancyOptimizer (see the file's docstring)")
    p.add_argument("--parts", default="memory,throughput", help="memory, throughput or both")
    p.add_argument("--models", default="gpt-mini,gpt2-124m")
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--mem_steps", type=int, default=2)
    p.add_argument("--mem_strategies", default="z3,z2,z1,ddp,z3np",
                   help="in this order at each model and world size (z3np: stage 3 without prefetch)")
    p.add_argument("--mem_budget_s", type=int, default=1800,
                   help="no memory run starts once the part has run this long (with the last run's time)")
    p.add_argument("--probe", default="gpt-mini=8@4,gpt2-124m=2@2",
                   help="MODEL=B2@NMAX,...: for the allocator's model-state figure, a second run of each "
                        "memory run at micro-batch B2 up to NMAX ranks (larger N use the slope from the "
                        "largest N probed); empty: none")
    p.add_argument("--probe_linear", default="gpt-mini=4@4,gpt2-124m=3@1",
                   help="MODEL=B3@NMAX,...: a third micro-batch where probed, to test that the peak is "
                        "linear in the micro-batch (then the allocator's figure is exact); empty: none")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--no_torch", action="store_true", help="leave PyTorch out of the throughput rounds")
    p.add_argument("--bin", default=BIN,
                   help="the built tree to run (launcher/launcher beside plugins/ and backends/); default "
                        "the workspace's bazel-bin. A copy keeps other builds from replacing it mid-run")
    a = p.parse_args()
    BIN = a.bin
    parts = a.parts.split(",")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    emit({"bench": "zero_bench", "date": datetime.datetime.now().isoformat(timespec="seconds"),
          "commit": commit, "args": vars(a)})
    mem, skipped, tp = [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        if "memory" in parts:
            mem, skipped = memory_part(a, tmp)
        if "throughput" in parts:
            tp = throughput_part(a, tmp)
    tables(mem, skipped, tp)


if __name__ == "__main__":
    main()
