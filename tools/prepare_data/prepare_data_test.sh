#!/usr/bin/env bash
# //tools:prepare_data as users run it, with the byte tokenizer: a folder and a JSON-lines file
# in, a data set out, the same bytes on a re-run; and the one-line error of each bad input.
set -euo pipefail
bin="$TEST_SRCDIR/braid/tools/prepare_data/prepare_data"
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
    fail "prepare_data $* -> status $rc, $lines stderr lines: $(cat "$tmp/err"); wanted status" \
         "$want_rc, one line with '$want' '$want2'"
  fi
}

mkdir -p "$tmp/in/sub"
for i in 1 2 3 4 5 6 7 8 9; do printf 'document %s\nline two\n' "$i" >"$tmp/in/sub/d$i.txt"; done
printf '{"text": "from json"}\n{"text": "more json", "n": 2}\n' >"$tmp/in/lines.jsonl"

"$bin" --tokenizer=byte --out="$tmp/a" --threads=2 "$tmp/in" 2>"$tmp/log" || fail "prepare: $(cat "$tmp/log")"
grep -q 'MB/s, ETA' "$tmp/log" || fail "no progress line: $(cat "$tmp/log")"
grep -q 'wrote .*/a: .* train tokens (10 documents' "$tmp/log" || fail "summary: $(cat "$tmp/log")"
grep -q '"validation":1' "$tmp/a/manifest.json" || fail "manifest: $(cat "$tmp/a/manifest.json")"
ls "$tmp/a" | grep -q partial && fail "temporary files left: $(ls "$tmp/a")"

# The same command again, and another thread count, into another folder: the same bytes.
"$bin" --tokenizer=byte --out="$tmp/b" --threads=1 --quiet "$tmp/in" || fail "second run"
diff -r "$tmp/a" "$tmp/b" >/dev/null || fail "re-run differs: $(diff -r "$tmp/a" "$tmp/b" | head -5)"
"$bin" --tokenizer=byte --out="$tmp/a" --quiet "$tmp/in" || fail "run over the first"
diff -r "$tmp/a" "$tmp/b" >/dev/null || fail "a run over an old one differs"

# A SentencePiece model (trained here with spm_train, which tools/setup.sh installs): its name,
# vocabulary and </s> (2) after each document, without --eot.
for r in $(seq 1 30); do cat "$tmp"/in/sub/*.txt; done >"$tmp/spm.txt"
spm_train --input="$tmp/spm.txt" --model_prefix="$tmp/toy" --vocab_size=60 --hard_vocab_limit=false \
  --model_type=bpe --minloglevel=2 >/dev/null 2>&1 || fail "spm_train"
"$bin" --tokenizer=sentencepiece:"$tmp/toy.model" --out="$tmp/spm" --quiet "$tmp/in" || fail "sentencepiece run"
grep -q '"tokenizer": "sentencepiece:toy.model"' "$tmp/spm/manifest.json" &&
  grep -q '"eot_id": 2,' "$tmp/spm/manifest.json" || fail "sentencepiece manifest: $(cat "$tmp/spm/manifest.json")"

# Bad input: one line naming the file, and the data set already in the folder untouched.
: >"$tmp/empty.txt"
expect_error 1 "$tmp/empty.txt is empty" "" --tokenizer=byte --out="$tmp/a" "$tmp/in" "$tmp/empty.txt"
mkdir -p "$tmp/bare"; printf 'x' >"$tmp/bare/image.png"
expect_error 1 "folder $tmp/bare holds no text" "" --tokenizer=byte --out="$tmp/a" "$tmp/bare"
printf '{"text": "a"}\n{"content": "b"}\n' >"$tmp/bad.jsonl"
expect_error 1 "bad.jsonl:2: no string field \"text\" (its fields: content)" "--jsonl_field" \
  --tokenizer=byte --out="$tmp/a" "$tmp/bad.jsonl"
"$bin" --tokenizer=byte --out="$tmp/c" --jsonl_field=content --val_fraction=0 --quiet "$tmp/bad.jsonl" &&
  fail "a line without the named field was accepted"
printf '{"content": "b"}\n' >"$tmp/good.jsonl"
"$bin" --tokenizer=byte --out="$tmp/c" --jsonl_field=content --val_fraction=0 --quiet "$tmp/good.jsonl" ||
  fail "--jsonl_field=content"
printf 'alone' >"$tmp/one.txt"
expect_error 1 "one document ($tmp/one.txt)" "--val_fraction=0" --tokenizer=byte --out="$tmp/a" "$tmp/one.txt"
expect_error 1 "nowhere.txt: no such file or folder" "" --tokenizer=byte --out="$tmp/a" "$tmp/nowhere.txt"
expect_error 1 "missing.model" "sentencepiece" --tokenizer=sentencepiece:"$tmp/missing.model" --out="$tmp/a" "$tmp/in"
mkdir -p "$tmp/gpt2bad"; printf '{"a": ' >"$tmp/gpt2bad/encoder.json"; printf '#version\n' >"$tmp/gpt2bad/vocab.bpe"
expect_error 1 "gpt2bad/encoder.json" "" --tokenizer=gpt2:"$tmp/gpt2bad" --out="$tmp/a" "$tmp/in"
expect_error 1 "unknown tokenizer 'gpt3'" "" --tokenizer=gpt3 --out="$tmp/a" "$tmp/in"
expect_error 2 "--out=FOLDER is required" "" --tokenizer=byte "$tmp/in"
expect_error 2 "no input" "" --tokenizer=byte --out="$tmp/a"
expect_error 1 "--val_fraction=1" "" --tokenizer=byte --out="$tmp/a" --val_fraction=1 "$tmp/in"
diff -r "$tmp/a" "$tmp/b" >/dev/null || fail "a refused run changed the data set already there"

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo PASS
