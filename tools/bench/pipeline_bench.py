#!/usr/bin/env python3
"""gpt-mini with 2 pipeline stages on 2 ranks (1 thread each) beside Braid DDP on 2 ranks, both
through //launcher over Gloo, alternated in the same run so that machine noise hits all alike.

  bazel build //launcher:all && /usr/bin/python3 tools/bench/pipeline_bench.py --rounds 3

For m = 4, 8, 16 micro-batches per step (16 sequences per step in every run: micro-batch 16/m
for the pipeline, 8 per rank for DDP), 1F1B and GPipe: tokens/s; the pipeline's measured bubble
beside the formula (p-1)/(m+p-1) and whether it is within 2 points (issue 11's goal); each
stage's idle share; the share of the step outside the schedule; each stage's peak activations
(the device memory a step holds above its start).

The bubble is the strategy's own figure (its summary line): the share of P x the schedule's span
in which the stages do not compute forward or backward, the span running from stage 0's first
forward to its last backward, steps 2..N. Waiting for messages, posting them and unequal stages
count; gradient zeroing, the tied-weight all-reduce and the optimizer step (outside the span) do
not, and are printed as "outside".

From each run's last-step trace (one file per stage) the bench also reports the communication
latency on the critical path: for every wait for a message, the part of the wait after the
sender had finished computing it (ms per step, both stages). Near zero means messages arrive as
soon as they are made; the rest of the bubble is then the schedule's own plus stage imbalance.
@own replays the schedule with each forward's and backward's own time from the trace and instant
messages (stage imbalance plus compute jitter), so bubble - @own is what messages and the executor
add. Prints one JSON object per run and a summary table. --tcp_too adds each pipeline config with its
messages over loopback TCP (BRAID_GLOO_SHM=0) beside the default shared-memory rings.
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
SUMMARY = re.compile(
    r"braid: pipeline \(stage (\d) of 2, (\d+) micro-batch\(es\), (\w+)(?:, split backward)?\): bubble ([\d.]+)% measured, "
    r"bubble formula ([\d.]+)% .*this stage idle ([\d.]+)%; outside the span .* ([\d.]+)% of the step; "
    r"peak activations held ([\d.]+) MiB")
CUT = re.compile(r"braid: pipeline of 2 stage\(s\).*cut by \w+: (.*)")


def read_trace(trace_prefix):
    events = {}
    for stage in (0, 1):
        for e in json.load(open(f"{trace_prefix}{stage}.json"))["traceEvents"]:
            if e.get("ph") == "X":
                events[(stage, e["name"])] = (e["ts"], e["ts"] + e["dur"])
    return events


def order(schedule, stage, m):
    """The compute steps of 2-stage GPipe / 1F1B, as schedule.cc lists them."""
    warmup = m if schedule == "gpipe" else min(2 - stage - 1, m)
    steps, f, b = [], 0, 0
    while f < warmup:
        steps.append(("F", f)); f += 1
    while f < m:
        steps += [("F", f), ("B", b)]; f += 1; b += 1
    while b < m:
        steps.append(("B", b)); b += 1
    return steps


def bubble_with_stage_times(schedule, m, times):
    """The bubble the schedule would have with these per-stage forward and backward times
    (times[stage] = (forward_ms, backward_ms), or a function (stage, kind, k) -> ms for each
    compute's own time) and messages that take no time: the formula's schedule, plus the stages'
    imbalance (and, with each compute's own time, its jitter), minus nothing else."""
    duration = times if callable(times) else (lambda s, kind, k: times[s][0 if kind == "F" else 1])
    done, clock, pc = {}, [0.0, 0.0], [0, 0]
    lists = [order(schedule, s, m) for s in (0, 1)]
    while pc[0] < len(lists[0]) or pc[1] < len(lists[1]):
        progressed = False
        for s in (0, 1):
            while pc[s] < len(lists[s]):
                kind, k = lists[s][pc[s]]
                dep = (s - 1, "F", k) if kind == "F" and s == 1 else (s + 1, "B", k) if kind == "B" and s == 0 else None
                if dep and dep not in done:
                    break
                start = max(clock[s], done[dep] if dep else 0.0)
                clock[s] = start + duration(s, kind, k)
                done[(s, kind, k)] = clock[s]
                pc[s] += 1
                progressed = True
        assert progressed, "schedule stuck"
    span = done[(0, "B", m - 1)]
    busy = sum(duration(s, kind, k) for s in (0, 1) for kind in "FB" for k in range(m))
    return 1 - busy / (2 * span)


def trace_figures(trace_prefix, schedule, micro_batches):
    """From the last step's trace: ms per step both stages waited for messages after their sender
    had made them (communication latency on the critical path); each stage's median forward and
    backward; the bubble those stage times give with instant messages."""
    events = read_trace(trace_prefix)
    times = []
    for stage in (0, 1):
        fw = [e - b for (s, n), (b, e) in events.items() if s == stage and re.fullmatch(r"F\d+", n)]
        bw = [e - b for (s, n), (b, e) in events.items() if s == stage and re.fullmatch(r"B\d+", n)]
        times.append((statistics.median(fw) / 1000, statistics.median(bw) / 1000))
    late = 0.0
    for (stage, name), (start, end) in events.items():
        m = re.match(r"wait (activation|gradient) (\d+)$", name)
        if not m:
            continue
        # An activation for stage 1 is made by stage 0's forward; a gradient for stage 0 by stage
        # 1's backward. Same machine, same clock.
        made = events.get((1 - stage, ("F" if m.group(1) == "activation" else "B") + m.group(2)))
        if made:
            late += max(0.0, end - max(start, made[1]))
    if any(re.fullmatch(r"W\d+", n) for (_, n) in events):  # split backwards: not modelled
        return {"comm_latency_ms": round(late / 1000, 2)}
    own = lambda s, kind, k: (lambda e: (e[1] - e[0]) / 1000)(events[(s, f"{kind}{k}")])
    return {"comm_latency_ms": round(late / 1000, 2),
            "bubble_at_own_times": round(bubble_with_stage_times(schedule, micro_batches, own), 4),
            "f_b_ms_stage0": [round(x, 2) for x in times[0]], "f_b_ms_stage1": [round(x, 2) for x in times[1]],
            "bubble_at_stage_times": round(bubble_with_stage_times(schedule, micro_batches, times), 4)}


def run(tmp, tag, cfg_text, steps, trace, env):
    cfg = os.path.join(tmp, tag + ".pbtxt")
    with open(cfg, "w") as f:
        f.write(cfg_text.replace("TRACE", os.path.join(tmp, tag + "-trace")))
    out = os.path.join(tmp, tag)
    cmd = [os.path.join(ROOT, "bazel-bin/launcher/launcher"), "--nproc_per_node=2",
           f"--log_dir={out}-workers", "--", f"--config={cfg}", f"--steps={steps}", f"--log_dir={out}"]
    load = round(os.getloadavg()[0], 2)  # other work on the machine shows here
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{tag} failed: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    s = [x for x in recs if x.get("summary")][0]
    res = {"run": tag, "load1_before": load, "tokens_per_s": s["median_tokens_per_s"]}
    for i in (0, 1):
        text = open(os.path.join(out + "-workers", f"workerlog.{i}")).read()
        for m in SUMMARY.finditer(text):
            stage = m.group(1)
            res["bubble"] = float(m.group(4)) / 100
            res["bubble_formula"] = float(m.group(5)) / 100
            res[f"idle_stage{stage}"] = float(m.group(6)) / 100
            res[f"outside_stage{stage}"] = float(m.group(7)) / 100
            res[f"activations_mib_stage{stage}"] = float(m.group(8))
        for m in CUT.finditer(text):
            res["cut"] = m.group(1)
    if trace and "bubble" in res:
        _, schedule, m = tag.split("-")[0].split("_")[:3]
        res.update(trace_figures(os.path.join(tmp, tag + "-trace"), schedule, int(m[1:])))
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--partition", default="parameters", help="the pipeline's cut: parameters, time, ...")
    p.add_argument("--micro_batches", default="4,8,16")
    p.add_argument("--schedules", default="1f1b,gpipe")
    p.add_argument("--no_ddp", action="store_true", help="pipeline runs only")
    p.add_argument("--tcp_too", action="store_true",
                   help="also run each pipeline config with its messages over loopback TCP "
                        "(BRAID_GLOO_SHM=0: the transport before shared memory), alternated with the default")
    p.add_argument("--nospin_too", action="store_true",
                   help="also run each pipeline config with waits that sleep at once (BRAID_GLOO_SHM_SPIN_US=0) "
                        "instead of polling the ring first")
    p.add_argument("--split_too", action="store_true",
                   help="also run each pipeline config with split backwards (split_backward: the weights' "
                        "gradients after the input's gradient is sent)")
    p.add_argument("--in_place_too", action="store_true",
                   help="also run each pipeline config with receives posted in place (receives_ahead 0: "
                        "the executor before issue 11's fix), alternated with the default")
    a = p.parse_args()
    configs = {}
    if not a.no_ddp:
        configs["ddp"] = BASE.format(micro=8, accum=1, strategy='strategy { name: "ddp" '
                                     'options { key: "bucket_cap_mb" value: "1" } }')
    for m in (int(x) for x in a.micro_batches.split(",")):
        for sched in a.schedules.split(","):
            variants = ([""] + (["_inplace"] if a.in_place_too else []) + (["_tcp"] if a.tcp_too else [])
                        + (["_nospin"] if a.nospin_too else []) + (["_split"] if a.split_too else []))
            for variant in variants:
                extra = {"_inplace": 'options { key: "receives_ahead" value: "0" } ',
                         "_split": 'options { key: "split_backward" value: "true" } '}.get(variant, "")
                configs[f"pipe_{sched}_m{m}{variant}"] = BASE.format(
                    micro=16 // m, accum=m,
                    strategy=f'strategy {{ name: "pipeline" options {{ key: "stages" value: "2" }} '
                             f'options {{ key: "schedule" value: "{sched}" }} '
                             f'options {{ key: "partition" value: "{a.partition}" }} {extra}'
                             f'options {{ key: "trace_file" value: "TRACE{{rank}}.json" }} }}')
    results = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            # Reversed every other round, so that no configuration always follows the same one.
            order = list(configs.items()) if r % 2 == 0 else list(reversed(configs.items()))
            for tag, text in order:
                env = dict(ENV1, BRAID_GLOO_SHM="0") if tag.endswith("_tcp") else \
                    dict(ENV1, BRAID_GLOO_SHM_SPIN_US="0") if tag.endswith("_nospin") else ENV1
                res = run(tmp, f"{tag}-{r}", text, a.steps, trace=tag != "ddp", env=env)
                results[tag].append(res)
                print(json.dumps({"round": r, **res}), flush=True)
    ddp = statistics.median(x["tokens_per_s"] for x in results["ddp"]) if "ddp" in results else None
    rows = []
    for tag, runs in results.items():
        row = {"config": tag, "tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs)}
        if ddp:
            row["vs_ddp"] = round(row["tokens_per_s"] / ddp, 3)
        for key in ("bubble", "bubble_formula", "bubble_at_stage_times", "bubble_at_own_times",
                    "idle_stage0", "idle_stage1",
                    "outside_stage0", "comm_latency_ms", "activations_mib_stage0", "activations_mib_stage1"):
            vals = [x[key] for x in runs if key in x]
            if vals:
                row[key] = round(statistics.median(vals), 4)
        if "bubble" in row:
            row["bubble_points_over_formula"] = round(100 * (row["bubble"] - row["bubble_formula"]), 1)
            row["within_2_points"] = row["bubble_points_over_formula"] <= 2.0  # below it is better
        cuts = {x["cut"] for x in runs if "cut" in x}
        if cuts:
            row["cut"] = " / ".join(sorted(cuts))
        rows.append(row)
        print(json.dumps({"summary": True, **row}), flush=True)
    print(f"\nmedians of {a.rounds} round(s), {a.steps} steps each; load average before the runs: "
          f"{min(x['load1_before'] for v in results.values() for x in v)}-"
          f"{max(x['load1_before'] for v in results.values() for x in v)}")
    print(f"{'config':20} {'tok/s':>7} {'vs DDP':>6} {'bubble':>7} {'formula':>7} {'diff':>6} {'<=2pt':>5} "
          f"{'@times':>7} {'@own':>6} {'idle s0':>7} {'idle s1':>7} {'outside':>7} {'lat ms':>6} {'act s0':>7} {'act s1':>7}")
    for row in rows:
        f = lambda k, scale=1, fmt="{:.1f}": fmt.format(row[k] * scale) if k in row else "-"
        ok = "-" if "within_2_points" not in row else ("yes" if row["within_2_points"] else "NO")
        print(f"{row['config']:20} {row['tokens_per_s']:7.0f} {f('vs_ddp', 1, '{:.2f}'):>6} "
              f"{f('bubble', 100):>7} {f('bubble_formula', 100):>7} {f('bubble_points_over_formula'):>6} "
              f"{ok:>5} {f('bubble_at_stage_times', 100):>7} {f('bubble_at_own_times', 100):>6} {f('idle_stage0', 100):>7} {f('idle_stage1', 100):>7} {f('outside_stage0', 100):>7} "
              f"{f('comm_latency_ms'):>6} {f('activations_mib_stage0'):>7} {f('activations_mib_stage1'):>7}")
    for row in rows:
        if "cut" in row:
            print(f"cut: {row['cut']}")
            break
    print("bubble: measured (the strategy's summary); formula: (p-1)/(m+p-1); diff: points over it; "
          "@times: the bubble this schedule has with the stages' measured forward/backward times "
          "(last step's trace) and instant messages, i.e. formula + stage imbalance; @own: the same with each "
          "forward's and backward's own time (imbalance + jitter); lat ms: per step, "
          "waits for messages after they were made (critical-path communication latency); outside: "
          "share of the step outside the schedule's span (not counted in the bubble)")


if __name__ == "__main__":
    main()
