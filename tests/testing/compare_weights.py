#!/usr/bin/env python3
"""Compares two safetensors files of floating tensors (F32, BF16 or F16, compared as f32): the
same names and shapes, every value finite, and every value within TOL (absolute). Prints the
worst difference and the tensor it is in.

Usage: compare_weights.py A B TOL [ULPS]   (exit 1 when they differ by more, or on a NaN or inf in
either, naming the tensors)

With ULPS, a value also passes when it is within ULPS units in the last place of the larger of
the two, in A's dtype: the bound for half-precision weights, each the rounding of an f32 master
that may sit next to a rounding boundary (one ulp of bf16 is 2^-7 at 1.0, 2^-9 at 0.25).

NumPy, not PyTorch: on the shared CI machine `import torch` alone took 16-20 s of wall time,
and the multi-process tests call this once per comparison (numpy: under 2 s).
"""
import json
import struct
import sys

import numpy as np


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
    _, e = np.frexp(np.abs(x))  # x = m * 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
    return np.power(np.float32(2.0), (np.maximum(e - 1, emin) - bits).astype(np.float32))


def as_f32(raw, dtype):
    """Little-endian bytes of `dtype` as float32 (bf16 is the top half of an f32)."""
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    sys.exit(f"unsupported dtype {dtype} (F32, BF16 or F16)")


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    return {k: as_f32(blob[v["data_offsets"][0]:v["data_offsets"][1]], v["dtype"]).reshape(v["shape"])
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
       for k in sorted(t) if not np.isfinite(t[k]).all()]
if bad:
    sys.exit(f"NaN or inf values: {', '.join(bad)}")
worst = max((float(np.abs(a[k] - b[k]).max(initial=0.0)), k) for k in a)
if len(sys.argv) > 4:
    ulps, dtype = float(sys.argv[4]), dtype_of(sys.argv[1])
    # The difference in ulps of the larger value, where it exceeds TOL.
    def beyond_tol(k):
        diff = np.abs(a[k] - b[k])
        ulps_k = diff / ulp(np.maximum(np.abs(a[k]), np.abs(b[k])), dtype)
        return float(np.where(diff <= tol, np.float32(0), ulps_k).max(initial=0.0))
    over = max((beyond_tol(k), k) for k in a)
    beyond = f"at most {over[0]:g} ulp of {dtype} ({over[1]})" if over[0] > 0 else "none"
    print(f"   max |difference| {worst[0]:.2e} ({worst[1]}); beyond tolerance {tol:g}: {beyond}, "
          f"allowed {ulps:g} ulp")
    sys.exit(0 if over[0] <= ulps else 1)
print(f"   max |difference| {worst[0]:.2e} ({worst[1]}), tolerance {tol:g}")
sys.exit(0 if worst[0] <= tol else 1)
