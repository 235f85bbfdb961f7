#!/usr/bin/env python3
"""Checkpoint speed: saving and loading a GPT-2 124M training checkpoint (parameters + AdamW
state, ~1.5 GB) beside this disk's raw sequential write (dd with fdatasync), and the time an
asynchronous save blocks training.

Runs, in one process (1 thread), in a scratch folder under --dir (default: a temporary folder on
the disk the checkpoints would go to):
  1. dd of 1 GiB of random bytes (from the page cache), conv=fdatasync -> raw write GB/s
  2. gpt2-124m, 1 step, checkpoint at the end (synchronous)       -> save GB/s, blocked time
  3. the same config again: resumes (reads each file once, checking its CRC as it reads) -> load GB/s
  4. gpt2-124m, 3 steps, a checkpoint every step, async           -> blocked time per save
Prints one JSON line per measurement and a summary line. Usage (from the repository root, after
`bazel build //launcher:all //plugins/...`):  python3 tools/bench/ckpt_bench.py [--rounds N]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "bazel-bin/launcher/train")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
           BRAID_DATA_DIR=os.path.join(ROOT, "data"))
SAVED = re.compile(r"checkpoints: (\d+) saved in \S+ \(the last: ([\d.]+) MiB from this rank, written in (\d+) ms\); "
                   r"training blocked (\d+) ms per save")
LOADED = re.compile(r"resumed from \S+ \(step \d+ of \d+\); checked and loaded ([\d.]+) MiB in ([\d.]+) s")


def config(path, ckpt, every, asynchronous):
    with open(path, "w") as f:
        f.write(f"""model {{ name: "gpt2-124m" }}
train_micro_batch_size_per_gpu: 1
optimizer {{ type: "AdamW" params {{ lr: 1e-4 }} }}
checkpoint {{ dir: "{ckpt}" every_steps: {every} keep_last: 1 async: {str(asynchronous).lower()} }}
""")


def train(cfg, steps, log):
    r = subprocess.run([TRAIN, f"--config={cfg}", f"--steps={steps}", f"--log_dir={log}"], env=ENV,
                       capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"train failed: {(r.stdout + r.stderr)[-1500:]}")
    return r.stdout


def dd(path):
    # Random bytes (a virtual disk may compress or skip zeros), read from the page cache.
    src = path + ".src"
    if not os.path.exists(src):
        with open(src, "wb") as f:
            for _ in range(64):
                f.write(os.urandom(16 << 20))
    r = subprocess.run(["dd", f"if={src}", f"of={path}", "bs=1M", "conv=fdatasync"],
                       capture_output=True, text=True)
    os.remove(path)
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", r.stderr)
    return int(m.group(1)) / float(m.group(2)) / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dir", default=None, help="scratch folder (on the disk to measure)")
    a = p.parse_args()
    if not os.access(TRAIN, os.X_OK):
        sys.exit(f"{TRAIN} not found: run `bazel build //launcher:all //plugins/...` first")
    scratch = tempfile.mkdtemp(dir=a.dir)
    out = {"dd_gb_s": [], "save_gb_s": [], "save_blocked_s": [], "load_gb_s": [], "async_blocked_s": [], "mib": None}
    try:
        for rnd in range(a.rounds):
            out["dd_gb_s"].append(dd(os.path.join(scratch, "dd.bin")))
            print(json.dumps({"round": rnd, "dd_gb_s": round(out["dd_gb_s"][-1], 3)}), flush=True)
            ckpt = os.path.join(scratch, f"sync{rnd}")
            cfg = os.path.join(scratch, "sync.pbtxt")
            config(cfg, ckpt, 1, False)
            m = SAVED.search(train(cfg, 1, os.path.join(scratch, f"s{rnd}")))
            mib, write_ms, blocked_ms = float(m.group(2)), int(m.group(3)), int(m.group(4))
            out["mib"] = mib
            out["save_gb_s"].append(mib * 2**20 / (write_ms / 1e3) / 1e9)
            out["save_blocked_s"].append(blocked_ms / 1e3)
            m = LOADED.search(train(cfg, 1, os.path.join(scratch, f"l{rnd}")))
            out["load_gb_s"].append(float(m.group(1)) * 2**20 / float(m.group(2)) / 1e9)
            shutil.rmtree(ckpt)
            acfg = os.path.join(scratch, "async.pbtxt")
            config(acfg, os.path.join(scratch, f"async{rnd}"), 1, True)
            m = SAVED.search(train(acfg, 3, os.path.join(scratch, f"a{rnd}")))
            out["async_blocked_s"].append(int(m.group(4)) / 1e3)
            shutil.rmtree(os.path.join(scratch, f"async{rnd}"))
            print(json.dumps({"round": rnd, "checkpoint_mib": mib, "save_gb_s": round(out["save_gb_s"][-1], 3),
                              "save_blocked_s": out["save_blocked_s"][-1], "load_gb_s": round(out["load_gb_s"][-1], 3),
                              "async_blocked_s_per_save": out["async_blocked_s"][-1]}), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    summary = {"summary": True, "checkpoint_mib": out["mib"], **{f"median_{k}": round(med(v), 3)
                                                              for k, v in out.items() if isinstance(v, list)}}
    summary["save_vs_dd"] = round(summary["median_save_gb_s"] / summary["median_dd_gb_s"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
