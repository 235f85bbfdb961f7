#!/usr/bin/env bash
# DeepSpeed's monitors from a DeepSpeed JSON config, 2 processes through the launcher, 4 steps:
#   - tensorboard { enabled output_path job_name } writes an event file that an independent reader
#     (below: pure Python, its own CRC-32C and protobuf decoding, no TensorBoard package) decodes:
#     every record's two masked CRC-32Cs check, the first record is the file version, then one
#     event per step at x = samples so far ((step + 1) x train_batch_size 4), whose
#     Train/Samples/train_loss and lr equal metrics.jsonl's loss (exactly, as f32) and lr;
#   - csv_monitor { enabled job_name } (no output_path: the run folder) writes DeepSpeed's files,
#     Train_Samples_train_loss.csv ("step,train_loss") and Train_Samples_lr.csv, with the same
#     rows;
#   - wall_clock_breakdown with steps_per_print 2 prints DeepSpeed's timer line for steps 1, 2-3
#     and 4, each phase the sum of metrics.jsonl's per-step times (to the 0.01 ms printed, plus
#     the metrics' microsecond rounding), and adds the elapsed_time_ms_* events;
#   - the MFU: the summary's flops_per_token equals 6 N + 12 L d T computed here from the shape
#     (N counted here, the position embedding left out), and its mfu equals
#     flops_per_token x median tokens/s / (2 processes x the peak: the faster of the ceiling's
#     measurements at the start and the end), within 1e-5 relative (the printed digits); each
#     step's mfu likewise with its tokens_per_s and the start's measurement, which is no faster;
#   - wandb and comet enabled are refused, one line each, before anything runs.
source "$TEST_SRCDIR/braid/tests/distributed/lib.sh" monitors
cat > "$T/ds.json" <<CFG
{
  "model": {"name": "gpt-mini", "n_layer": 1},
  "data": {"dataset": "moby-dick"},
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 1,
  "steps": 4,
  "steps_per_print": 2,
  "wall_clock_breakdown": true,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "tensorboard": {"enabled": true, "output_path": "$T/tb", "job_name": "tbjob"},
  "csv_monitor": {"enabled": true, "job_name": "csvjob"},
  "wandb": {"enabled": false}
}
CFG
bounded "$L" --nproc_per_node=2 -- --config="$T/ds.json" --log_dir="$T/run" > "$T/run.out" 2>&1 ||
  { fail "training: $(ended $?)"; tail -20 "$T/run.out"; finish; }
grep -q "^braid: monitors: TensorBoard events in $T/tb/tbjob/events\.out\.tfevents\.[^,]*, CSV files in $T/run/csvjob" "$T/run.out" &&
  echo "ok   $(grep '^braid: monitors:' "$T/run.out" | cut -c1-100)..." || { fail "no monitors line"; grep braid: "$T/run.out"; }
n=$(ls "$T/tb/tbjob" | grep -c '^events\.out\.tfevents\.')
[ "$n" = 1 ] || fail "$n event files in $T/tb/tbjob, want 1 (rank 0's)"

/usr/bin/python3 - "$T/run/metrics.jsonl" "$T/tb/tbjob" "$T/run/csvjob" <<'PY' || fail "monitor files"
import glob, json, math, os, struct, sys
metrics_path, tb_dir, csv_dir = sys.argv[1:]
steps = [json.loads(l) for l in open(metrics_path) if '"step"' in l]
assert [s["step"] for s in steps] == [0, 1, 2, 3], steps
BATCH = 4  # train_batch_size: 2 per rank x 2 ranks

# ---- CRC-32C (Castagnoli), bit by bit, and TFRecord's mask ----
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF
assert crc32c(b"123456789") == 0xE3069283
def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

# ---- protobuf wire format: (field number, wire type, value) ----
def varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]; i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i
def fields(buf):
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v = buf[i:i + 8]; i += 8
        elif wt == 2:
            n, i = varint(buf, i); v = buf[i:i + n]; i += n
        elif wt == 5:
            v = buf[i:i + 4]; i += 4
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v

def read_events(path):
    data = open(path, "rb").read()
    i, events = 0, []
    while i < len(data):
        header = data[i:i + 8]
        (n,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        assert hcrc == masked(header), f"length CRC at {i}"
        body = data[i + 12:i + 12 + n]
        (dcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        assert dcrc == masked(body), f"data CRC at {i}"
        i += 16 + n
        e = {"values": {}}
        for num, wt, v in fields(body):
            if num == 1 and wt == 1: e["wall_time"] = struct.unpack("<d", v)[0]
            elif num == 2 and wt == 0: e["step"] = v
            elif num == 3 and wt == 2: e["file_version"] = v.decode()
            elif num == 5 and wt == 2:
                for vnum, vwt, value in fields(v):
                    assert vnum == 1 and vwt == 2, (vnum, vwt)
                    tag, simple = None, None
                    for fnum, fwt, f in fields(value):
                        if fnum == 1 and fwt == 2: tag = f.decode()
                        elif fnum == 2 and fwt == 5: simple = struct.unpack("<f", f)[0]
                    e["values"][tag] = simple
        events.append(e)
    return events

def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]

(path,) = glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))
events = read_events(path)
assert events[0].get("file_version") == "brain.Event:2", events[0]
scalars = events[1:]
assert [e["step"] for e in scalars] == [(s["step"] + 1) * BATCH for s in steps], [e["step"] for e in scalars]
for e, s in zip(scalars, steps):
    assert e["values"]["Train/Samples/train_loss"] == f32(s["loss"]), (e, s["loss"])
    lr = e["values"]["Train/Samples/lr"]
    assert abs(lr - s["lr"]) <= 1e-5 * abs(s["lr"]), (lr, s["lr"])  # metrics.jsonl prints lr to 6 digits
    assert math.isfinite(e["wall_time"]) and abs(e["wall_time"] - s["time"]) < 60, (e["wall_time"], s["time"])
for e in scalars:
    for k in ("forward", "backward", "backward_inner", "backward_allreduce", "step"):
        v = e["values"][f"Train/Samples/elapsed_time_ms_{k}"]
        assert v >= 0 and v == v, (k, v)
print(f"ok   TensorBoard: {len(events)} records, CRCs checked; x {[e['step'] for e in scalars]}, "
      f"losses {[round(e['values']['Train/Samples/train_loss'], 4) for e in scalars]} = metrics.jsonl's")

rows = [l.rstrip("\n").split(",") for l in open(os.path.join(csv_dir, "Train_Samples_train_loss.csv"))]
assert rows[0] == ["step", "train_loss"], rows[0]
assert [int(r[0]) for r in rows[1:]] == [(s["step"] + 1) * BATCH for s in steps], rows
assert [float(r[1]) for r in rows[1:]] == [s["loss"] for s in steps], (rows, [s["loss"] for s in steps])
lr_rows = [l.rstrip("\n").split(",") for l in open(os.path.join(csv_dir, "Train_Samples_lr.csv"))]
assert lr_rows[0] == ["step", "lr"] and len(lr_rows) == 5, lr_rows
assert all(abs(float(r[1]) - s["lr"]) <= 1e-5 * abs(s["lr"]) for r, s in zip(lr_rows[1:], steps)), lr_rows
print(f"ok   CSV: {sorted(os.listdir(csv_dir))}, {len(rows) - 1} rows each, equal to metrics.jsonl")
PY

# ---- wall_clock_breakdown and MFU ----
/usr/bin/python3 - "$T/run/metrics.jsonl" "$T/run.out" <<'PY' || fail "wall_clock_breakdown / MFU"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "step" in r]
(summary,) = [r for r in rows if r.get("summary")]
lines = [l for l in open(sys.argv[2]) if "time (ms) |" in l]
pat = re.compile(r"^braid: steps (\d+)-(\d+): rank=0 time \(ms\) \| fwd: ([\d.]+) \| bwd: ([\d.]+) \| "
                 r"bwd_inner: ([\d.]+) \| bwd_allreduce: ([\d.]+) \| step: ([\d.]+)$")
got = [pat.match(l.rstrip("\n")) for l in lines]
assert all(got) and len(got) == 3, lines
assert [(int(m[1]), int(m[2])) for m in got] == [(1, 1), (2, 3), (4, 4)], lines
for m in got:
    a, b = int(m[1]) - 1, int(m[2])
    want = {k: 1e3 * sum(s[k] for s in steps[a:b]) for k in ("forward_s", "backward_s", "comm_exposed_s", "optimizer_s")}
    fwd, bwd, inner, comm, opt = (float(m[i]) for i in range(3, 8))
    tol = 0.005 + 1e-3 * (b - a)  # printed to 0.01 ms; metrics to 1 us per step
    for name, printed, w in [("fwd", fwd, want["forward_s"]), ("bwd_inner", inner, want["backward_s"]),
                             ("bwd_allreduce", comm, want["comm_exposed_s"]), ("step", opt, want["optimizer_s"]),
                             ("bwd", bwd, want["backward_s"] + want["comm_exposed_s"])]:
        assert abs(printed - w) <= tol, (name, printed, w, m[0])
print(f"ok   wall_clock_breakdown: {len(got)} lines, each the sum of its steps; e.g. {got[1][0][7:]}")

# 6 N + 12 L d T for gpt-mini with n_layer 1: d 256, T 128, V 256 (no padding).
d, L, T, V = 256, 1, 128, 256
N = V * d + L * (12 * d * d + 13 * d) + 2 * d
want_flops = 6 * N + 12 * L * d * T
assert abs(summary["flops_per_token"] - want_flops) <= 1e-5 * want_flops, (summary["flops_per_token"], want_flops)
peak = summary["peak_flops_per_s"]
assert peak > 1e8, peak
mfu = want_flops * summary["median_tokens_per_s"] / (2 * peak)
assert abs(summary["mfu"] - mfu) <= 1e-5 * mfu + 1e-6, (summary["mfu"], mfu)
# Each step's MFU is against the ceiling measured at the start; the summary's against the faster
# of that one and the end's.
start_peak = summary["start_peak_flops_per_s"]
assert 1e8 < start_peak <= peak, (start_peak, peak)
for s in steps:
    m = want_flops * s["tokens_per_s"] / (2 * start_peak)
    assert abs(s["mfu"] - m) <= 1e-5 * m + 1e-6, (s, m)
print(f"ok   MFU {100 * summary['mfu']:.1f}%: {want_flops} FLOP/token (6N + 12LdT, N = {N}) x "
      f"{summary['median_tokens_per_s']} tok/s / (2 x {peak / 1e9:.1f} GFLOP/s measured)")
PY
grep -qE "^braid: MFU [0-9.]+%: 5\.528e\+06 FLOP per token" "$T/run.out" &&
  echo "ok   $(grep '^braid: MFU' "$T/run.out" | cut -c1-100)..." || fail "no MFU summary line"
grep -qE "^step +[0-9]+/4 \| loss [0-9.]+ \| [0-9]+ tok/s \| MFU [0-9.]+% \| lr" "$T/run.out" &&
  echo "ok   the progress line shows the MFU" || fail "no MFU in the progress line"

for svc in wandb comet; do
  printf '{"steps": 1, "%s": {"enabled": true}}\n' $svc > "$T/$svc.json"
  if bounded "$TR" --config="$T/$svc.json" > "$T/$svc.out" 2>&1; then
    fail "$svc enabled: accepted"
  elif [ "$(wc -l < "$T/$svc.out")" = 1 ] && grep -q "$svc: Braid does not log to .*(no network\|over the network" "$T/$svc.out"; then
    echo "ok   refused: $(cut -c1-110 "$T/$svc.out")..."
  else
    fail "$svc enabled: $(cat "$T/$svc.out")"
  fi
done
finish
