#!/usr/bin/env python3
"""GPT-2 124M training throughput in PyTorch on one GPU, eager and torch.compile: the peer that
gpu_check.sh (run from the bundle, where this file is gpt2_torch_bench.py) sets beside Braid's run
of the same shape. Written for PyTorch 2.x with CUDA; never run by CI (its syntax is checked).

  python3 gpt2_gpu_bench.py [--steps 20] [--warmup 3] [--batch 16] [--seq 1024]
      [--dtype bf16|f32] [--modes eager,compile] [--sdpa] [--json FILE]
      [--braid_tokens_per_s N]

The model is GPT-2 small as Braid builds it (12 layers, 12 heads, 768 wide, vocabulary 50257,
tied embeddings, tanh GELU, pre-LayerNorm), trained with AdamW on random tokens (throughput does
not depend on the data), bf16 autocast by default. Attention is written out (softmax of masked
scores) unless --sdpa (torch's fused kernel). Each mode in --modes order gets a fresh model with
the same seed, --warmup untimed steps (compilation included), then --steps timed ones; its memory
is freed before the next mode.

For each mode: tokens/s (median step), MFU = tokens/s x FLOPs per token / the GPU's dense peak
(FLOPs per token = 6 x parameters + 12 x layers x seq x width, PaLM's appendix B count), and the
peak memory torch allocated. Dense peaks, without sparsity: H100/H200 SXM 989 TFLOP/s bf16 and
494.5 TF32 (f32 matmuls run as TF32 here), H100 PCIe 756 and 378, A100 312 and 156. --json
writes {"<mode>_tokens_per_s": ..., "<mode>_mfu": ..., "<mode>_peak_bytes": ..., ...}.
"""
import argparse
import gc
import json
import math
import statistics
import sys
import time

PEAKS_TFLOPS = [  # name fragment -> (bf16 dense, tf32 dense); the first that matches wins
    ("H100 PCIe", (756.0, 378.0)),
    ("H200", (989.0, 494.5)),
    ("H100", (989.0, 494.5)),
    ("A100", (312.0, 156.0)),
]


def build(torch, B, T, sdpa, dev):
    import torch.nn as nn
    import torch.nn.functional as F
    L, H, C, V = 12, 12, 768, 50257

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T), persistent=False)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
                att = att.masked_fill(self.mask == 0, float("-inf")).softmax(dim=-1)
                y = att @ v
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.register_buffer("pos", torch.arange(T), persistent=False)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(self.pos)
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied
            return F.cross_entropy(logits.view(-1, V).float(), targets.view(-1))

    torch.manual_seed(1234)
    return GPT().to(dev), (L, C, V)


def run_mode(torch, mode, a, dev):
    model, (L, C, V) = build(torch, a.batch, a.seq, a.sdpa, dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    step_fn = torch.compile(model) if mode == "compile" else model
    gen = torch.Generator(device=dev).manual_seed(1234)
    B, T = a.batch, a.seq
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, V, (B, T), device=dev, generator=gen)
        y = torch.randint(0, V, (B, T), device=dev, generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated()
    del model, opt, step_fn
    gc.collect()
    torch.cuda.empty_cache()
    tps = B * T / statistics.median(times)
    return tps, peak, n_params, 6 * n_params + 12 * L * T * C, losses


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dtype", choices=["f32", "bf16"], default="bf16")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--sdpa", action="store_true", help="use torch's fused attention")
    p.add_argument("--json", default=None, help="write the figures to this file")
    p.add_argument("--braid_tokens_per_s", type=float, default=None)
    a = p.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in ("eager", "compile")]
    if bad or not modes:
        print(f"gpt2_gpu_bench: --modes takes eager and/or compile, got {a.modes!r}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("gpt2_gpu_bench: PyTorch is not installed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("gpt2_gpu_bench: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAKS_TFLOPS if k in name), None)
    peak_tflops = None if peak is None else (peak[0] if a.dtype == "bf16" else peak[1])
    out = {"gpu": name, "torch": torch.__version__, "batch": a.batch, "seq": a.seq,
           "dtype": a.dtype, "steps": a.steps, "sdpa": a.sdpa, "peak_tflops": peak_tflops}

    def mfu(t, flops):
        return None if peak_tflops is None else t * flops / (peak_tflops * 1e12)

    for mode in modes:
        tps, mem, n_params, flops, losses = run_mode(torch, mode, a, dev)
        out.update({f"{mode}_tokens_per_s": round(tps, 1), f"{mode}_mfu": mfu(tps, flops),
                    f"{mode}_peak_bytes": mem, f"{mode}_final_loss": losses[-1],
                    "parameters": n_params, "flops_per_token": flops})
        m = mfu(tps, flops)
        print(f"pytorch {mode}: {tps:.0f} tokens/s, MFU "
              f"{'n/a (unknown GPU peak)' if m is None else f'{100 * m:.1f}%'}, "
              f"peak memory {mem / 2**30:.2f} GiB ({name}, B={a.batch} T={a.seq} {a.dtype})")
        if a.braid_tokens_per_s:
            print(f"  braid/pytorch {mode}: {a.braid_tokens_per_s / tps:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
