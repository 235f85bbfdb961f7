#!/usr/bin/env bash
# Alternates two builds of Braid on one config, so machine noise hits both alike, and prints each
# run's tokens/s (the training summary's) and the medians. For "this change costs nothing":
#
#   git worktree add /tmp/before <commit> && (cd /tmp/before && bazel --output_user_root=/tmp/before-root build //launcher:all //plugins/...)
#   bazel build //launcher:all //plugins/...
#   tools/bench/compare_builds.sh /tmp/before . launcher/configs/gpt-mini-pipe.pbtxt 40 4 2
#
# Args: BEFORE_TREE AFTER_TREE CONFIG STEPS ROUNDS NPROC. A relative CONFIG is each tree's own copy
# (a shipped config as that build knew it: its fields may have changed between the two); an
# absolute one is the same file for both. Both trees read the data sets of this repository's data/
# folder (BRAID_DATA_DIR). A config's checkpoint folder (checkpoint { dir }) is emptied before each
# run, so no run resumes from the one before.
set -euo pipefail
before=$(cd "$1" && pwd); after=$(cd "$2" && pwd); steps=$4; rounds=$5; nproc=$6
config_in() {  # the config a tree's run reads
  case "$2" in /*) echo "$2" ;; *) echo "$1/$2" ;; esac
}
data=${BRAID_DATA_DIR:-$(pwd)/data}
out=$(mktemp -d)
declare -A runs=([before]="" [after]="")
for r in $(seq "$rounds"); do
  order="before after"; [ $((r % 2)) = 0 ] && order="after before"  # neither always runs first
  for which in $order; do
    tree=$before; [ "$which" = after ] && tree=$after
    cfg=$(config_in "$tree" "$3")
    ckpt=$(grep -oE 'checkpoint *\{[^}]*dir: *"[^"]+"' "$cfg" | sed -E 's/.*dir: *"([^"]+)"/\1/' || true)
    if [ -n "$ckpt" ]; then (cd "$tree" && rm -rf -- "$ckpt"); fi
    tps=$(cd "$tree" && BRAID_DATA_DIR="$data" timeout 900 bazel-bin/launcher/launcher \
            --nproc_per_node="$nproc" --log_dir="$out/$which$r.logs" -- --config="$cfg" \
            --steps="$steps" --log_dir="$out/$which$r" 2>&1 | grep -oE "[0-9.]+ (tok|samples)/s" | tail -1 | cut -d' ' -f1)
    echo "$which round $r: ${tps:-failed} tokens (or samples)/s"
    runs[$which]="${runs[$which]} ${tps:-0}"
  done
done
/usr/bin/python3 - "${runs[before]}" "${runs[after]}" <<'PY'
import statistics, sys
b = [float(x) for x in sys.argv[1].split()]
a = [float(x) for x in sys.argv[2].split()]
mb, ma = statistics.median(b), statistics.median(a)
print(f"median per s: before {mb:.0f}, after {ma:.0f}; after / before = {ma / mb:.3f}")
PY
rm -rf "$out"
