#!/usr/bin/env bash
# Fuzzes Braid's parsers of outside bytes with libFuzzer under ASan and UBSan, and keeps what
# reaches new code in the repository's corpus folders (replayed by `bazel test`).
#
#   tools/fuzz/run.sh [--runs=N] [--seconds=S] [--max_len=B] [--resume] [--keep] [TARGET...]
#
# TARGET: Bazel labels of braid_fuzzer targets (core/testing/fuzz.bzl); default: every one.
# --runs:    executions per target (default 10000000); --seconds: a time bound per target as
#            well (default none). A target stops at the first of the two, or at a crash.
# --max_len: the longest input libFuzzer makes up, in bytes (default 8192). The wire-frame target
#            runs ~5x faster at 1024 once its corpus has grown to the default's length (a body
#            of kilobytes is thousands of tiny frames each parsed five ways), and 1024 still
#            holds several frames and frames over the handshake's 256-byte limit.
# --resume:  go on from the previous run of the target (its working corpus in runs/fuzz/<name>/,
#            which a run without --resume starts afresh), so one campaign can span several runs;
#            runs/fuzz/<name>/campaign.tsv lists each completed run (executions, seconds, result,
#            max_len), and the result row totals the campaign's executions. A run interrupted
#            with SIGINT (Ctrl-C) counts: libFuzzer prints its statistics before it exits.
#            Two --resume runs of one target may go side by side (one per core): each keeps a
#            log of its own and libFuzzer reloads the inputs the other adds to the corpus.
# --keep:    merge the inputs that found new coverage into <package>/fuzz_corpus/<name>/ (the
#            kept corpus, minimised by libFuzzer's -merge); without it the repository is untouched.
# Crashes, leaks and sanitizer reports stop the target; the input that caused it is written to
# runs/fuzz/<name>/ and the run ends non-zero. The last line: one row per target with its
# executions, seconds and result.
#
# The fuzzing build is clang-14's (installed by tools/setup.sh), in an output root of its own
# under the user's cache, so it never disturbs the ordinary build's.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here"
runs=10000000; seconds=0; max_len=8192; keep=0; resume=0; targets=()
for a in "$@"; do
  case "$a" in
    --runs=*) runs="${a#--runs=}" ;;
    --seconds=*) seconds="${a#--seconds=}" ;;
    --max_len=*) max_len="${a#--max_len=}" ;;
    --keep) keep=1 ;;
    --resume) resume=1 ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz: unknown option $a (see --help)" >&2; exit 2 ;;
    *) targets+=("$a") ;;
  esac
done
case "$max_len" in ''|*[!0-9]*|0) echo "fuzz: --max_len wants a positive number of bytes, not '$max_len'" >&2; exit 2 ;; esac
command -v clang-14 >/dev/null || { echo "fuzz: clang-14 is missing; run tools/setup.sh" >&2; exit 1; }
root="${XDG_CACHE_HOME:-$HOME/.cache}/braid-fuzz-bazel"
fbazel() { bazel --output_user_root="$root" "$@"; }
if [ "${#targets[@]}" = 0 ]; then
  # The repository's top folders that hold packages, not //...: the ordinary build's convenience
  # symlinks (bazel-<folder>) point into another output root, which this Bazel would load.
  scope=$(git ls-files -- '*/BUILD' '*/BUILD.bazel' | cut -d/ -f1 | sort -u | sed 's|.*|//&/...|' | paste -sd+ -)
  mapfile -t targets < <(fbazel query "filter(\"_fuzzer\$\", kind(\"cc_binary\", $scope))" 2>/dev/null)
  [ "${#targets[@]}" -gt 0 ] || { echo "fuzz: found no braid_fuzzer targets" >&2; exit 1; }
fi
echo "fuzz: building ${targets[*]} with clang-14, libFuzzer, ASan, UBSan"
fbazel build --config=fuzz "${targets[@]}" || { echo "fuzz: the fuzzing build failed" >&2; exit 1; }
bin_dir=$(fbazel info --config=fuzz bazel-bin 2>/dev/null)

rows=(); rc=0
for t in "${targets[@]}"; do
  pkg="${t#//}"; pkg="${pkg%%:*}"; name="${t##*:}"
  kept="$pkg/fuzz_corpus/$name"
  out="runs/fuzz/$name"; work="$out/corpus"
  ledger="$out/campaign.tsv"
  if [ "$resume" = 0 ] || [ ! -d "$work" ]; then
    # A new campaign: a fresh working corpus (seeded from the kept one) and an empty ledger.
    rm -rf "$work" "$ledger"; mkdir -p "$work"
  fi
  mkdir -p "$kept"
  # A log per run, so two runs of one campaign can go side by side on two cores (libFuzzer
  # reloads the shared working corpus, as its own -jobs do) without writing over each other.
  log="$out/fuzz-$(date -u +%Y%m%dT%H%M%SZ)-$$.log"
  limit=""; [ "$seconds" != 0 ] && limit=" (at most $seconds s)"
  echo "fuzz: $t: $runs runs$limit, inputs up to $max_len bytes, from $(ls "$kept" | wc -l) kept and $(ls "$work" | wc -l) working inputs; log $log"
  start=$(date +%s)
  # A fresh working corpus seeded from the kept one; -max_len bounds the inputs libFuzzer makes
  # up (configs, headers and frames worth exploring are small); -timeout: one input that runs
  # 10 s is a hang and counts as a failure. ASan's quarantine (the freed memory it keeps unusable
  # to catch a late use) is 16 MB rather than 256: a use after free is still caught unless over
  # 16 MB were freed in between, far more than one execution on inputs of a few kilobytes
  # allocates, and recycling the large quarantine's pages cost ~40% of the tokenizer's and the
  # config's executions (~350 -> ~590 and ~150 -> ~260 executions/s on the loaded machine).
  ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=16 UBSAN_OPTIONS=print_stacktrace=1 \
    "$bin_dir/$pkg/$name" -runs="$runs" -max_total_time="$seconds" -max_len="$max_len" -timeout=10 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$out/" "$work" "$kept" > "$log" 2>&1
  r=$?
  took=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  if [ "$r" = 0 ]; then
    result=ok
    if [ "$keep" = 1 ]; then
      "$bin_dir/$pkg/$name" -merge=1 -max_len="$max_len" "$kept" "$work" >> "$log" 2>&1 || result="ok (merge failed)"
    fi
  elif [ "$r" = 72 ] && grep -q 'libFuzzer: run interrupted' "$log"; then
    # Ctrl-C or SIGINT (`pkill -INT -f <name>`): libFuzzer prints its statistics and exits 72.
    # Nothing was found; the executions so far count, and --resume goes on from here.
    result="interrupted (no report)"
    rc=1
  else
    result="FAILED (exit $r; see $log and the crash-*/leak-*/timeout-* input in $out/)"
    tail -30 "$log"
    rc=1
  fi
  # The campaign's ledger: a run that ended, was interrupted or failed with its statistics
  # counts; one killed before libFuzzer printed them (SIGKILL, SIGTERM) does not (its inputs stay
  # in the working corpus).
  if [ -n "$execs" ]; then
    printf '%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$execs" "$took" "${result%% *}" "$max_len" >> "$ledger"
  fi
  total=$(awk -F'\t' '{n += $2} END {print n + 0}' "$ledger" 2>/dev/null || echo 0)
  legs=$(wc -l < "$ledger" 2>/dev/null || echo 0)
  rows+=("$(printf '%-45s %12s executions %6d s  %s; campaign: %s executions in %s run(s)' "$t" "${execs:-?}" "$took" "$result" "$total" "$legs")")
done
echo "fuzz: results"
printf '  %s\n' "${rows[@]}"
exit "$rc"
