#!/usr/bin/env python3
"""gpt-mini with 2 pipeline stages on 2 ranks (1 thread each) beside Braid DDP on 2 ranks, both
through //launcher over Gloo, alternated in the same run so that machine noise hits all alike.

  bazel build //launcher:all && /usr/bin/python3 tools/bench/pipeline_bench.py --rounds 3

For m = 4, 8, 16 micro-batches per step (16 sequences per step in every run: micro-batch 16/m
for the pipeline, 8 per rank for DDP), 1F1B and GPipe: tokens/s; the pipeline's measured bubble
beside the schedule's own ideal and whether it is within 2 points of it (issue 11's goal); each
stage's idle share; the share of the step outside the schedule; each stage's peak activations
(the device memory a step holds above its start).

The bubble is the strategy's own figure (its summary line): the share of P x the schedule's span
in which the stages compute no forward, backward or weight gradient, the span running from stage
0's first forward to the end of the last compute of any stage, steps 2..N. Waiting for messages,
posting them and unequal stages count; gradient zeroing, the tied-weight all-reduce and the
optimizer step (outside the span) do not, and are printed as "outside".

From each run's last-step trace (one file per stage) the bench also reports the communication
latency on the critical path: for every wait for a message, the part of the wait after the
sender had finished computing it (ms per step, both stages). Near zero means messages arrive as
soon as they are made; the rest of the bubble is then the schedule's own plus stage imbalance.
Each schedule is judged against its own ideal ("ideal"): the bubble it has with equal stages
and instant messages, from the measured per-micro-batch forward (F), backward (B: with split
backwards only the input's gradient) and weight-gradient (W) times. Unsplit that is the formula
(p-1)/(m+p-1); with --split_too's split backwards (Braid's: W right after the input's gradient is
sent, not ZB-H1's W's moved into the tail) it is (p-1)(F+B) idle per stage against 1F1B's
(p-1)(F+B+W), so lower; ZB-H1's (p-1)(F+B-W) is printed beside it for reference. @times replays
the schedule (W's included) with each stage's median F, B, W and instant messages (ideal + stage
imbalance); @own with each compute's own time from the trace (+ compute jitter), so bubble - @own
is what messages and the executor add. Prints one JSON object per run and a summary table.
--tcp_too adds each pipeline config with its messages over loopback TCP (BRAID_GLOO_SHM=0) beside
the default shared-memory rings.
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
# The built tree the runs use: the workspace's bazel-bin, or with --bin a copy of it (launcher/,
# plugins/, backends/), which no other build can replace while the bench runs.
BIN = os.path.join(ROOT, "bazel-bin")
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


def order(schedule, stage, m, split=False, stages=2):
    """The compute steps of GPipe / 1F1B on `stages` stages, as schedule.cc lists them. With split
    backwards each B computes only its input's gradient and its weights' gradients (W) follow:
    SplitBackward puts W right after the gradient's send, or right after B on stage 0 (which sends
    none), so in compute order W k always comes right after B k on every stage."""
    warmup = m if schedule == "gpipe" else min(stages - stage - 1, m)
    steps, f, b = [], 0, 0

    def backward():
        nonlocal b
        steps.append(("B", b))
        if split:
            steps.append(("W", b))
        b += 1
    while f < warmup:
        steps.append(("F", f)); f += 1
    while f < m:
        steps.append(("F", f)); f += 1
        backward()
    while b < m:
        backward()
    return steps


def bubble_with_stage_times(schedule, m, times, split=False, stages=2):
    """The bubble the schedule would have with these per-stage times and messages that take no
    time: times[stage] = (forward_ms, backward_ms[, weight_gradient_ms]), or a function
    (stage, kind, k) -> ms with each compute's own time. A forward waits for the previous stage's
    forward of its micro-batch, a backward (B: the input's gradient) for the next stage's backward;
    a W waits for nothing but its own B, which the stage's order already puts first. The bubble
    is the strategy's: 1 - all stages' compute / (stages x span), the span from stage 0's first
    forward to the end of the last compute of any stage. Plain schedules with equal stages give
    the formula (p-1)/(m+p-1); measured stage times add the stages' imbalance (and, with each
    compute's own time, its jitter), and nothing else."""
    duration = times if callable(times) else (lambda s, kind, k: times[s]["FBW".index(kind)])
    done, clock, pc = {}, [0.0] * stages, [0] * stages
    lists = [order(schedule, s, m, split, stages) for s in range(stages)]
    while any(pc[s] < len(lists[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while pc[s] < len(lists[s]):
                kind, k = lists[s][pc[s]]
                dep = ((s - 1, "F", k) if kind == "F" and s > 0 else
                       (s + 1, "B", k) if kind == "B" and s < stages - 1 else None)
                if dep and dep not in done:
                    break
                start = max(clock[s], done[dep] if dep else 0.0)
                clock[s] = start + duration(s, kind, k)
                done[(s, kind, k)] = clock[s]
                pc[s] += 1
                progressed = True
        assert progressed, "schedule stuck"
    span = max(done.values())
    busy = sum(duration(s, kind, k) for s in range(stages) for kind, k in lists[s])
    return 1 - busy / (stages * span)


def ideal_bubble(f, b, w, m, split, stages=2):
    """The schedule's own analytic bubble with equal stages and instant messages, from the
    per-micro-batch forward (f), backward (b: the input's gradient when split, the whole backward
    otherwise) and weight-gradient (w, 0 unsplit) times. Each stage idles while the first
    micro-batch's forward runs down the pipeline, (p-1)F, and while the last one's gradient
    runs back up: (p-1)(B+W) unsplit (../shared/PARALLELISM.md's 1F1B figure; GPipe's is the
    same), but only (p-1)B in Braid's split schedule, since each stage sends the input's gradient
    before it computes the weights' and the W's of the last micro-batch overlap the earlier
    stages' B's. So unsplit the idle is (p-1)(F+B+W) and the bubble the formula (p-1)/(m+p-1);
    split it is (p-1)(F+B), (p-1)W lower. ZB-H1 (zb_h1_bubble) goes (p-1)W further. Bubble
    fraction = idle / (idle + m(F+B+W)). check_ideal() holds this to the replay."""
    idle = (stages - 1) * (f + b)
    return idle / (idle + m * (f + b + w))


def check_ideal():
    """The analytic ideal must be what replaying the schedule gives with equal stages: checked at
    every start over shapes and times (W above and below B), so a change to one is caught."""
    for split in (False, True):
        for schedule in ("1f1b", "gpipe"):
            for stages in (2, 3, 4):
                for m in (stages, 8, 16):
                    for f, b, w in ((1.0, 2.0, 0.0), (1.0, 1.3, 0.9), (2.1, 2.0, 2.1)):
                        w = w if split else 0.0
                        replay = bubble_with_stage_times(schedule, m, [(f, b, w)] * stages, split, stages)
                        ideal = ideal_bubble(f, b, w, m, split, stages)
                        assert abs(replay - ideal) < 1e-9, (schedule, split, stages, m, f, b, w, replay, ideal)


def zb_h1_bubble(f, b, w, m, stages=2):
    """ZB-H1's ideal (Qi et al. 2023; ../shared/PARALLELISM.md): W's delayed into the tail's idle
    time, (p-1)(F+B-W) idle per stage at 1F1B's memory. A reference for what a zero-bubble
    schedule would reach with the same compute times: Braid's split schedule is not ZB-H1."""
    idle = (stages - 1) * (f + b - w)
    return idle / (idle + m * (f + b + w))


def trace_figures(trace_prefix, schedule, micro_batches, split):
    """From the last step's trace: ms per step both stages waited for messages after their sender
    had made them (communication latency on the critical path); each stage's median forward,
    backward and (split) weight-gradient time; the schedule's own ideal bubble from those times
    with equal stages; the bubble the stages' times give with instant messages (@times), and
    with each compute's own time (@own)."""
    events = read_trace(trace_prefix)
    kinds = "FBW" if split else "FB"
    for stage in (0, 1):
        # The replay is only as good as its order: it must be the order the executor ran.
        ran = [n for (s, n), _ in sorted(((k, v) for k, v in events.items() if k[0] == stage),
                                         key=lambda kv: kv[1][0]) if re.fullmatch(r"[FBW]\d+", n)]
        listed = [f"{kind}{k}" for kind, k in order(schedule, stage, micro_batches, split)]
        if ran != listed:
            sys.exit(f"stage {stage} ran {' '.join(ran)}; the bench models {' '.join(listed)}: "
                     "update order() to the executor's schedule")
    times = []
    for stage in (0, 1):
        times.append(tuple(statistics.median(e - b for (s, n), (b, e) in events.items()
                                             if s == stage and re.fullmatch(kind + r"\d+", n)) / 1000
                           for kind in kinds) + ((0.0,) if not split else ()))
    late = 0.0
    for (stage, name), (start, end) in events.items():
        m = re.match(r"wait (activation|gradient) (\d+)$", name)
        if not m:
            continue
        # An activation for stage 1 is made by stage 0's forward; a gradient for stage 0 by stage
        # 1's backward (B: split or not, the gradient is sent after it). Same machine, same clock.
        made = events.get((1 - stage, ("F" if m.group(1) == "activation" else "B") + m.group(2)))
        if made:
            late += max(0.0, end - max(start, made[1]))
    own = lambda s, kind, k: (lambda e: (e[1] - e[0]) / 1000)(events[(s, f"{kind}{k}")])
    # The analytic ideals assume equal stages: each time is the mean of the two stages' medians,
    # so the stages' imbalance shows in @times - ideal, not in the ideal.
    f, b, w = (statistics.mean(t[i] for t in times) for i in range(3))
    res = {"comm_latency_ms": round(late / 1000, 2),
           "bubble_at_own_times": round(bubble_with_stage_times(schedule, micro_batches, own, split), 4),
           "fbw_ms_stage0": [round(x, 2) for x in times[0]], "fbw_ms_stage1": [round(x, 2) for x in times[1]],
           "bubble_at_stage_times": round(bubble_with_stage_times(schedule, micro_batches, times, split), 4),
           "bubble_ideal": round(ideal_bubble(f, b, w, micro_batches, split), 4)}
    if split:
        res["bubble_zb_h1"] = round(zb_h1_bubble(f, b, w, micro_batches), 4)
    return res


def run(tmp, tag, cfg_text, steps, trace, env):
    cfg = os.path.join(tmp, tag + ".pbtxt")
    with open(cfg, "w") as f:
        f.write(cfg_text.replace("TRACE", os.path.join(tmp, tag + "-trace")))
    out = os.path.join(tmp, tag)
    cmd = [os.path.join(BIN, "launcher/launcher"), "--nproc_per_node=2",
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
        res.update(trace_figures(os.path.join(tmp, tag + "-trace"), schedule, int(m[1:]),
                                 split="_split" in tag))
    return res


def main():
    global BIN  # --bin
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
    p.add_argument("--bin", default=BIN,
                   help="the built tree to run (launcher/launcher beside plugins/ and backends/); default "
                        "the workspace's bazel-bin. A copy keeps other builds from replacing it mid-run")
    a = p.parse_args()
    BIN = a.bin
    check_ideal()
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
                    strategy=f'parallel {{ pipeline: 2 }} strategy {{ name: "pipeline" '
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
        for key in ("bubble", "bubble_formula", "bubble_ideal", "bubble_zb_h1", "bubble_at_stage_times",
                    "bubble_at_own_times", "idle_stage0", "idle_stage1",
                    "outside_stage0", "comm_latency_ms", "activations_mib_stage0", "activations_mib_stage1"):
            vals = [x[key] for x in runs if key in x]
            if vals:
                row[key] = round(statistics.median(vals), 4)
        for stage in (0, 1):  # per-micro-batch F, B, W (ms), medians over the rounds
            vals = [x[f"fbw_ms_stage{stage}"] for x in runs if f"fbw_ms_stage{stage}" in x]
            if vals:
                row[f"fbw_ms_stage{stage}"] = [round(statistics.median(v[i] for v in vals), 2) for i in range(3)]
        if "bubble" in row:
            row["bubble_points_over_formula"] = round(100 * (row["bubble"] - row["bubble_formula"]), 1)
        if "bubble" in row and "bubble_ideal" in row:
            # Each schedule against its own ideal (unsplit: the formula; split: its own, lower).
            row["bubble_points_over_ideal"] = round(100 * (row["bubble"] - row["bubble_ideal"]), 1)
            row["within_2_points"] = row["bubble_points_over_ideal"] <= 2.0  # below it is better
        cuts = {x["cut"] for x in runs if "cut" in x}
        if cuts:
            row["cut"] = " / ".join(sorted(cuts))
        rows.append(row)
        print(json.dumps({"summary": True, **row}), flush=True)
    print(f"\nmedians of {a.rounds} round(s), {a.steps} steps each; load average before the runs: "
          f"{min(x['load1_before'] for v in results.values() for x in v)}-"
          f"{max(x['load1_before'] for v in results.values() for x in v)}")
    print(f"{'config':20} {'tok/s':>7} {'vs DDP':>6} {'bubble':>7} {'ideal':>6} {'over':>5} {'<=2pt':>5} "
          f"{'@times':>7} {'@own':>6} {'ZB-H1':>6} {'formula':>7} {'F/B/W ms s0':>16} {'F/B/W ms s1':>16} "
          f"{'idle s0':>7} {'idle s1':>7} {'outside':>7} {'lat ms':>6} {'act s0':>7} {'act s1':>7}")
    for row in rows:
        f = lambda k, scale=1, fmt="{:.1f}": fmt.format(row[k] * scale) if k in row else "-"
        fbw = lambda k: "/".join(f"{x:.2f}" for x in row[k]) if k in row else "-"
        ok = "-" if "within_2_points" not in row else ("yes" if row["within_2_points"] else "NO")
        print(f"{row['config']:20} {row['tokens_per_s']:7.0f} {f('vs_ddp', 1, '{:.2f}'):>6} "
              f"{f('bubble', 100):>7} {f('bubble_ideal', 100):>6} {f('bubble_points_over_ideal', 1, '{:+.1f}'):>5} "
              f"{ok:>5} {f('bubble_at_stage_times', 100):>7} {f('bubble_at_own_times', 100):>6} "
              f"{f('bubble_zb_h1', 100):>6} {f('bubble_formula', 100):>7} {fbw('fbw_ms_stage0'):>16} "
              f"{fbw('fbw_ms_stage1'):>16} {f('idle_stage0', 100):>7} {f('idle_stage1', 100):>7} "
              f"{f('outside_stage0', 100):>7} {f('comm_latency_ms'):>6} {f('activations_mib_stage0'):>7} "
              f"{f('activations_mib_stage1'):>7}")
    for row in rows:
        if "cut" in row:
            print(f"cut: {row['cut']}")
            break
    print("bubble: measured (the strategy's summary); ideal: the schedule's own with equal stages and "
          "instant messages, from the measured per-micro-batch F, B, W (mean of the stages' medians): "
          "(p-1)(F+B+W) idle unsplit, which is the formula (p-1)/(m+p-1), and (p-1)(F+B) with split "
          "backwards (W after the gradient is sent); over: points over the ideal; @times: the replayed schedule with each stage's median F, B, W (ideal + the stages' "
          "imbalance); @own: the same with each compute's own time (imbalance + jitter); ZB-H1: "
          "(p-1)(F+B-W) idle, a zero-bubble schedule's ideal with the same times (reference only; Braid's "
          "split schedule is not ZB-H1); formula: (p-1)/(m+p-1), the unsplit schedules' ideal; F/B/W ms: "
          "per micro-batch, B the whole backward unsplit; lat ms: per step, waits for messages after they "
          "were made (critical-path communication latency); outside: share of the step outside the "
          "schedule's span (not counted in the bubble)")


if __name__ == "__main__":
    main()
