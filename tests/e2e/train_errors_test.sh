#!/usr/bin/env bash
# Bad input to the training program ends quickly with a message that names the thing and what to
# do, and a non-zero exit: never a hang, never a crash.
# Each command's time is bounded by what is left of the target's own timeout (lib.sh): a hang
# fails with the case named, before Bazel would kill the target.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" train_errors
train="$TR"
tmp="$T"
expect() {  # expect NAME PATTERN -- command...
  local name=$1 pattern=$2; shift 3
  local out rc
  out=$(bounded "$@" 2>&1); rc=$?
  if [ "$rc" = 0 ] || [ "$rc" = 124 ] || [ "$rc" = 125 ] || [ "$rc" -ge 128 ]; then
    echo "FAIL $name: exit code $rc (want a clean error exit)"; echo "$out" | tail -5; fails=$((fails+1))
  elif ! grep -qE "$pattern" <<<"$out"; then
    echo "FAIL $name: message does not match /$pattern/:"; echo "$out" | tail -5; fails=$((fails+1))
  else
    echo "ok   $name: $(grep -E "$pattern" <<<"$out" | head -1 | cut -c1-160)"
  fi
}
printf 'steps: 2\nmodle { name: "gpt-mini" }\n' > "$tmp/typo.pbtxt"
printf '{"steps": "many"}\n' > "$tmp/wrong_type.json"
printf 'train_batch_size: 48\ntrain_micro_batch_size_per_gpu: 16\ngradient_accumulation_steps: 2\n' > "$tmp/batch.pbtxt"
printf 'fp16 { enabled: true }\nstrategy { name: "dp" }\n' > "$tmp/fp16.pbtxt"
printf 'zero_optimization { stage: 2 }\nstrategy { name: "ddp" }\n' > "$tmp/zero2.pbtxt"
echo "not a safetensors file" > "$tmp/bad.safetensors"
expect unknown-field 'typo.pbtxt:2:1: unknown field "modle"' -- "$train" --config="$tmp/typo.pbtxt" --log_dir="$tmp/l"
expect wrong-type 'steps.*many' -- "$train" --config="$tmp/wrong_type.json" --log_dir="$tmp/l"
expect batch-mismatch 'train_batch_size \(48\)' -- "$train" --config="$tmp/batch.pbtxt" --log_dir="$tmp/l"
# A DeepSpeed JSON with problems of its keys and of its values: all of them in one run, each at
# its line:column (the reader keeps its problems for validation, launcher/config/config.h).
printf '{\n  "stepz": 2,\n  "optimizer": {"params": {"lr": -1}},\n  "zero_optimization": {"stage": 7}\n}\n' > "$tmp/many.json"
expect all-problems-at-once '3 problems in the training config: [^ ]*many.json:2:3: unknown field "stepz".*many.json:3:28: optimizer.params.lr \(-1\) must be.*many.json:4:25: zero_optimization.stage \(7\) must be 0, 1, 2 or 3' -- "$train" --config="$tmp/many.json" --log_dir="$tmp/l"
# A text config the same way, its problems at the fields they name; an optimizer and a model no
# plugin registers (the training program's own problems) are placed at the key that named them.
printf 'steps: 0\noptimizer { type: "Sophia" }\nmodel { name: "nosuchmodel" }\nzero_optimization { stage: 7 }\n' > "$tmp/many.pbtxt"
expect text-problems-at-once '^braid train: 4 problems in the training config: [^ ]*/many\.pbtxt:1:1: steps \(0\) must be >= 1; [^ ]*/many\.pbtxt:2:13: optimizer\.type: unknown optimizer .Sophia.* [^ ]*/many\.pbtxt:3:9: model\.name: .*nosuchmodel.* [^ ]*/many\.pbtxt:4:21: zero_optimization\.stage \(7\) must be 0, 1, 2 or 3$' -- "$train" --config="$tmp/many.pbtxt" --log_dir="$tmp/l"
# fp16 with a strategy that does not keep half parameters (dp): the ones that do are named.
expect fp16-needs-a-strategy '^braid train: [^ ]*/fp16\.pbtxt:1:1: fp16 needs a strategy that provides "fp16"; strategy "dp" does not; use strategy.name "ddp" \(plugin libbraid_ddp\.so\), "single" \(plugin libbraid_single\.so\) or "zero" \(plugin libbraid_zero\.so\)$' -- "$train" --config="$tmp/fp16.pbtxt" --log_dir="$tmp/l"
# A feature the named strategy lacks: one line naming the feature and the strategy, and either
# the strategy (and plugin) that provides it or that none on the plugin search path does.
# The zero plugin ships with the program: the message names it. (A config that names no
# strategy gets one that provides its sections: zero_optimization alone picks zero,
# launcher/compose.h.)
zero_pattern='^braid train: [^ ]*/zero2\.pbtxt:1:1: zero_optimization \(stage 2\) needs a strategy that provides "zero2"; strategy "ddp" does not; use strategy.name "zero" \(plugin libbraid_zero\.so\)$'
expect zero-needs-a-strategy "$zero_pattern" -- "$train" --config="$tmp/zero2.pbtxt" --log_dir="$tmp/l"
zero_out=$(bounded "$train" --config="$tmp/zero2.pbtxt" --log_dir="$tmp/l" 2>&1)
if [ "$(printf '%s\n' "$zero_out" | wc -l)" != 1 ]; then
  echo "FAIL zero-one-line: want one line, got:"; echo "$zero_out" | head -5; fails=$((fails+1))
else
  echo "ok   zero-one-line"
fi
# Layouts no stack of layers serves (launcher/compose.h): one line naming both layers, at start,
# before any process connects (WORLD_SIZE alone; validation needs no store).
printf 'parallel { pipeline: 2 }\nstrategy { name: "dp" }\n' > "$tmp/pipe_dp.pbtxt"
printf 'parallel { tensor: 2 }\nstrategy { name: "dp" }\n' > "$tmp/tp_dp.pbtxt"
expect dp-under-the-pipeline '^braid train: layers "pipeline" \(pipeline axis\) and "dp" \(data axis\) do not stack: "dp" cannot serve under another layer: it keeps whole replicas' -- env WORLD_SIZE=4 RANK=0 "$train" --config="$tmp/pipe_dp.pbtxt" --log_dir="$tmp/l"
expect dp-under-tensor-parallel '^braid train: layers "tensor_parallel" \(tensor axis\) and "dp" \(data axis\) do not stack: "dp" cannot serve under a layer that splits the model: it keeps whole replicas' -- env WORLD_SIZE=4 RANK=0 "$train" --config="$tmp/tp_dp.pbtxt" --log_dir="$tmp/l"
# The pipeline's stage count is the mesh's: as an option alone (the layout of earlier releases) it
# is refused, saying where it goes, rather than the pipeline building groups of its own.
printf 'strategy { name: "pipeline" options { key: "stages" value: "2" } }\n' > "$tmp/pipe_option.pbtxt"
expect pipeline-without-a-mesh '^braid train: .*pipe_option.pbtxt:1:12: strategy.name "pipeline" \(pipeline axis\) cuts the model into stages along the pipeline axis, but parallel.pipeline is 1; give the stage count as parallel \{ pipeline: N \}' -- env WORLD_SIZE=2 RANK=0 "$train" --config="$tmp/pipe_option.pbtxt" --log_dir="$tmp/l"
expect single-on-two-ranks '^braid train: strategy.name "single" trains 1 data-parallel rank\(s\), but the data-parallel size is 2' -- env WORLD_SIZE=2 RANK=0 "$train" --strategy=single --steps=1 --log_dir="$tmp/l"
expect missing-config 'no-such.pbtxt' -- "$train" --config="$tmp/no-such.pbtxt" --log_dir="$tmp/l"
expect unknown-strategy "nosuch.*(searched|looked)" -- "$train" --strategy=nosuch --steps=1 --log_dir="$tmp/l"
expect plugin-path-missing 'libbraid_gone.so' -- env BRAID_PLUGIN_PATH=/nonexistent "$train" --steps=1 --log_dir="$tmp/l" --strategy=gone
expect missing-weights 'nope.safetensors' -- "$train" --init_from="$tmp/nope.safetensors" --steps=1 --log_dir="$tmp/l"
expect corrupt-weights 'bad.safetensors' -- "$train" --init_from="$tmp/bad.safetensors" --steps=1 --log_dir="$tmp/l"
[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
