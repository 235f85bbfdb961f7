#!/usr/bin/env python3
"""torch.distributed over Gloo (PyTorch 1.13): allreduce / reduce_scatter / allgather bus
bandwidth on N local processes, the peer of Braid's //backends/gloo:gloo_bench. One JSON object
per (op, size); bus bandwidth as nccl-tests defines it (allreduce: bytes * 2(n-1)/n / time;
reduce_scatter and allgather: bytes * (n-1)/n / time, bytes = the full buffer).

  /usr/bin/python3 tools/bench/comm_torch.py --world_size 2
"""
import argparse
import json
import os
import statistics
import sys
import time

from gpt_mini_torch import spawn_ranks  # noqa: E402  (one process per rank)


def worker(rank, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port),
                      OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    n = args.world_size
    sizes = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    for op in args.ops.split(","):
        for nbytes in sizes:
            numel = nbytes // 4
            numel -= numel % n
            buf = torch.ones(numel)
            chunks = list(torch.ones(numel).chunk(n))
            out = torch.empty(numel // n)

            def once():
                if op == "allreduce":
                    dist.all_reduce(buf)
                elif op == "allgather":
                    dist.all_gather(chunks, buf[: numel // n])
                elif op == "reduce_scatter":
                    dist.reduce_scatter(out, chunks)
            try:
                once()
            except RuntimeError as e:
                if rank == 0:
                    print(json.dumps({"impl": "torch-gloo", "op": op, "bytes": nbytes,
                                      "error": str(e).splitlines()[0][:120]}), flush=True)
                break
            reps = max(3, min(200, int(64 << 20) // nbytes))
            times = []
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                once()
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            factor = 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n
            if rank == 0:
                print(json.dumps({"impl": "torch-gloo", "op": op, "bytes": numel * 4,
                                  "ranks": n, "median_us": round(med * 1e6, 1),
                                  "busbw_gbps": round(numel * 4 * factor / med / 1e9, 3)}),
                      flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world_size", type=int, default=2)
    p.add_argument("--port", type=int, default=29541)
    p.add_argument("--ops", default="allreduce,reduce_scatter,allgather")
    a = p.parse_args()
    sys.exit(spawn_ranks(worker, a, a.world_size))


if __name__ == "__main__":
    main()
