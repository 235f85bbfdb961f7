"""The Llama-family ops of the CPU backend against PyTorch 1.13 (the oracle), in float64.

llama_ops_dump wrote each op's f32 inputs, its output, the random projection R its backward
started from, and each input's gradient. Here PyTorch recomputes the same ops the way Hugging
Face's Llama does (RMSNorm in its float32-free textbook form, silu(gate) * up, rotate_half RoPE
with inv_freq = 1 / theta^(arange(0, D, 2) / D) and positions / scale, repeat_kv GQA with a
causal softmax) in float64 with autograd, and every value must agree within
|braid - torch| <= atol + rtol |torch|, rtol = 1e-5 and atol = 1e-6 (f32 kernels against
float64: a few f32 ulps of the values compared). NaN fails (the comparison is written so).
"""
import os
import sys

import torch

d = sys.argv[1]


def load(name, shape):
    with open(os.path.join(d, name + ".f32"), "rb") as f:
        data = bytearray(f.read())
    t = torch.frombuffer(data, dtype=torch.float32).to(torch.float64)
    return t.reshape(shape)


failures = []


def check(what, got, want, rtol=1e-5, atol=1e-6):
    err = (got - want).abs()
    allowed = atol + rtol * want.abs()
    # `not (err <= allowed)` is true for NaN, unlike err > allowed.
    bad = ~(err <= allowed)
    if bool(bad.any()):
        i = int(torch.nonzero(bad.flatten())[0])
        failures.append("%s: %d of %d elements differ, first at %d: braid %r, torch %r"
                        % (what, int(bad.sum()), got.numel(), i, float(got.flatten()[i]),
                           float(want.flatten()[i])))
    else:
        print("ok %-14s max |err| %.3g" % (what, float(err.max())))


def run(name, fn, shapes, out_shape):
    xs = [load("%s.%s" % (name, n), s).requires_grad_() for n, s in shapes]
    out = fn(*xs)
    r = load(name + ".r", out_shape)
    (out * r).sum().backward()
    check(name + " forward", load(name + ".out", out_shape), out.detach())
    for i, (x, (_, s)) in enumerate(zip(xs, shapes)):
        check("%s grad %d" % (name, i), load("%s.grad%d" % (name, i), s), x.grad)


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(x, theta=500000.0, scale=2.0, offset=4000):
    b, t, h, dim = x.shape
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    pos = (torch.arange(t, dtype=torch.float64) + offset) / scale
    emb = torch.cat((torch.outer(pos, inv_freq),) * 2, dim=-1)  # [T, D]
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    return x * cos + rotate_half(x) * sin


def gqa(q, k, v):
    b, t, h, dim = q.shape
    groups = h // k.shape[2]
    # repeat_kv: [B, T, Hkv, D] -> [B, T, H, D], head h reading K/V head h // groups.
    k = k.repeat_interleave(groups, dim=2)
    v = v.repeat_interleave(groups, dim=2)
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [B, H, T, D]
    s = q @ k.transpose(-1, -2) / dim ** 0.5
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2)


run("rmsnorm", rmsnorm, [("x", (3, 5, 64)), ("w", (64,))], (3, 5, 64))
run("swiglu", lambda g, u: torch.nn.functional.silu(g) * u,
    [("gate", (4, 96)), ("up", (4, 96))], (4, 96))
run("rope", rope, [("x", (2, 9, 3, 32))], (2, 9, 3, 32))
run("gqa", gqa, [("q", (2, 7, 6, 16)), ("k", (2, 7, 2, 16)), ("v", (2, 7, 2, 16))],
    (2, 7, 6, 16))

if failures:
    print("\n".join("FAIL " + f for f in failures))
    sys.exit(1)
