#!/usr/bin/env bash
# //tools:sample end to end: the same seed prints the same text, another seed other text,
# greedy ignores the seed, and each bad input is one line on stderr with status 1; a Llama named
# by a config (--config) samples as deterministically, greedy and seeded.
set -euo pipefail
bin="$TEST_SRCDIR/braid/tools/sample/sample"
writer="$TEST_SRCDIR/braid/tools/sample/write_test_model"
tmp="$TEST_TMPDIR"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

expect_error() {
  local want="$1"; shift
  local rc=0
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ "$rc" != 1 ] || [ "$lines" != 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
    fail "sample $* -> status $rc, $lines stderr lines: $(cat "$tmp/err"); wanted status 1," \
         "one line with '$want'"
  fi
}

"$writer" gpt "$tmp/w.safetensors" 256 7
"$writer" gpt "$tmp/small.safetensors" 64 7
run() { "$bin" --from="$tmp/w.safetensors" --prompt="Call me" --max_new_tokens=40 "$@"; }
a=$(run --seed=3 --temperature=1 --top_k=50 | od -An -tx1)
b=$(run --seed=3 --temperature=1 --top_k=50 | od -An -tx1)
c=$(run --seed=4 --temperature=1 --top_k=50 | od -An -tx1)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "the same seed printed different text"
[ "$a" != "$c" ] || fail "seeds 3 and 4 printed the same 40 tokens"
g1=$(run --seed=1 --temperature=0 | od -An -tx1)
g2=$(run --seed=2 --temperature=0 | od -An -tx1)
[ "$g1" = "$g2" ] || fail "greedy depends on the seed"
run --seed=1 --temperature=0 | head -c 7 | grep -qx "Call me" || fail "the prompt is not printed first"

expect_error "no such file" --from="$tmp/missing.safetensors" --prompt=x
expect_error "--from is required" --prompt=x
expect_error "unknown" --from="$tmp/w.safetensors" --tokenizer=klingon --prompt=x
expect_error "tokenizer has 256 tokens but the model's embedding has 64 rows" \
  --from="$tmp/small.safetensors" --prompt=x
printf 'not safetensors' >"$tmp/junk.safetensors"
expect_error "junk.safetensors" --from="$tmp/junk.safetensors" --prompt=x

# A Llama, by the config it was trained with (test_llama.h's shape, the byte vocabulary).
"$writer" llama "$tmp/llama.safetensors" 256 5
cat >"$tmp/llama.pbtxt" <<'CFG'
model {
  name: "llama" n_layer: 2 n_head: 4 n_embd: 32 block_size: 24 vocab_size: 256
  options { key: "n_kv_head" value: "2" }
  options { key: "intermediate_size" value: "64" }
}
CFG
llama() { "$bin" --config="$tmp/llama.pbtxt" --from="$tmp/llama.safetensors" --prompt="Call me" --max_new_tokens=40 "$@"; }
la=$(llama --seed=3 --temperature=1 --top_k=50 | od -An -tx1)
lb=$(llama --seed=3 --temperature=1 --top_k=50 | od -An -tx1)
lc=$(llama --seed=4 --temperature=1 --top_k=50 | od -An -tx1)
[ -n "$la" ] && [ "$la" = "$lb" ] || fail "llama: the same seed printed different text"
[ "$la" != "$lc" ] || fail "llama: seeds 3 and 4 printed the same 40 tokens"
lg1=$(llama --seed=1 --temperature=0 | od -An -tx1)
lg2=$(llama --seed=2 --temperature=0 | od -An -tx1)
[ "$lg1" = "$lg2" ] || fail "llama: greedy depends on the seed"
[ "$lg1" != "$la" ] || fail "llama: greedy printed what sampling did"
# The weights read as a GPT's (no --config) are refused, naming what they lack.
expect_error "holds no GPT weights" --from="$tmp/llama.safetensors" --prompt=x
sed 's/n_layer: 2/n_layer: 3/' "$tmp/llama.pbtxt" >"$tmp/llama3.pbtxt"
expect_error "model.layers.2.mlp.down_proj.weight" --config="$tmp/llama3.pbtxt" \
  --from="$tmp/llama.safetensors" --prompt=x
printf 'model { name: "mistral-7b" }\n' >"$tmp/unknown.pbtxt"
expect_error "mistral-7b" --config="$tmp/unknown.pbtxt" --from="$tmp/llama.safetensors" --prompt=x

[ "$fails" = 0 ] || exit 1
echo "PASS"
