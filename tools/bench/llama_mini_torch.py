#!/usr/bin/env python3
"""PyTorch twin of Braid's llama-mini (launcher/configs/llama-mini.pbtxt), the peer its throughput
is measured against: the same shape (4 layers, 4 query heads sharing 2 K/V heads, width 256,
SwiGLU 768, RMSNorm eps 1e-5, rotary positions theta 1e4 in Hugging Face's rotate_half layout,
untied head, byte vocabulary, context 128), the same per-rank sample stream and AdamW as
gpt_mini_torch.py (micro-batch 16, lr 1e-3, betas 0.9/0.95, weight decay 0.1 on matrices only).
Eager PyTorch, written the way Hugging Face's LlamaModel computes (K/V repeated for the query
heads, a boolean causal mask), one process.

  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 tools/bench/llama_mini_torch.py --steps 20

Prints one JSON object per step and a summary line (steady-state median step time and tokens/s).
"""
import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_mini_torch import SplitMix64, find_data  # noqa: E402  (the same data and sampler)


def build_model(torch):
    nn = torch.nn
    F = torch.nn.functional
    V, T, L, H, KV, C, I, EPS, THETA = 256, 128, 4, 4, 2, 256, 768, 1e-5, 10000.0
    D = C // H

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight

    inv = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos = torch.cat([ang, ang], -1).cos().float()[None, :, None, :]
    sin = torch.cat([ang, ang], -1).sin().float()[None, :, None, :]

    def rope(x):  # x [B, T, heads, D]
        t = x.shape[1]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos[:, :t] + torch.cat([-x2, x1], -1) * sin[:, :t]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(C, H * D, bias=False)
            self.k_proj = nn.Linear(C, KV * D, bias=False)
            self.v_proj = nn.Linear(C, KV * D, bias=False)
            self.o_proj = nn.Linear(H * D, C, bias=False)
            self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

        def forward(self, x):
            B, t, _ = x.shape
            q = rope(self.q_proj(x).view(B, t, H, D)).transpose(1, 2)
            k = rope(self.k_proj(x).view(B, t, KV, D)).transpose(1, 2)
            v = self.v_proj(x).view(B, t, KV, D).transpose(1, 2)
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
            att = (q @ k.transpose(-2, -1)) / (D ** 0.5)
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
            return self.o_proj((att @ v).transpose(1, 2).reshape(B, t, C))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(C, I, bias=False)
            self.up_proj = nn.Linear(C, I, bias=False)
            self.down_proj = nn.Linear(I, C, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm()
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, C)
            self.layers = nn.ModuleList([Layer() for _ in range(L)])
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(C, V, bias=False)
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx):
            x = self.embed_tokens(idx)
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(self.norm(x))

    return Llama()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=None, help="Moby Dick data.txt (default: data/ of the repo)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the throughput median")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    with open(find_data(args.data), "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long)
    N, T, B = len(data), 128, args.batch
    model = build_model(torch)
    n_params = sum(q.numel() for q in model.parameters())
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    rng = SplitMix64(1234)
    times, losses = [], []
    for step in range(args.steps):
        idx = [rng.next() % (N - T) for _ in range(B)]
        x = torch.stack([data[s:s + T] for s in idx])
        y = torch.stack([data[s + 1:s + T + 1] for s in idx])
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(loss.item())
        if not args.quiet:
            print(json.dumps({"step": step, "loss": round(loss.item(), 5),
                              "tokens_per_s": round(B * T / dt, 1)}), flush=True)
    steady = sorted(times[args.warmup:] or times)
    med = steady[len(steady) // 2]
    print(json.dumps({"summary": "torch-llama-mini", "parameters": n_params, "steps": args.steps,
                      "threads": args.threads, "final_loss": round(losses[-1], 5),
                      "median_step_s": round(med, 5), "tokens_per_s": round(B * T / med, 1),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
