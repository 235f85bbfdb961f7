#!/usr/bin/env python3
"""Braid's GPT-2 tokenizer beside the tiktoken npm package (OpenAI's Rust tokenizer compiled to
WASM), same text, one core each (taskset -c 0), alternated round by round so that machine
noise hits both alike.

  bazel build //tools/bench:tokenizer_bench && /usr/bin/python3 tools/bench/tokenizer_bench.py

Texts: Moby Dick (1.2 MB, English), the Unicode stress text of tools/tokenize repeated to over
1 MB (mixed scripts, emoji, white space runs), and one "word" of random letters with no space
in it (1 MiB for Braid; 100 kB for tiktoken, whose merge loop is quadratic on it). Each process
times --reps encodes of the whole text after one warm-up and reports their median, by wall time
and by the process's CPU time (which leaves out time the scheduler gave to other work on a shared
machine); the table gives the medians over --rounds processes and the median of the per-round
ratios Braid / tiktoken (each round's pair ran back to back). Both produce the same
ids (tools/tokenize:reference_test); the token counts printed are checked equal here too.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODULES = os.path.join(REPO, "data", "node_modules")
BRAID = os.path.join(REPO, "bazel-bin", "tools", "bench", "tokenizer_bench")


def run(cmd):
    env = dict(os.environ, NODE_PATH=MODULES, BRAID_DATA_DIR=os.path.join(REPO, "data"))
    out = subprocess.run(["taskset", "-c", "0"] + cmd, env=env, check=True,
                         capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    r["median"] = statistics.median(r["mb_per_s"])
    r["cpu_median"] = statistics.median(r["mb_per_cpu_s"])
    return r


def braid(path, reps):
    return run([BRAID, "--tokenizer=gpt2", f"--reps={reps}", path])


def tiktoken(path, reps):
    return run(["node", os.path.join(HERE, "tiktoken_bench.js"), path, str(reps), "tiktoken"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not os.path.exists(BRAID):
        sys.exit("tokenizer_bench.py: build it first: bazel build //tools/bench:tokenizer_bench")
    tmp = tempfile.mkdtemp(prefix="tokenizer_bench.")
    moby = os.path.join(MODULES, "@stdlib", "datasets-moby-dick", "data", "data.txt")
    stress = os.path.join(tmp, "stress.txt")
    with open(os.path.join(REPO, "tools", "tokenize", "unicode_stress.txt"), "rb") as f:
        one = f.read()
    with open(stress, "wb") as f:
        f.write(one * (1_000_000 // len(one) + 1))
    rng = random.Random(1)
    words = {}
    for name, size in [("word_1MiB", 1 << 20), ("word_100kB", 100_000)]:
        words[name] = os.path.join(tmp, name + ".txt")
        with open(words[name], "w") as f:
            f.write("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(size)))

    rows = []
    for label, path in [("Moby Dick", moby), ("Unicode stress x%d" % (1_000_000 // len(one) + 1),
                                                 stress)]:
        b, t = [], []
        for _ in range(args.rounds):
            b.append(braid(path, args.reps))
            t.append(tiktoken(path, args.reps))
        if b[0]["tokens"] != t[0]["tokens"]:
            sys.exit(f"{label}: Braid made {b[0]['tokens']} tokens, tiktoken {t[0]['tokens']}")
        bm = statistics.median(r["median"] for r in b)
        tm = statistics.median(r["median"] for r in t)
        bc = statistics.median(r["cpu_median"] for r in b)
        tc = statistics.median(r["cpu_median"] for r in t)
        ratio = statistics.median(x["median"] / y["median"] for x, y in zip(b, t))
        cpu_ratio = statistics.median(x["cpu_median"] / y["cpu_median"] for x, y in zip(b, t))
        print(json.dumps({"text": label, "bytes": b[0]["bytes"], "tokens": b[0]["tokens"],
                          "braid_mb_s": [round(r["median"], 2) for r in b],
                          "tiktoken_mb_s": [round(r["median"], 2) for r in t],
                          "braid_mb_cpu_s": [round(r["cpu_median"], 2) for r in b],
                          "tiktoken_mb_cpu_s": [round(r["cpu_median"], 2) for r in t]}),
              flush=True)
        rows.append((label, b[0]["bytes"], b[0]["tokens"], bm, tm, ratio, bc, tc, cpu_ratio))
    # The long word: one timed encode each, 3 rounds.
    lb = statistics.median(braid(words["word_1MiB"], 1)["median"] for _ in range(3))
    lt = statistics.median(tiktoken(words["word_100kB"], 1)["median"] for _ in range(3))

    print("\n| text | bytes | tokens | Braid MB/s | tiktoken MB/s | ratio | "
          "Braid MB/CPU-s | tiktoken MB/CPU-s | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, nbytes, ntok, bm, tm, ratio, bc, tc, cpu_ratio in rows:
        print(f"| {label} | {nbytes:,} | {ntok:,} | {bm:.1f} | {tm:.2f} | {ratio:.1f}x | "
              f"{bc:.1f} | {tc:.2f} | {cpu_ratio:.1f}x |")
    print(f"\nOne word with no space (wall time): Braid {(1 << 20) / 1e6 / lb:.2f} s for 1 MiB; "
          f"tiktoken {0.1 / lt:.1f} s for 100 kB")

if __name__ == "__main__":
    main()
