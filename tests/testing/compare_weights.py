#!/usr/bin/env python3
"""Compares two safetensors files of floating tensors (F32, BF16 or F16, compared as f32): the
same names and shapes, every value finite, and every value within TOL (absolute). Prints the
worst difference and the tensor it is in.

Usage: compare_weights.py A B TOL [ULPS]   (exit 1 when they differ by more, or on a NaN or inf in
either, naming the tensors)

With ULPS, a value also passes when it is within ULPS units in the last place of the larger of
the two, in A's dtype: the bound for half-precision weights, each the rounding of an f32 master
that may sit next to a rounding boundary (one ulp of bf16 is 2^-7 at 1.0, 2^-9 at 0.25).
"""
import json
import struct
import sys

import torch


DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


# Mantissa bits and the smallest normal exponent of each dtype, for ULPS.
FORMATS = {"F32": (23, -126), "BF16": (7, -126), "F16": (10, -14)}


def dtype_of(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return next(v["dtype"] for k, v in header.items() if k != "__metadata__")


def ulp(x, dtype):
    """One unit in the last place of |x| in `dtype` (subnormals have the smallest normal's)."""
    bits, emin = FORMATS[dtype]
    _, e = torch.frexp(x.abs())  # x = m * 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
    return torch.pow(2.0, (e - 1).clamp(min=emin).float() - bits)


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
if len(sys.argv) > 4:
    ulps, dtype = float(sys.argv[4]), dtype_of(sys.argv[1])
    # The difference in ulps of the larger value, where it exceeds TOL.
    over = max((((a[k] - b[k]).abs() / ulp(torch.maximum(a[k].abs(), b[k].abs()), dtype))
                .masked_fill((a[k] - b[k]).abs() <= tol, 0).max().item(), k) for k in a)
    beyond = f"at most {over[0]:g} ulp of {dtype} ({over[1]})" if over[0] > 0 else "none"
    print(f"   max |difference| {worst[0]:.2e} ({worst[1]}); beyond tolerance {tol:g}: {beyond}, "
          f"allowed {ulps:g} ulp")
    sys.exit(0 if over[0] <= ulps else 1)
print(f"   max |difference| {worst[0]:.2e} ({worst[1]}), tolerance {tol:g}")
sys.exit(0 if worst[0] <= tol else 1)
