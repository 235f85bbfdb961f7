#!/usr/bin/env bash
# //tools:tokenize with GPT-2's installed vocabulary: known ids (tiktoken's gpt2 gives
# "Hello world" -> 15496 995) and the stress text through a u32 file and back, byte for byte.
set -euo pipefail
bin="$TEST_SRCDIR/braid/tools/tokenize/tokenize"
stress="$TEST_SRCDIR/braid/tools/tokenize/unicode_stress.txt"
tmp="$TEST_TMPDIR"
printf 'Hello world' >"$tmp/h.txt"
got="$("$bin" --tokenizer=gpt2 "$tmp/h.txt")"
[ "$got" = "15496 995" ] || { echo "FAIL: 'Hello world' -> '$got'" >&2; exit 1; }
"$bin" --tokenizer=gpt2 --ids_out="$tmp/s.u32" "$stress" 2>"$tmp/err"
grep -q "gpt2 tokens (vocabulary 50257)" "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
"$bin" --tokenizer=gpt2 --decode "$tmp/s.u32" >"$tmp/back.txt"
cmp "$stress" "$tmp/back.txt"
echo "gpt2 checks passed"
