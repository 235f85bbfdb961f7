#!/usr/bin/env bash
# End to end through the training program: llama-mini (launcher/configs/llama-mini.pbtxt) learns
# Moby Dick's bytes, and a Hugging Face checkpoint folder (config.json for the shape, two shards
# and their index, a tied head's copy under lm_head.weight) trains from --init_from and is
# written back under Hugging Face's names; a checkpoint that does not fit is refused in one line
# naming every mismatch.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" train_llama
py=/usr/bin/python3
parity="$TEST_SRCDIR/braid/tests/parity"

# 1. llama-mini learns: 40 steps from ln(256) = 5.55 to well below.
if run_single mini "$TEST_SRCDIR/braid/launcher/configs/llama-mini.pbtxt" --steps=40; then
  $py - "$T/mini/metrics.jsonl" <<'PY' || fail "llama-mini: loss"
import json, math, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
assert len(steps) == 40, len(steps)
first, last = steps[0]["loss"], sum(r["loss"] for r in steps[-5:]) / 5
print(f"   llama-mini: first loss {first:.4f}, mean of last 5 {last:.4f}")
assert abs(first - math.log(256)) < 0.15, f"initial loss {first} should be near ln(256)"
assert last < 3.5, f"loss after 40 steps is {last}, expected well below ln(256)"
PY
fi

# 2. A Hugging Face folder, written by the PyTorch twin of tests/parity/llama_parity.py.
$py - "$parity" "$T/hf" "$T/hf-untied" <<'PY' || fail "writing the checkpoints"
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
import llama_parity as lp
for out, tied in ((sys.argv[2], True), (sys.argv[3], False)):
    c = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=256,
             max_position_embeddings=64, rms_norm_eps=1e-5, num_attention_heads=4,
             num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=tied)
    torch.manual_seed(3)
    w = {n: p.detach().float() for n, p in lp.LlamaForCausalLM(c).named_parameters()}
    if tied:
        w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()  # as some exports carry it
    os.makedirs(out)
    json.dump(c, open(os.path.join(out, "config.json"), "w"))
    names, weight_map = sorted(w), {}
    for k in range(2):
        f = f"model-{k + 1:05d}-of-00002.safetensors"
        part = {n: w[n] for n in names[k::2]}
        lp.write_safetensors(os.path.join(out, f), part)
        weight_map.update({n: f for n in part})
    json.dump({"weight_map": weight_map},
              open(os.path.join(out, "model.safetensors.index.json"), "w"))
PY
cat > "$T/hf.pbtxt" <<CFG
model { name: "llama" options { key: "hf_config" value: "$T/hf" } }
optimizer { type: "AdamW" params { lr: 1e-9 weight_decay: 0 } }
CFG
# One step at lr 1e-9: the weights written back are the folder's (AdamW moves each by ~1e-9).
if run_single hf "$T/hf.pbtxt" --init_from="$T/hf" --steps=1; then
  $py - "$parity" "$T/hf" "$T/hf.safetensors" <<'PY' || fail "hf: weights written back"
import json, sys
sys.path.insert(0, sys.argv[1])
import llama_parity as lp
index = json.load(open(sys.argv[2] + "/model.safetensors.index.json"))["weight_map"]
given = {}
for f in set(index.values()):
    given.update(lp.read_safetensors(f"{sys.argv[2]}/{f}"))
given.pop("lm_head.weight")  # tied: the embedding's copy
back = lp.read_safetensors(sys.argv[3])
assert set(back) == set(given), set(back) ^ set(given)
worst = max(lp.rel(back[n].double(), given[n].double()) for n in given)
print(f"   hf: {len(back)} tensors under Hugging Face's names, max relative change {worst:.2e}")
assert worst < 1e-6, worst
PY
fi

# 3. An untied checkpoint into the tied model: its own head is not a copy of the embedding.
if bounded "$TR" --config="$T/hf.pbtxt" --init_from="$T/hf-untied" --steps=1 --log_dir="$T/bad" \
    > "$T/bad.out" 2>&1; then
  fail "untied checkpoint into a tied model: accepted"
else
  cat "$T/bad.out"
  grep -q "does not match the model (1 problem): not in the model: lm_head.weight" "$T/bad.out" ||
    fail "untied checkpoint: message"
  [ "$(wc -l < "$T/bad.out")" = 1 ] || fail "untied checkpoint: not one line"
fi
finish
