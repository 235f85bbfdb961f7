#!/usr/bin/env bash
# The parameter server over Gloo, real processes through the launcher, against one process on
# the same global batch. The server trains on no data; its W workers are the data-parallel group
# and read what W DDP ranks read, so in sync mode W workers with micro-batch b and accumulation k
# must reach the parameters one process reaches with batch W*k*b (the server averages the
# workers' mean gradients, as DDP does).
#
# Plain SGD (no momentum, no decay) steps by lr * gradient, so a wrong scale (a worker counted
# twice, the server's own thrown-away batch averaged in, the 1/k of accumulation) or the wrong
# data moves the parameters by ~1e-3; rounding (the sums taken in another order) leaves a few
# f32 ulps. With one worker nothing is summed at all: the run must equal one process exactly.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" paramserver_eq

mlp_cfg() {  # FILE MICRO ACCUM STRATEGY [STRATEGY_OPTIONS]
  cat > "$1" <<CFG
model { name: "mlp" }
data { dataset: "mnist" seed: 7 }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: $3
steps: 5
optimizer { type: "SGD" params { lr: 0.1 } }
strategy { name: "$4" ${5:-} }
CFG
}
opt() { echo "options { key: \"$1\" value: \"$2\" }"; }

# Each step's loss and grad_norm in rank 0's metrics (the server's: the mean of its workers'
# losses, the norm of the gradient it applied) against the single run's. The metrics file prints
# 6 significant digits (5e-6 relative each); bound 2e-5.
metrics_match() {  # NAME A_DIR B_DIR
  if /usr/bin/python3 - "$2/metrics.jsonl" "$3/metrics.jsonl" <<'PY'; then echo "ok   $1"; else fail "$1"; fi
import json, math, sys
def rows(path):
    return [json.loads(l) for l in open(path) if '"step"' in l]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert len(a) == len(b) > 0, (len(a), len(b))
for key in ("loss", "grad_norm"):
    x, y = [r[key] for r in a], [r[key] for r in b]
    # Written so that NaN or inf on either side fails: (d <= bound) is false for NaN.
    worst = max(abs(p - q) / abs(q) if q != 0 else math.inf for p, q in zip(x, y))
    print(f"   {key} per step {x}; max relative difference {worst:.2e}")
    assert all(math.isfinite(v) for v in x + y) and worst <= 2e-5, (key, x, y)
PY
}

mlp_cfg "$T/single32.pbtxt" 32 1 single
mlp_cfg "$T/single64.pbtxt" 32 2 single
mlp_cfg "$T/sync32.pbtxt" 32 1 paramserver
mlp_cfg "$T/sync16x2.pbtxt" 16 2 paramserver
mlp_cfg "$T/sync16x2_server1.pbtxt" 16 2 paramserver "$(opt server_rank 1)"
mlp_cfg "$T/async32.pbtxt" 32 1 paramserver "$(opt mode async) $(opt max_staleness 0)"
mlp_cfg "$T/async16_stale1.pbtxt" 16 1 paramserver "$(opt mode async) $(opt max_staleness 1)"

run_single single32 "$T/single32.pbtxt"
run_single single64 "$T/single64.pbtxt"
run_ranks sync_1worker 2 "$T/sync32.pbtxt"
run_ranks async_1worker 2 "$T/async32.pbtxt"
run_ranks sync_2workers 3 "$T/sync16x2.pbtxt"
run_ranks sync_2workers_server1 3 "$T/sync16x2_server1.pbtxt"
run_ranks async_2workers 3 "$T/async16_stale1.pbtxt"

# One worker: the server applies exactly the worker's gradient, which is exactly one process's.
compare "sync, 1 worker x 32 == 1 x 32, bit for bit" "$T/sync_1worker.safetensors" "$T/single32.safetensors" 0
compare "async (max_staleness 0), 1 worker x 32 == 1 x 32, bit for bit" "$T/async_1worker.safetensors" "$T/single32.safetensors" 0
metrics_match "sync, 1 worker: loss and grad_norm per step == one process's" "$T/sync_1worker" "$T/single32"
# Two workers: (g0 + g1) / 2 against the mean over 64 rows; rounding only. Bound 5e-8, as DDP's
# plain-SGD comparisons (two ulps of fc2's weights).
compare "sync, 2 workers x 16 x accumulation 2 == 1 x 64" "$T/sync_2workers.safetensors" "$T/single64.safetensors" 5e-8
compare "sync, server rank 1 (workers 0 and 2) == 1 x 64" "$T/sync_2workers_server1.safetensors" "$T/single64.safetensors" 5e-8
metrics_match "sync, 2 workers: loss and grad_norm per step == one process's" "$T/sync_2workers" "$T/single64"
# Async with two workers applies each gradient on arrival, in an order no test can fix, so no
# one-process run is its twin. What must hold: it trains (the loss falls), and the server applied
# both workers' gradients of every step, never one lagging more than the bound allows (the
# summary line the plugin prints from its counters).
if /usr/bin/python3 - "$T/async_2workers/metrics.jsonl" "$T/async_2workers.out" <<'PY'; then echo "ok   async, 2 workers: trains, every gradient applied"; else fail "async, 2 workers"; fi
import json, math, re, sys
loss = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"step"' in l]
print(f"   loss per step {loss}")
assert len(loss) == 5 and all(math.isfinite(x) for x in loss) and loss[-1] < loss[0], loss
out = open(sys.argv[2]).read()
m = re.search(r"paramserver: .*?(\d+) gradients applied", out)
assert m, "no paramserver summary line in the launcher's output"
print("  ", m.group(0))
assert int(m.group(1)) == 5 * 2, m.group(0)
PY
finish
