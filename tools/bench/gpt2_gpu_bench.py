#!/usr/bin/env python3
"""GPT-2 124M training throughput in PyTorch eager on one GPU: the peer tools/gpu_check.sh sets
beside Braid's run of the same shape. Needs PyTorch with CUDA and a GPU; never run by CI.

  python3 tools/bench/gpt2_gpu_bench.py --steps 20 --batch 16 --seq 1024 [--dtype f32|bf16]
      [--braid_tokens_per_s N]

The model is GPT-2 small as Braid builds it (12 layers, 12 heads, 768 wide, vocabulary 50257,
tied embeddings, tanh GELU, pre-LayerNorm), trained with AdamW on random tokens (throughput does
not depend on the data). Attention is written out (softmax of masked scores), as Braid's
reference kernels compute it, not torch's fused SDPA, unless --sdpa.

Prints tokens/s (median over the steps after --warmup) and MFU = tokens/s * FLOPs per token /
the GPU's dense peak, FLOPs per token = 6 * parameters + 12 * layers * seq * width (PaLM's
appendix B count, attention included). Peaks are dense, without sparsity: H100/H200 SXM 989 TFLOP/s
bf16 and 495 TF32 (f32 matmuls run as TF32 when allowed, as here), A100 312 and 156. With
--braid_tokens_per_s it also prints Braid's MFU and the ratio to PyTorch.
"""
import argparse
import math
import statistics
import sys
import time

PEAKS_TFLOPS = {  # name fragment -> (bf16 dense, tf32 dense)
    "H200": (989.0, 494.5),
    "H100": (989.0, 494.5),
    "A100": (312.0, 156.0),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--sdpa", action="store_true", help="use torch's fused attention")
    p.add_argument("--braid_tokens_per_s", type=float, default=None)
    a = p.parse_args()

    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        print("gpt2_gpu_bench: PyTorch is not installed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("gpt2_gpu_bench: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    L, H, C, V, T, B = 12, 12, 768, 50257, a.seq, a.batch

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if a.sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
                att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf")).softmax(dim=-1)
                y = att @ v
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(T, device=dev))
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    mask = torch.tril(torch.ones(T, T, device=dev)).view(1, 1, T, T)
    model = GPT().to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator(device=dev).manual_seed(1234)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if a.dtype == "bf16" else None

    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, V, (B, T), device=dev, generator=gen)
        y = torch.randint(0, V, (B, T), device=dev, generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if amp is not None:
            with amp:
                loss = model(x, y)
        else:
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)

    tps = B * T / statistics.median(times)
    flops_per_token = 6 * n_params + 12 * L * T * C
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAKS_TFLOPS.items() if k in name), None)
    peak_tflops = None if peak is None else (peak[0] if a.dtype == "bf16" else peak[1])

    def mfu(t):
        return "n/a (unknown GPU peak)" if peak_tflops is None else \
            f"{100 * t * flops_per_token / (peak_tflops * 1e12):.1f}%"

    print(f"gpt2_gpu_bench: {name}, {n_params / 1e6:.1f}M parameters, B={B} T={T} {a.dtype}, "
          f"peak {peak_tflops} TFLOP/s")
    line = f"pytorch eager: {tps:.0f} tokens/s, MFU {mfu(tps)}"
    if a.braid_tokens_per_s:
        t = a.braid_tokens_per_s
        line += f"; braid: {t:.0f} tokens/s, MFU {mfu(t)}, braid/pytorch {t / tps:.2f}x"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
