#!/usr/bin/env python3
"""ZeRO-Infinity's parameter offload (zero_optimization.offload_param, plugins/zero/zero.cc)
against stage 3 on the device: what each rank holds where, beside the formula.

  bazel build //launcher:all //plugins/... && /usr/bin/python3 tools/bench/zero_offload_bench.py

gpt-mini (micro-batch 16, AdamW, f32) on N ranks (default 2, one thread each), --steps steps on
Moby Dick, three runs: stage 3 ("z3"), stage 3 with the parameters offloaded ("z3+param"), and
with the optimizer offloaded as well ("z3+param+optim", the same placement: offload_param already
steps the shards on the host). For each, the zero strategy's own bookkeeping (its "model state
per rank (peak)" line; the largest over the ranks) and the allocators' peaks (the "peak tensor
memory per device" line: the training device cpu:0, activations included, and the host
allocator, where offloaded state lives).

The formula (Psi parameters, units padded to a multiple of N, f32 AdamW: 4 bytes of parameters,
4 of gradients and 8 of moments per element):
  stage 3 on the device: parameters 4Psi/N (shards) + the units in use at once, gathered (the
    parameters outside the blocks, one block, one more block being prefetched); gradients 4Psi/N;
    optimizer 8Psi/N; host 0.
  offload_param: device parameters = the units in use + one block's shard in transit (copied in
    from the host for its all-gather); device gradients 4Psi/N; host: shards 4Psi/N + gradient
    copies 4Psi/N + optimizer 8Psi/N = 16Psi/N.
One JSON object per run on stdout, then a table.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV1 = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", BRAID_NUM_THREADS="1",
            BRAID_DATA_DIR=os.path.join(ROOT, "data"))
MIB = 2 ** 20
L, C, V, T = 4, 256, 256, 128  # gpt-mini (docs/MODELS.md)
RUNS = {"z3": "zero_optimization { stage: 3 }",
        "z3+param": 'zero_optimization { stage: 3 offload_param { device: "cpu" } }',
        "z3+param+optim": 'zero_optimization { stage: 3 offload_param { device: "cpu" } '
                          'offload_optimizer { device: "cpu" } }'}


def units():
    block = 12 * C * C + 13 * C  # ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj (+ biases)
    rest = V * C + T * C + 2 * C  # wte (tied head), wpe, ln_f
    return [rest] + [block] * L


def formula(run, n):
    pad = [math.ceil(u / n) * n for u in units()]
    shards = 4 * sum(pad) / n
    in_use = 4 * (pad[0] + 2 * pad[1])  # outside + one block + the prefetched one
    if run == "z3":
        return {"device_params": shards + in_use, "device_grads": shards, "device_optim": 2 * shards,
                "host": 0}
    return {"device_params": in_use + 4 * pad[1] / n, "device_grads": shards, "device_optim": 0,
            "host": 4 * shards}


STATE_RE = re.compile(r"model state per rank \(peak\): (.*); sum of peaks")
DEVICES_RE = re.compile(r"peak tensor memory per device: (.*)")


def run(name, n, steps, tmp, binary):
    text = open(os.path.join(ROOT, "launcher/configs/gpt-mini-zero3.pbtxt")).read()
    text, k = re.subn(r"zero_optimization \{ stage: 3 \}", RUNS[name], text)
    assert k == 1
    cfg = os.path.join(tmp, name.replace("+", "_") + ".pbtxt")
    open(cfg, "w").write(text)
    out = os.path.join(tmp, name.replace("+", "_"))
    cmd = [os.path.join(binary, "launcher/launcher"), f"--nproc_per_node={n}", f"--log_dir={out}-workers",
           "--", f"--config={cfg}", f"--steps={steps}", f"--log_dir={out}"]
    r = subprocess.run(cmd, env=ENV1, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"{name}: exit {r.returncode}: {(r.stdout + r.stderr)[-800:]}")
    res = {"run": name}
    for f in sorted(os.listdir(out)):
        if not (f.startswith("train") and f.endswith(".log")):
            continue
        log = open(os.path.join(out, f)).read()
        for m in STATE_RE.finditer(log):
            for part in m.group(1).split(", "):
                kind, mib = part.rsplit(" ", 2)[0], float(part.rsplit(" ", 2)[1])
                res[kind] = max(res.get(kind, 0), mib)
        for m in DEVICES_RE.finditer(log):
            for dev, mib in re.findall(r"(\S+) ([\d.]+) MiB", m.group(1)):
                if dev == "host":  # since the process started: where offloaded state lives
                    res["alloc host"] = max(res.get("alloc host", 0), float(mib))
    # The training device's allocator peak from the first step on, per rank (each rank's summary).
    for f in os.listdir(out):
        if f.startswith("metrics.jsonl"):
            for line in open(os.path.join(out, f)):
                x = json.loads(line)
                if x.get("summary"):
                    res["alloc cpu:0"] = max(res.get("alloc cpu:0", 0), round(x["peak_bytes"] / MIB, 1))
    res["formula"] = {k: round(v / MIB, 2) for k, v in formula(name, n).items()}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"),
                    help="the built tree (launcher/launcher beside plugins/ and backends/)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="zero_offload_bench_") as tmp:
        for name in RUNS:
            res = run(name, a.nproc, a.steps, tmp, a.bin)
            print(res, flush=True)
            rows.append(res)
    print(f"\nN = {a.nproc}, MiB per rank (measured / formula)")
    print("| run | device parameters | device gradients | device optimizer | host (shards + grads + optimizer) "
          "| alloc peak cpu:0 | alloc peak host |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        f = r["formula"]
        host = sum(v for k, v in r.items() if isinstance(v, float) and "(host)" in k)
        dev_optim = r.get("optimizer state", 0.0)
        print(f"| {r['run']} | {r['parameters']:.2f} / {f['device_params']:.2f} | {r['gradients']:.2f} / "
              f"{f['device_grads']:.2f} | {dev_optim:.2f} / {f['device_optim']:.2f} | {host:.2f} / "
              f"{f['host']:.2f} | {r.get('alloc cpu:0', 0):.1f} | {r.get('alloc host', 0):.1f} |")


if __name__ == "__main__":
    main()
