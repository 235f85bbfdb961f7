#!/usr/bin/env bash
# A save onto a disk that is really full (plugins/checkpoint): the checkpoint folder is a small
# tmpfs, sized to hold one checkpoint of gpt-mini and not two, mounted in a private mount
# namespace (unshare), so the mount exists only for this test's processes and vanishes with them:
# nothing is left mounted whatever happens. Steps 1-2 save step_2 there; the save of step_4 then
# runs out of space. Expected: the training program fails with an error naming the checkpoint
# file and the full disk; step_2 is intact (bitwise the same as the same run's step_2 written to
# the ordinary disk) and a new run resumes from it; no step_4 nor step_4.tmp is left.
#
# The namespace: first `unshare --user --map-root-user --mount` (no privilege needed where
# unprivileged user namespaces are allowed), then `unshare --mount` (root), tried in that order
# as third_party/host/host_configure.bzl does (keep the two in step). Bazel runs this test only
# where that detection found a way ("mount_tmpfs"; SKIPPED elsewhere), so here finding none is
# a failure. checkpoint_test.sh's case F covers a failed write by other means (a file-size limit)
# everywhere.
set -uo pipefail
TR="$TEST_SRCDIR/braid/launcher/train"
T="${TEST_TMPDIR:-$(mktemp -d)}/full"
rm -rf "$T"; mkdir -p "$T"
fails=0
fail() { echo "FAIL $*"; fails=$((fails+1)); }

# Which way of getting a private tmpfs works here (tried on a throwaway mount point).
mkdir -p "$T/probe"
NS=()
for way in "unshare --user --map-root-user --mount" "unshare --mount"; do
  if $way sh -c "mount -t tmpfs -o size=1m tmpfs '$T/probe' && [ \"\$(stat -f -c %T '$T/probe')\" = tmpfs ]" \
      >"$T/probe.out" 2>&1; then
    read -r -a NS <<< "$way"
    break
  fi
done
if [ ${#NS[@]} -eq 0 ]; then
  fail "no way to mount a tmpfs in a private mount namespace, though the target requires one: $(tr '\n' ' ' < "$T/probe.out")"
  exit 1
fi
echo "namespace: ${NS[*]}"

cat > "$T/cfg.pbtxt" <<CFG
model { name: "gpt-mini" }
data { dataset: "moby-dick" sampler: "sequential" }
train_micro_batch_size_per_gpu: 4
steps: 4
optimizer { type: "AdamW" params { lr: 0.001 } }
strategy { name: "single" }
checkpoint { dir: "$T/ckpt" every_steps: 2 keep_last: 2 }
CFG
sed "s|$T/ckpt|$T/ref|" "$T/cfg.pbtxt" > "$T/ref.pbtxt"

# The reference on the ordinary disk: step_2's size sizes the tmpfs, its bytes are what must survive.
"$TR" --config="$T/ref.pbtxt" --steps=2 --log_dir="$T/ref-logs" > "$T/ref.out" 2>&1 ||
  { fail "reference run"; tail -5 "$T/ref.out"; exit 1; }
one=$(du -sb "$T/ref/step_2" | cut -f1)
# Room for one checkpoint and a half: step_4 runs out of space half-way through its file.
size=$(( (one * 3 / 2 / 4096 + 1) * 4096 ))
echo "one checkpoint: $one bytes; tmpfs: $size bytes"

mkdir -p "$T/ckpt"
# Everything that needs the full disk runs inside the namespace; its mount dies with it.
"${NS[@]}" env T="$T" TR="$TR" SIZE="$size" bash -c '
  mount -t tmpfs -o size=$SIZE tmpfs "$T/ckpt" || exit 90
  "$TR" --config="$T/cfg.pbtxt" --steps=4 --log_dir="$T/full-logs" > "$T/full.out" 2>&1
  echo $? > "$T/full.rc"
  ls -a "$T/ckpt" > "$T/after.ls"
  df -B1 "$T/ckpt" > "$T/after.df"
  cp "$T/ckpt/step_2/rank0.safetensors" "$T/kept.safetensors" 2>/dev/null
  "$TR" --config="$T/cfg.pbtxt" --steps=2 --log_dir="$T/after-logs" > "$T/after.out" 2>&1
  echo $? > "$T/after.rc"
'
ns_rc=$?
[ "$ns_rc" = 90 ] && { fail "mounting the tmpfs failed although the probe succeeded"; exit 1; }
mount | grep -q " $T/ckpt " && fail "the tmpfs is still mounted outside the namespace"

rc=$(cat "$T/full.rc" 2>/dev/null || echo missing)
file="$T/ckpt/step_4.tmp/rank0.safetensors"
if [ "$rc" != 0 ] && [ "$rc" != missing ] &&
   grep -q "writing '$file' failed: No space left on device: the disk holding the checkpoint is full" "$T/full.out" &&
   grep -q "the previous checkpoint is kept" "$T/full.out"; then
  echo "ok   the save of step 4 fails (exit $rc) with: $(grep -o "writing '.*kept" "$T/full.out" | head -1)"
else
  fail "no clear full-disk error (exit $rc)"; tail -5 "$T/full.out"
fi
if grep -qx step_2 "$T/after.ls" && ! grep -q "step_4" "$T/after.ls"; then
  echo "ok   step_2 kept, no step_4 nor step_4.tmp left ($(tr '\n' ' ' < "$T/after.ls"))"
else
  fail "the checkpoint folder holds: $(tr '\n' ' ' < "$T/after.ls")"
fi
if cmp -s "$T/kept.safetensors" "$T/ref/step_2/rank0.safetensors"; then
  echo "ok   step_2 is bitwise the reference's"
else
  fail "step_2 differs from the reference's"
fi
if [ "$(cat "$T/after.rc" 2>/dev/null)" = 0 ] && grep -q "resumed from $T/ckpt/step_2" "$T/after.out"; then
  echo "ok   a new run resumes from step_2"
else
  fail "step_2 is not loadable"; tail -5 "$T/after.out"
fi
[ "$fails" = 0 ] && echo PASS || { echo "$fails failure(s)"; exit 1; }
