#!/usr/bin/env bash
# A short libFuzzer run over the store's frame parser, as part of `bazel test`.
# Usage (by Bazel): frame_fuzz_smoke_test.sh <frame_fuzzer> <frame_fuzz_seeds>
# Longer runs on demand, either through Bazel:
#   bazel test //backends/store:frame_fuzz_smoke_test --test_env=BRAID_FUZZ_SECONDS=600 \
#     --test_timeout=900 --test_output=streamed
# or directly, keeping the corpus between runs:
#   bazel build //backends/store:frame_fuzzer //backends/store:frame_fuzz_seeds
#   mkdir -p /tmp/frame_corpus && bazel-bin/backends/store/frame_fuzz_seeds /tmp/frame_corpus
#   bazel-bin/backends/store/frame_fuzzer -max_total_time=3600 -jobs=2 /tmp/frame_corpus
set -euo pipefail
fuzzer="$1"
seeds="$2"
seconds="${BRAID_FUZZ_SECONDS:-5}"
# A run count bound as well as a time bound, so the test ends even if the clock misbehaves.
runs="${BRAID_FUZZ_RUNS:-50000000}"
work="${TEST_TMPDIR:-$(mktemp -d)}"
corpus="$work/corpus"
artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-$work}"
mkdir -p "$corpus"
"$seeds" "$corpus"
echo "frame_fuzz_smoke_test: fuzzing for ${seconds}s (at most $runs runs)" \
  "from $(ls "$corpus" | wc -l) seeds"
# -max_len: frames worth exploring are small; the size limits are exercised by announced
# lengths, not by megabytes of input.
"$fuzzer" -max_total_time="$seconds" -runs="$runs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus"
