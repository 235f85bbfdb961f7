#!/usr/bin/env python3
"""Compares two safetensors files of floating tensors (F32, BF16 or F16, compared as f32): the
same names and shapes, every value finite, and every value within TOL (absolute). Prints the
worst difference and the tensor it is in.

Usage: compare_weights.py A B TOL   (exit 1 when they differ by more, or on a NaN or inf in either,
naming the tensors)
"""
import json
import struct
import sys

import torch


DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    return {k: torch.frombuffer(bytearray(blob[v["data_offsets"][0]:v["data_offsets"][1]]),
                                dtype=DTYPES[v["dtype"]]).reshape(v["shape"]).float()
            for k, v in header.items() if k != "__metadata__"}


a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if a.keys() != b.keys():
    sys.exit(f"different tensors: only in A {sorted(a.keys() - b.keys())}, "
             f"only in B {sorted(b.keys() - a.keys())}")
# Different shapes would broadcast in a[k] - b[k] instead of failing.
shapes = [f"{k} {list(a[k].shape)} vs {list(b[k].shape)}" for k in sorted(a)
          if a[k].shape != b[k].shape]
if shapes:
    sys.exit(f"different shapes: {', '.join(shapes)}")
# Before any difference: a NaN difference loses every comparison, so max() below can drop it
# (whether it does depends on the tensors' order), and the same inf in both files has a NaN
# difference. Two runs that both diverged are not equal.
bad = [f"{k} in {side} ({path})" for side, path, t in (("A", sys.argv[1], a), ("B", sys.argv[2], b))
       for k in sorted(t) if not torch.isfinite(t[k]).all()]
if bad:
    sys.exit(f"NaN or inf values: {', '.join(bad)}")
worst = max(((a[k] - b[k]).abs().max().item(), k) for k in a)
print(f"   max |difference| {worst[0]:.2e} ({worst[1]}), tolerance {tol:g}")
sys.exit(0 if worst[0] <= tol else 1)
