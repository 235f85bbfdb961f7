#!/usr/bin/env bash
# Sharded checkpoints through the real launcher and training program (plugins/checkpoint):
#   A. exact resume: stopped after step 3 and resumed to 6 ends bitwise equal to an uninterrupted
#      run, with the same losses at steps 4-6: single, DDP (2), ZeRO 1/2/3 (2), pipeline (2),
#      tensor parallel (2), and DDP with asynchronous saves. AdamW, so the optimizer state and its
#      step count must come back.
#   M. the reshard matrix: each of those 7 layouts' checkpoint loads into each of the other 6,
#      bitwise (the loaded weights are the writer's).
#   B. reshard: a checkpoint of one process loads into DDP on 2, ZeRO-3 on 2, TP 2 and a 2-stage
#      pipeline (and ZeRO-3's into one process); training on equals the one process's run within
#      2e-6 (SGD with momentum: the momentum buffers move with the parameters; reduction order
#      is the only difference, measured ~1e-8).
#   C. a damaged file (one flipped byte) is reported by name and the previous checkpoint used.
#   D. kill -9 of one worker at step 5 under --max_restarts=1: the group restarts from step 4 and
#      ends bitwise equal to an uninterrupted run.
#   E. a worker killed in the middle of saving step 4: step 2 stays usable; same end.
#   F. a save that cannot be written (a 20 MB file-size limit: EFBIG, not a full disk) ends with a
#      clear error and the previous checkpoint intact. A really full disk (a tmpfs in a private
#      mount namespace) is checkpoint_test_disk_full.sh.
#
# Four shards (BUILD shard_count). The matrix needs each writer's runs of A, so a shard runs A
# for some layouts and the matrix rows of those writers (into all 6 others); C needs A's single,
# D and E need A's DDP: they run on the shard that has those. No run is made twice.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" ckpt
shards 4
cfg() {  # FILE MICRO ACCUM OPTIMIZER SECTIONS
  cat > "$1" <<CFG
model { name: "gpt-mini" }
data { dataset: "moby-dick" sampler: "sequential" }
train_micro_batch_size_per_gpu: $2
gradient_accumulation_steps: $3
steps: 6
optimizer $4
$5
CFG
}
ADAMW='{ type: "AdamW" params { lr: 0.001 weight_decay: 0.1 } }'
SGDM='{ type: "SGD" params { lr: 0.1 momentum: 0.9 } }'
run() {  # NAME NPROC CFG [MORE LAUNCHER FLAGS...] -- [MORE TRAIN FLAGS...]
  local name=$1 n=$2 c=$3 t0=$SECONDS rc; shift 3
  local lflags=() tflags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do lflags+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  tflags=("$@")
  bounded "$L" --nproc_per_node=$n --log_dir="$T/$name.logs" "${lflags[@]}" -- --config="$c" \
    --log_dir="$T/$name" "${tflags[@]}" > "$T/$name.out" 2>&1
  rc=$?
  echo "   ran $name on $n process(es): $((SECONDS - t0)) s"
  return $rc
}
losses() { grep '"step"' "$1" | sed 's/.*"loss": \([^,]*\),.*/\1/' | tail -n "$2"; }

# ---- A. exact resume -------------------------------------------------------------------------
exact() {  # NAME NPROC MICRO ACCUM SECTIONS [CHECKPOINT OPTIONS]
  local n=$1 p=$2
  cfg "$T/$n.pbtxt" $3 $4 "$ADAMW" "$5"
  cfg "$T/$n-ck.pbtxt" $3 $4 "$ADAMW" "$5 checkpoint { dir: \"$T/$n-ckpt\" every_steps: 3 ${6:-} }"
  run "$n-plain" $p "$T/$n.pbtxt" -- --save_to="$T/$n-plain.safetensors" || { fail "$n: plain run"; tail -5 "$T/$n-plain.out"; return; }
  run "$n-first" $p "$T/$n-ck.pbtxt" -- --steps=3 || { fail "$n: first half"; tail -5 "$T/$n-first.out"; return; }
  run "$n-resumed" $p "$T/$n-ck.pbtxt" -- --save_to="$T/$n-resumed.safetensors" || { fail "$n: resumed run"; tail -5 "$T/$n-resumed.out"; return; }
  grep -q "resumed from $T/$n-ckpt/step_3 (step 3 of 6)" "$T/$n-resumed.out" || { fail "$n: did not resume from step 3"; return; }
  if cmp -s "$T/$n-plain.safetensors" "$T/$n-resumed.safetensors" &&
     [ "$(losses "$T/$n-plain/metrics.jsonl" 3)" = "$(losses "$T/$n-resumed/metrics.jsonl" 3)" ]; then
    echo "ok   A $n: resumed == uninterrupted, bitwise, losses $(losses "$T/$n-resumed/metrics.jsonl" 3 | tr '\n' ' ')"
  else
    fail "A $n: resumed run differs"; /usr/bin/python3 "$CMP" "$T/$n-plain.safetensors" "$T/$n-resumed.safetensors" 0
  fi
}
# A layout: its exact resume, here and in the matrix below (shard by shard).
exact_layout() {  # LAYOUT
  case $1 in
    single) exact single 1 4 1 'strategy { name: "single" }' ;;
    ddp) exact ddp 2 2 1 'strategy { name: "ddp" }' ;;
    zero1) exact zero1 2 2 1 'strategy { name: "zero" } zero_optimization { stage: 1 }' ;;
    zero2) exact zero2 2 2 1 'strategy { name: "zero" } zero_optimization { stage: 2 }' ;;
    zero3) exact zero3 2 2 1 'strategy { name: "zero" } zero_optimization { stage: 3 }' ;;
    pipe) exact pipe 2 2 2 'parallel { pipeline: 2 }' ;;
    tp) exact tp 2 4 1 'parallel { tensor: 2 } strategy { name: "single" }' ;;
  esac
}
# Asynchronous saves (written on a background thread, committed at a later step boundary).
exact_async() {
  exact ddp_async 2 2 1 'strategy { name: "ddp" }' 'async: true'
  grep -q "training blocked .* per save (asynchronous)" "$T/ddp_async-first.out" || fail "A ddp_async: no asynchronous save reported"
}

# ---- M. the reshard matrix: every layout's step-6 checkpoint loads into every other ---------
# (no steps run: the loader's weights must be the writer's, bitwise)
declare -A NPROC=([single]=1 [ddp]=2 [zero1]=2 [zero2]=2 [zero3]=2 [pipe]=2 [tp]=2)
declare -A SECTIONS=([single]='strategy { name: "single" }' [ddp]='strategy { name: "ddp" }'
  [zero1]='strategy { name: "zero" } zero_optimization { stage: 1 }'
  [zero2]='strategy { name: "zero" } zero_optimization { stage: 2 }'
  [zero3]='strategy { name: "zero" } zero_optimization { stage: 3 }'
  [pipe]='parallel { pipeline: 2 }' [tp]='parallel { tensor: 2 } strategy { name: "single" }')
LAYOUTS="single ddp zero1 zero2 zero3 pipe tp"
matrix_row() {  # FROM: its step-6 checkpoint into each of the 6 other layouts
  local from=$1 to d row_ok=0
  for to in $LAYOUTS; do
    [ "$from" = "$to" ] && continue
    d="$T/m-$from-$to"; rm -rf "$d"; mkdir -p "$d"; cp -r "$T/$from-ckpt/step_6" "$d/"
    cfg "$d.pbtxt" 2 2 "$ADAMW" "${SECTIONS[$to]} checkpoint { dir: \"$d\" }"
    if run "m-$from-$to" ${NPROC[$to]} "$d.pbtxt" -- --save_to="$d.safetensors" &&
       cmp -s "$d.safetensors" "$T/$from-plain.safetensors"; then
      row_ok=$((row_ok+1))
    else
      fail "M $from -> $to"; tail -3 "$T/m-$from-$to.out"
    fi
  done
  echo "ok   M $row_ok of 6 loaders load $from's checkpoint bitwise"
}

# ---- B. reshard ------------------------------------------------------------------------------
reshard() {  # NAME NPROC MICRO ACCUM SECTIONS (loads the one process's step 3, trains to 6)
  rm -rf "$T/r-$1-ckpt"; cp -r "$T/r-src" "$T/r-$1-ckpt"
  cfg "$T/r-$1.pbtxt" $3 $4 "$SGDM" "$5 checkpoint { dir: \"$T/r-$1-ckpt\" }"
  run "r-$1" $2 "$T/r-$1.pbtxt" -- --save_to="$T/r-$1.safetensors" || { fail "B $1: run"; tail -5 "$T/r-$1.out"; return; }
  grep -q "resumed from $T/r-$1-ckpt/step_3" "$T/r-$1.out" || { fail "B $1: did not load step 3"; return; }
  if /usr/bin/python3 "$CMP" "$T/r-$1.safetensors" "$T/r-plain.safetensors" 2e-6; then
    echo "ok   B one process -> $1"
  else
    fail "B one process -> $1"
  fi
}
case_b() {
  cfg "$T/r-single.pbtxt" 4 1 "$SGDM" "strategy { name: \"single\" } checkpoint { dir: \"$T/r-src\" every_steps: 3 }"
  run r-src 1 "$T/r-single.pbtxt" -- --steps=3 || fail "B: source run"
  cfg "$T/r-plain.pbtxt" 4 1 "$SGDM" 'strategy { name: "single" }'
  run r-plain 1 "$T/r-plain.pbtxt" -- --save_to="$T/r-plain.safetensors" || fail "B: plain run"
  reshard ddp2 2 2 1 'strategy { name: "ddp" }'
  reshard zero3 2 2 1 'strategy { name: "zero" } zero_optimization { stage: 3 }'
  reshard tp2 2 4 1 'parallel { tensor: 2 } strategy { name: "single" }'
  reshard pipe2 2 2 2 'parallel { pipeline: 2 }'
  # And back: ZeRO-3's checkpoint (written at step 6 by the run above) into one process, no steps.
  cfg "$T/r-back.pbtxt" 4 1 "$SGDM" "strategy { name: \"single\" } checkpoint { dir: \"$T/r-zero3-ckpt\" }"
  run r-back 1 "$T/r-back.pbtxt" -- --save_to="$T/r-back.safetensors" || fail "B back: run"
  if cmp -s "$T/r-back.safetensors" "$T/r-zero3.safetensors"; then echo "ok   B ZeRO-3 on 2 -> one process, bitwise"; else fail "B ZeRO-3 -> one process"; fi
}

# ---- C. a damaged file (after A's single) ----------------------------------------------------
case_c() {
  rm -rf "$T/c-ckpt"; cp -r "$T/single-ckpt" "$T/c-ckpt"  # step_3 and step_6
  printf '\x55' | dd of="$T/c-ckpt/step_6/rank0.safetensors" bs=1 seek=5000 count=1 conv=notrunc 2>/dev/null
  cfg "$T/c.pbtxt" 4 1 "$ADAMW" "strategy { name: \"single\" } checkpoint { dir: \"$T/c-ckpt\" every_steps: 3 }"
  run c 1 "$T/c.pbtxt" -- --save_to="$T/c.safetensors" || fail "C: run"
  grep -q "c-ckpt/step_6/rank0.safetensors is damaged" "$T/c.out" &&
    grep -q "resumed from $T/c-ckpt/step_3" "$T/c.out" && cmp -s "$T/c.safetensors" "$T/single-plain.safetensors" &&
    echo "ok   C damaged step_6 named, step_3 used, same end" || { fail "C"; tail -5 "$T/c.out"; }
}

# ---- D, E. a worker killed, the group restarted (after A's DDP) ----------------------------
restart() {  # NAME FAULT
  cfg "$T/$1.pbtxt" 2 1 "$ADAMW" "strategy { name: \"ddp\" } checkpoint { dir: \"$T/$1-ckpt\" every_steps: 2 }"
  BRAID_FAULT="$2" run "$1" 2 "$T/$1.pbtxt" --max_restarts=1 -- --save_to="$T/$1.safetensors" ||
    { fail "$1: the restarted job failed"; tail -8 "$T/$1.out"; return; }
  grep -q "resumed from $T/$1-ckpt/step_$3" "$T/$1.out" || { fail "$1: did not resume from step $3"; tail -8 "$T/$1.out"; return; }
  cmp -s "$T/$1.safetensors" "$T/ddp-plain.safetensors" && echo "ok   $1: restarted from step $3, bitwise equal to uninterrupted" ||
    fail "$1: final weights differ"
}

# ---- F. a save that cannot be written ---------------------------------------------------------
case_f() {
  cfg "$T/f.pbtxt" 4 1 "$ADAMW" "strategy { name: \"single\" } checkpoint { dir: \"$T/f-ckpt\" every_steps: 2 }"
  run f-first 1 "$T/f.pbtxt" -- --steps=2 || fail "F: first run"
  local rc
  ( ulimit -f 20000; bounded "$TR" --config="$T/f.pbtxt" --steps=4 --log_dir="$T/f-full" > "$T/f-full.out" 2>&1 ); rc=$?
  [ $rc -ne 0 ] && grep -q "is the disk full? the previous checkpoint is kept" "$T/f-full.out" ||
    { fail "F: no clear error (exit $rc)"; tail -5 "$T/f-full.out"; }
  [ -d "$T/f-ckpt/step_2" ] && [ ! -d "$T/f-ckpt/step_4" ] || fail "F: the checkpoints are not as they were"
  run f-after 1 "$T/f.pbtxt" -- --steps=2 && grep -q "resumed from $T/f-ckpt/step_2" "$T/f-after.out" &&
    echo "ok   F clear error on a failed save; step_2 intact and loadable" || fail "F: step_2 not usable"
}

# ---- the shards --------------------------------------------------------------------------------
# Balanced by measurement ("ran ..." lines): a layout's A and matrix row take about as long as B,
# or as C, D and E together; the asynchronous A about as long as half a layout.
if shard 0; then
  exact_layout single; exact_layout ddp
  matrix_row single; matrix_row ddp
  case_c
  restart d-kill kill_at_step:5 4
  restart e-kill-in-save kill_in_save:4 2
fi
if shard 1; then
  exact_layout zero1; exact_layout zero2
  matrix_row zero1; matrix_row zero2
  case_f
fi
if shard 2; then
  exact_layout zero3; exact_layout pipe
  matrix_row zero3; matrix_row pipe
  exact_async
fi
if shard 3; then
  exact_layout tp
  matrix_row tp
  case_b
fi
finish
