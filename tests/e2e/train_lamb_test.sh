#!/usr/bin/env bash
# A DeepSpeed JSON with optimizer { "type": "Lamb" } trains through the real training program,
# which loads plugin "lamb" by that name, and Lamb's state is checkpointed with the run: 4 steps
# straight give the same weights, bit for bit, as 2 steps, a checkpoint, and a resumed run to 4
# (the moments and the step count come back; a resume without them would differ at step 3).
# The training program finds the plugin among its own (launcher/plugins.bzl), by the type's name.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" train_lamb
cfg() {  # FILE STEPS CHECKPOINT_DIR
  cat > "$1" <<JSON
{
  "model": {"name": "mlp"},
  "data": {"dataset": "mnist", "seed": 7},
  "train_batch_size": 32,
  "train_micro_batch_size_per_gpu": 32,
  "steps": $2,
  "optimizer": {"type": "Lamb", "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
                "weight_decay": 0.01, "max_coeff": 10.0, "min_coeff": 0.01, "bias_correction": true}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 2}},
  "gradient_clipping": 1.0,
  "checkpoint": {"dir": "$3", "every_steps": 2}
}
JSON
}
cfg "$T/straight.json" 4 "$T/straight.ckpt"
run_single straight "$T/straight.json"
# The plugin's defaults (DeepSpeed's) filled into what the program trains with.
printed=$(bounded "$TR" --config="$T/straight.json" --print_config 2>&1)
for want in 'type: "Lamb"' 'max_coeff: 10' 'min_coeff: 0.01' 'eps_inside_sqrt: false'; do
  grep -qF "$want" <<<"$printed" && echo "ok   --print_config shows $want" || fail "--print_config lacks $want"
done
/usr/bin/python3 - "$T/straight/metrics.jsonl" <<'PY' || fail "straight: metrics"
import json, math, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
assert len(steps) == 4 and all(math.isfinite(s["loss"]) for s in steps), steps
print("   Lamb losses", [round(s["loss"], 4) for s in steps])
PY
cfg "$T/first.json" 2 "$T/resumed.ckpt"
run_single first "$T/first.json"
cfg "$T/resumed.json" 4 "$T/resumed.ckpt"
run_single resumed "$T/resumed.json"
grep -qi 'resum' "$T/resumed.out" || fail "the second run did not say it resumed"
compare "Lamb: 2 steps + resume to 4 == 4 steps, bitwise" "$T/resumed.safetensors" "$T/straight.safetensors" 0
finish
