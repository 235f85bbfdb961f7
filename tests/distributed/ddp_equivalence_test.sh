#!/usr/bin/env bash
# DDP over Gloo, real processes through the launcher, against one process on the same global
# batch: N ranks with micro-batch b (and accumulation k) must reach the parameters one process
# reaches with batch N*k*b. The sequential loader makes that the same data: rank r of N reads
# rows [r*b, (r+1)*b) of each N*b-row block, which one process reads as one batch. MNIST's
# distributed sampler gives the ranks disjoint halves of the same samples the single run takes
# (with accumulation k, rank r's k micro-batches of a step interleave with the others' into the
# single run's N*k*b samples of that step).
#
# Tolerances are a few times what each comparison achieves (printed as "max |difference|"): the
# runs are deterministic, and only f32 rounding of sums taken in another order separates them.
#
# Two shards (BUILD shard_count): gpt-mini's runs, and the MLP's; no run is shared between them.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" ddp_eq
shards 2
gpt_cfg() {  # FILE MICRO ACCUM STRATEGY
  cat > "$1" <<CFG
model { name: "gpt-mini" }
data { dataset: "moby-dick" sampler: "sequential" }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: $3
steps: 5
optimizer { type: "AdamW" params { lr: 1e-3 betas: [0.9, 0.95] eps: 1e-8 weight_decay: 0.1 } }
strategy { name: "$4" }
CFG
}
mlp_cfg() {  # FILE MICRO STRATEGY OPTIMIZER [ACCUM [STRATEGY_OPTIONS]]
  local opt
  case "$4" in
    sgd) opt='type: "SGD" params { lr: 0.1 momentum: 0.9 }' ;;
    plain_sgd) opt='type: "SGD" params { lr: 0.1 }' ;;  # no momentum, no decay: lr * gradient
    adamw) opt='type: "AdamW" params { lr: 1e-3 }' ;;
  esac
  cat > "$1" <<CFG
model { name: "mlp" }
data { dataset: "mnist" seed: 7 }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: ${5:-1}
steps: 5
optimizer { $opt }
strategy { name: "$3" ${6:-} }
CFG
}
# Small buckets for the MLP (fc2.bias 40 B, fc2.weight 5 KiB, fc1.bias 512 B, fc1.weight 392 KiB):
# four buckets of one parameter each, reduced in turn while backward runs. Each rank's timeline
# is written, so that buckets_used can check that several buckets were really reduced.
small_buckets() {  # NAME
  echo "options { key: \"bucket_cap_mb\" value: \"0.004\" }" \
    "options { key: \"first_bucket_mb\" value: \"0.0001\" }" \
    "options { key: \"trace_file\" value: \"$T/$1-trace-{rank}.json\" }"
}
# Every rank reduced at least MIN buckets in every one of the STEPS steps (from its timeline).
buckets_used() {  # NAME RANKS STEPS MIN
  /usr/bin/python3 - "$T/$1-trace" "$2" "$3" "$4" <<'PY' || fail "$1: buckets"
import collections, json, sys
prefix, ranks, steps, least = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for r in range(ranks):
    events = json.load(open(f"{prefix}-{r}.json"))["traceEvents"]
    per_step = collections.defaultdict(set)
    for e in events:
        if e.get("name") == "allreduce":
            per_step[e["args"]["step"]].add(e["args"]["bucket"])
    counts = [len(per_step[s]) for s in range(steps)]
    print(f"   rank {r}: buckets reduced per step {counts}")
    assert min(counts) >= least, counts
PY
}
# Each step's grad_norm in rank 0's metrics (DDP's is that of the averaged gradient) against the
# single run's, clipping off. The metrics file prints 6 significant digits (5e-6 relative each).
norms_match() {  # NAME A_DIR B_DIR
  /usr/bin/python3 - "$2/metrics.jsonl" "$3/metrics.jsonl" <<'PY' || { fail "$1: grad_norm"; return; }
import json, math, sys
def norms(path):
    return [json.loads(l)["grad_norm"] for l in open(path) if '"step"' in l]
a, b = norms(sys.argv[1]), norms(sys.argv[2])
assert len(a) == len(b) > 0, (a, b)
# max() keeps a NaN only when it comes first: every norm must be finite before it is compared.
assert all(math.isfinite(v) for v in a + b), (a, b)
worst = max(abs(x - y) / y for x, y in zip(a, b))
print(f"   grad_norm per step {a}; max relative difference {worst:.2e}")
assert min(b) > 0 and worst <= 2e-5, (a, b)
PY
  echo "ok   $1"
}

if shard 0; then
  gpt_cfg "$T/g_single8.pbtxt" 8 1 single
  gpt_cfg "$T/g_ddp4.pbtxt" 4 1 ddp
  gpt_cfg "$T/g_single12.pbtxt" 12 1 single
  gpt_cfg "$T/g_ddp2x2.pbtxt" 2 2 ddp
  run_single g_single8 "$T/g_single8.pbtxt"
  run_ranks g_ddp2 2 "$T/g_ddp4.pbtxt"
  run_single g_single12 "$T/g_single12.pbtxt"
  run_ranks g_ddp3 3 "$T/g_ddp4.pbtxt"
  run_ranks g_ddp2_accum2 2 "$T/g_ddp2x2.pbtxt"
fi
if shard 1; then
  mlp_cfg "$T/m_single32.pbtxt" 32 single sgd
  mlp_cfg "$T/m_ddp16.pbtxt" 16 ddp sgd
  mlp_cfg "$T/ma_single32.pbtxt" 32 single adamw
  mlp_cfg "$T/ma_single48.pbtxt" 48 single adamw
  mlp_cfg "$T/ma_ddp16.pbtxt" 16 ddp adamw
  mlp_cfg "$T/mp_single64.pbtxt" 64 single plain_sgd
  mlp_cfg "$T/mp_single96.pbtxt" 96 single plain_sgd
  mlp_cfg "$T/mp_ddp2.pbtxt" 16 ddp plain_sgd 2 "$(small_buckets mp_ddp2)"
  mlp_cfg "$T/mp_ddp3.pbtxt" 16 ddp plain_sgd 2 "$(small_buckets mp_ddp3)"
  run_single m_single32 "$T/m_single32.pbtxt"
  run_ranks m_ddp2 2 "$T/m_ddp16.pbtxt"
  run_single ma_single32 "$T/ma_single32.pbtxt"
  run_single ma_single48 "$T/ma_single48.pbtxt"
  run_ranks ma_ddp2 2 "$T/ma_ddp16.pbtxt"
  run_ranks ma_ddp3 3 "$T/ma_ddp16.pbtxt"
  run_single mp_single64 "$T/mp_single64.pbtxt"
  run_single mp_single96 "$T/mp_single96.pbtxt"
  run_ranks mp_ddp2 2 "$T/mp_ddp2.pbtxt"
  run_ranks mp_ddp3 3 "$T/mp_ddp3.pbtxt"
fi

# AdamW turns rounding-sized gradients into lr-sized steps (its update is ~lr * sign(g) where
# |g| is tiny), so AdamW runs may differ by a fraction of lr (1e-3) after 5 steps; how much
# depends on how many gradient elements are rounding-sized, hence per-comparison bounds, each
# 2.5-4x the difference measured (in brackets). A systematic error (a wrong share or data) moves
# parameters by whole lr's. SGD keeps rounding at rounding size and must agree to a few f32 ulps.
if shard 0; then
  compare "gpt-mini: 2 ranks x 4 == 1 x 8" "$T/g_ddp2.safetensors" "$T/g_single8.safetensors" 1e-4  # [2.4e-5]
  compare "gpt-mini: 3 ranks x 4 == 1 x 12" "$T/g_ddp3.safetensors" "$T/g_single12.safetensors" 5e-4  # [2.0e-4]
  compare "gpt-mini: 2 ranks x 2 x accumulation 2 == 1 x 8" "$T/g_ddp2_accum2.safetensors" "$T/g_single8.safetensors" 1e-4  # [2.6e-5]
  grep -h "exposed communication" "$T"/g_ddp2.out | head -1
fi
if shard 1; then
  compare "mlp: 2 ranks x 16 == 1 x 32 (SGD)" "$T/m_ddp2.safetensors" "$T/m_single32.safetensors" 1e-7  # [3.0e-8]
  compare "mlp: 2 ranks x 16 == 1 x 32 (AdamW)" "$T/ma_ddp2.safetensors" "$T/ma_single32.safetensors" 1.5e-6  # [4.0e-7]
  compare "mlp: 3 ranks x 16 == 1 x 48 (AdamW)" "$T/ma_ddp3.safetensors" "$T/ma_single48.safetensors" 4e-5  # [1.4e-5]
  # Plain SGD steps by lr * gradient, so unlike AdamW it sees a wrong gradient scale (the 1/k of
  # accumulation, the 1/N of the average) or a lost bucket: those move parameters by ~1e-3, while
  # rounding leaves 1.5e-8 (two ulps of fc2's weights); bound 5e-8.
  buckets_used mp_ddp2 2 5 3
  buckets_used mp_ddp3 3 5 3
  compare "mlp: 2 ranks x 16 x accumulation 2, 4 buckets == 1 x 64 (plain SGD)" "$T/mp_ddp2.safetensors" "$T/mp_single64.safetensors" 5e-8
  compare "mlp: 3 ranks x 16 x accumulation 2, 4 buckets == 1 x 96 (plain SGD)" "$T/mp_ddp3.safetensors" "$T/mp_single96.safetensors" 5e-8
  norms_match "mlp: grad_norm of 2 ranks x 16 x 2 == of 1 x 64" "$T/mp_ddp2" "$T/mp_single64"
  norms_match "mlp: grad_norm of 3 ranks x 16 x 2 == of 1 x 96" "$T/mp_ddp3" "$T/mp_single96"
fi
finish
