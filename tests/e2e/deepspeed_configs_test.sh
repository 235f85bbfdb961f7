#!/usr/bin/env bash
# DeepSpeed configs as people write them (launcher/configs/deepspeed/: Hugging Face's ZeRO-2 with
# CPU offload and "auto" values; ZeRO-2 + CPU offload + fp16 + WarmupLR in DeepSpeed's own
# spelling; Hugging Face's ZeRO-3 with "auto" values, its optimizer and parameters offloaded;
# ZeRO-3 + parameter offload (ZeRO-Infinity) + bf16 + WarmupDecayLR; ZeRO-1 + bf16 +
# WarmupCosineLR with DeepSpeed's monitoring: tensorboard, csv_monitor, wall_clock_breakdown)
# train as written: 2 processes through the launcher, 3 steps each. Every config must pick the
# zero strategy from its zero_optimization section alone (no strategy named), print what it
# resolved or accepted without effect once, and finish with a finite loss.
# Each run's time is bounded by the target's own timeout (lib.sh).
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" deepspeed_configs
dir="$TEST_SRCDIR/braid/launcher/configs/deepspeed"
check() {  # NAME PATTERN: the run's output has a line matching PATTERN
  grep -qE -- "$2" "$T/$1.out" && echo "ok   $1: $(grep -E -- "$2" "$T/$1.out" | head -1 | cut -c1-150)" ||
    fail "$1: no line matches /$2/"
}
for name in hf_zero2_offload zero2_offload_fp16_warmup hf_zero3_auto zero3_param_offload zero1_bf16_monitored; do
  bounded "$L" --nproc_per_node=2 --log_dir="$T/$name.logs" -- --config="$dir/$name.json" \
    --steps=3 --log_dir="$T/$name" > "$T/$name.out" 2>&1
  rc=$?
  if [ "$rc" != 0 ]; then
    fail "$name: launcher $(ended $rc)"; tail -15 "$T/$name.out"; continue
  fi
  check "$name" '^braid: training gpt-mini .* strategy zero,'
  check "$name" '^braid: done: 3 steps'
  check "$name" '^braid: config: zero_optimization\.reduce_bucket_size: (accepted, no effect in Braid|"auto" left unset)'
  # The notes come once per job (rank 0), not once per process.
  n=$(grep -c '^braid: config: zero_optimization.reduce_bucket_size' "$T/$name.out")
  [ "$n" = 1 ] || fail "$name: the reduce_bucket_size note printed $n times, want 1"
  /usr/bin/python3 - "$T/$name/metrics.jsonl" "$name" <<'PY' || fail "$name: metrics"
import json, math, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
assert len(steps) == 3, len(steps)
assert all(math.isfinite(s["loss"]) for s in steps), [s["loss"] for s in steps]
print(f"   {sys.argv[2]}: losses {[round(s['loss'], 4) for s in steps]}, lr {[s['lr'] for s in steps]}")
PY
done
check hf_zero2_offload '^braid: config: optimizer\.params\.lr = 0\.001 \("auto"'
check hf_zero2_offload '^braid: config: zero_optimization\.offload_optimizer\.pin_memory: no effect on a CPU run'
check zero2_offload_fp16_warmup 'optimizer state \(host\)'
check hf_zero3_auto '^braid: config: optimizer\.params\.lr = 0\.001 \("auto"'
check hf_zero3_auto '^braid: config: zero_optimization\.stage3_max_live_parameters: accepted, no effect in Braid'
check hf_zero3_auto 'optimizer state \(host\)'
check hf_zero3_auto 'parameter shards \(host\)'
# ZeRO-Infinity: the shards on the host, the device holding only the layers in use.
check zero3_param_offload '^braid: mixed precision: bf16 parameters'
check zero3_param_offload 'parameter shards \(host\)'
check zero3_param_offload 'optimizer state \(host\)'
check zero3_param_offload '^braid: config: zero_optimization\.offload_param\.pin_memory: no effect on a CPU run'
check zero1_bf16_monitored '^braid: mixed precision: bf16 parameters'
check zero1_bf16_monitored "^braid: monitors: TensorBoard events in $T/zero1_bf16_monitored/zero1_bf16/events\.out\.tfevents\.[^,]*, CSV files in $T/zero1_bf16_monitored/zero1_bf16\$"
# steps_per_print 10 over 3 steps: the timer line after step 1 and after the last, steps 2-3.
check zero1_bf16_monitored '^braid: steps 1-1: rank=0 time \(ms\) \| fwd: [0-9.]+ \| bwd: [0-9.]+ \| bwd_inner: [0-9.]+ \| bwd_allreduce: [0-9.]+ \| step: [0-9.]+$'
check zero1_bf16_monitored '^braid: steps 2-3: rank=0 time \(ms\)'
rows=$(tail -n +2 "$T/zero1_bf16_monitored/zero1_bf16/Train_Samples_train_loss.csv" 2>/dev/null | cut -d, -f1 | tr '\n' ' ')
[ "$rows" = "32 64 96 " ] && echo "ok   zero1_bf16_monitored: Train_Samples_train_loss.csv at samples $rows" ||
  fail "zero1_bf16_monitored: train_loss CSV rows at samples '$rows', want 32 64 96"
check zero2_offload_fp16_warmup '^braid: mixed precision: f16 parameters'
# WarmupLR, linear, 20 steps from 0 to 1e-3: steps 0, 1, 2 run at 0, 5e-5 and 1e-4 (DeepSpeed's
# warm-up counts a step of at least 2; lr_schedule_test checks the formula itself).
/usr/bin/python3 - "$T/zero2_offload_fp16_warmup/metrics.jsonl" <<'PY' || fail "WarmupLR rates"
import json, sys
lr = [json.loads(l)["lr"] for l in open(sys.argv[1]) if '"step"' in l]
want = [0.001 * s / 20 for s in range(3)]
assert all(abs(a - b) <= 1e-9 for a, b in zip(lr, want)), (lr, want)
print("   WarmupLR rates", lr)
PY
finish
