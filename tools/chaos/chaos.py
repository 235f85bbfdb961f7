#!/usr/bin/env python3
"""tools/chaos: a training run that is killed on purpose, and must lose nothing.

gpt-mini on 2 nodes x 2 ranks (ZeRO-2, asynchronous checkpoints every --every steps, the
launchers under --max_restarts) while a seeded schedule SIGKILLs random ranks, a launcher, a
rank in the middle of writing its checkpoint file, and fills the checkpoint disk once. Then the
same job runs uninterrupted, and the two are compared:
  - the final weights are bitwise equal;
  - every rank's metrics hold every step exactly once, each with the uninterrupted run's loss;
  - no process of the run and no shared-memory segment (/dev/shm) is left;
  - every failure is named in the launchers' output (and the full disk in the workers' logs).
It prints each fault with what it cost (steps redone, seconds from the fault until training was
back at the step it had reached, against the checkpoint interval's seconds) and the wall time
against the uninterrupted run's. Exit 0 when every check holds, 1 otherwise, 2 on bad flags.

Nodes: with root and `ip netns`, each launcher runs in its own network namespace (a veth pair
between them, the master address on it); otherwise both run on this machine's loopback
(--nnodes=2 --node_rank=0/1) with a port this tool holds. The checkpoint folder is a tmpfs and
/dev/shm a private one, both in a private mount namespace of this tool (root): the disk can be
filled, and a segment left there is this run's. Without root the disk is not filled (said so)
and leftovers in /dev/shm are those named by this run's worker pids.

The schedule is seeded (--seed) and every fault is placed by a step number the run itself
reports (its metrics lines), never by a sleep: a rank kill after the step line S, the disk filled
after step S (the next save fails), the write killed once the rank says it is holding it
(BRAID_FAULT=hold_in_save, plugins/checkpoint), a launcher kill after step S.

  bazel run //tools/chaos -- [--steps=300 --every=20 --seed=1 --rank_kills=3 ...]
"""
import argparse
import json
import os
import random
import re
import signal
import sys
import tempfile
import time

# chaos_job.py sits beside this file (in the source tree and in Bazel's runfiles).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos_job import Job, Nodes, POLL_S, die, private_mounts, processes_of, program_root, read  # noqa: E402


def parse_args(argv):
    a = argparse.ArgumentParser(prog="chaos", description=__doc__.split("\n\n")[0])
    a.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    a.add_argument("--every", type=int, default=20, help="checkpoint interval in steps (default 20)")
    a.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    a.add_argument("--rank_kills", type=int, default=3, help="random ranks SIGKILLed (default 3)")
    a.add_argument("--launcher_kills", type=int, default=1, help="launchers SIGKILLed (default 1)")
    a.add_argument("--save_kills", type=int, default=1,
                   help="ranks SIGKILLed while writing their checkpoint file (default 1)")
    a.add_argument("--disk_full", type=int, default=1, help="times the checkpoint disk is filled (default 1)")
    a.add_argument("--micro", type=int, default=4, help="micro-batch per rank (default 4)")
    a.add_argument("--nodes", choices=["auto", "netns", "loopback"], default="auto",
                   help="how the 2 nodes are made (default auto: netns with root, else loopback)")
    a.add_argument("--out", default="", help="folder for the runs (default: a new one under runs/ "
                   "in the workspace, or a temporary one)")
    a.add_argument("--json", default="", help="also write the figures as JSON to this file")
    a.add_argument("--timeout_s", type=int, default=3600, help="give up on a run after this long")
    args = a.parse_args(argv)
    for name in ("steps", "every", "micro", "timeout_s"):
        if getattr(args, name) < 1:
            die(f"--{name}={getattr(args, name)}: must be at least 1")
    for name in ("rank_kills", "launcher_kills", "save_kills", "disk_full"):
        if getattr(args, name) < 0:
            die(f"--{name}={getattr(args, name)}: must be 0 or more")
    faults = args.rank_kills + args.launcher_kills + args.save_kills + args.disk_full
    if args.steps < args.every * (faults + 2):
        die(f"--steps={args.steps} is too short for {faults} fault(s) {args.every} steps apart: "
            f"give at least {args.every * (faults + 2)} steps, or fewer faults, or a smaller --every")
    if args.every < 4:
        die(f"--every={args.every}: must be at least 4 (a fault needs steps between two saves)")
    return args


# ---- the schedule --------------------------------------------------------------------------
def schedule(args):
    """Faults in step order: (kind, step, target). Each sits in its own checkpoint interval, away
    from the saves at its ends, so the step it resumes from is the interval's start."""
    rng = random.Random(args.seed)
    kinds = (["rank"] * args.rank_kills + ["launcher"] * args.launcher_kills +
             ["save"] * args.save_kills + ["disk"] * args.disk_full)
    rng.shuffle(kinds)
    intervals = args.steps // args.every  # interval k covers steps [k*E, (k+1)*E)
    # Intervals 1 .. intervals-2: each fault has a checkpoint before it and steps after it.
    chosen = sorted(rng.sample(range(1, intervals - 1), len(kinds)))
    events = []
    for kind, k in zip(kinds, chosen):
        start = k * args.every
        if kind == "save":
            # The save at the end of interval k is held and its writer killed.
            events.append({"kind": kind, "step": start + args.every - 1, "save": start + args.every})
            continue
        # The step after which it strikes: at least 2 steps after the save that opened the
        # interval (an asynchronous save commits at a later step) and 3 before the next one.
        step = start + rng.randint(min(2, args.every - 4), args.every - 4)
        ev = {"kind": kind, "step": step}
        if kind == "rank":
            ev["rank"] = rng.randrange(4)
        elif kind == "launcher":
            ev["node"] = rng.randrange(2)
        else:
            ev["save"] = start + args.every  # the save that finds the disk full
        events.append(ev)
    return events


# ---- the tool ------------------------------------------------------------------------------
class Chaos:
    def __init__(self, args):
        self.args = args
        self.fails = []
        root = program_root()
        self.launcher = os.path.join(root, "launcher", "launcher")
        # Inside a runfiles tree the launcher finds the training program (and it its plugins)
        # through it.
        self.runfiles = os.path.dirname(root) if os.path.basename(root) == "braid" else ""
        ws = os.environ.get("BUILD_WORKSPACE_DIRECTORY", "")
        if not args.out and os.environ.get("TEST_TMPDIR"):
            args.out = os.path.join(os.environ["TEST_TMPDIR"], "chaos")
        if args.out:
            self.out = os.path.abspath(os.path.join(ws, args.out) if ws else args.out)
        elif ws:
            self.out = os.path.join(ws, "runs", time.strftime("chaos-%Y%m%d-%H%M%S"))
        else:
            self.out = tempfile.mkdtemp(prefix="chaos-")
        os.makedirs(self.out, exist_ok=True)
        self.token = os.urandom(32).hex()
        self.marker = f"chaos-{os.getpid()}-{os.urandom(4).hex()}"
        self.events = schedule(args)
        # Every fault but a launcher kill restarts the group once; a launcher kill starts a new job.
        self.max_restarts = len(self.events) + 2
        self.ckpt = os.path.join(self.out, "ckpt")
        os.makedirs(self.ckpt, exist_ok=True)
        self.private = private_mounts(self.ckpt, 192)
        self.shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        self.nodes = Nodes(args.nodes)
        self.seen_pids = set()
        self.figures = []

    def fail(self, msg):
        print(f"FAIL {msg}", flush=True)
        self.fails.append(msg)

    def ok(self, msg):
        print(f"ok   {msg}", flush=True)

    def abort(self):
        self.cleanup()
        print(f"{len(self.fails)} failure(s); the runs are in {self.out}")
        sys.exit(1)

    def cleanup(self):
        for pid in processes_of(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.nodes.close()

    def note_pids(self):
        for pid, env in processes_of(self.marker).items():
            if "RANK" in env:
                self.seen_pids.add(pid)

    # -- the faults --
    def hold_env(self, job, pending):
        """BRAID_FAULT for a new session: the held save, if it comes before the next launcher
        kill, with the attempt it falls in (each fault before it restarts the group once)."""
        restarts = 0
        for ev in pending:
            if ev["kind"] == "launcher":
                return ""
            if ev["kind"] == "save":
                return f"hold_in_save:{ev['save']}@{restarts}"
            if ev["kind"] != "disk" or self.private:  # an unfilled disk restarts nothing
                restarts += 1
        return ""

    def chaos_run(self):
        job = Job(self, "chaos", self.ckpt)
        pending = list(self.events)
        t0 = time.time()
        before = job.started_count()
        job.start(self.hold_env(job, pending))
        job.new_group(before)
        while pending:
            ev = pending.pop(0)
            self.note_pids()
            if ev["kind"] == "save":
                self.save_kill(job, ev, pending)
            else:
                job.wait(f"step {ev['step']}", lambda: job.latest_step() >= ev["step"])
                self.note_pids()
                getattr(self, ev["kind"] + "_fault")(job, ev, pending)
        job.wait("the end of the run", lambda: not any(job.alive()))
        wall = time.time() - t0
        codes = [p.returncode for p in job.procs]
        if codes == [0, 0]:
            self.ok(f"the chaos run finished: both launchers exit 0 after {wall:.0f} s, {job.sessions} job session(s)")
        else:
            self.fail(f"the chaos run's launchers exit {codes}")
        return job, wall

    def recovered(self, job, fig, step_at_fault, before):
        """After a fault: the new group's first step (where it resumed) and the seconds until it
        was back past the step the fault interrupted."""
        job.new_group(before)
        job.wait("the first step after the restart", lambda: job.first_step() is not None)
        fig["resumed_at"] = job.first_step()
        job.wait(f"step {step_at_fault} again", lambda: job.latest_step() >= step_at_fault)
        fig["lost_s"] = round(time.time() - fig["t"], 2)
        fig["redone_steps"] = step_at_fault + 1 - fig["resumed_at"]
        del fig["t"]
        self.figures.append(fig)
        print(f"     {fig['fault']}: resumed at step {fig['resumed_at']}, {fig['redone_steps']} step(s) "
              f"redone, back at step {step_at_fault} {fig['lost_s']} s after the fault", flush=True)

    def kill_rank(self, job, rank):
        pid = job.wait(f"rank {rank}'s process", lambda: job.worker_pid(rank), timeout=60)
        os.kill(pid, signal.SIGKILL)
        return pid

    def rank_fault(self, job, ev, pending):
        rank = ev["rank"]
        step = job.latest_step()
        before = job.started_count()
        t = time.time()
        pid = self.kill_rank(job, rank)
        fig = {"fault": f"SIGKILL rank {rank} after step {step}", "kind": "rank", "t": t}
        self.expect_named(job, rf"rank {rank} \(node {rank // 2}, host [^,]*, pid {pid}\) was killed by signal 9",
                          fig["fault"], node=rank // 2)
        self.recovered(job, fig, step, before)

    def save_fault(self, job, ev, pending):
        pass  # never scheduled through the step loop (save_kill)

    def save_kill(self, job, ev, pending):
        # Rank 3 says it holds its write of step_<save>; it is killed there.
        hold = re.compile(r"holding its write of (\S+), partly written \(pid (\d+)\)")
        log = os.path.join(job.run, "workerlog.3")
        n_before = len(hold.findall(read(log)))
        m = job.wait(f"rank 3 to hold its write of step {ev['save']}",
                     lambda: hold.findall(read(log))[n_before:] or None)
        path, pid = m[0][0], int(m[0][1])
        step = job.latest_step()
        before = job.started_count()
        t = time.time()
        os.kill(pid, signal.SIGKILL)
        fig = {"fault": f"SIGKILL rank 3 while it writes {os.path.basename(os.path.dirname(path))}/"
                        f"{os.path.basename(path)}", "kind": "save", "t": t}
        self.expect_named(job, rf"rank 3 \(node 1, host [^,]*, pid {pid}\) was killed by signal 9", fig["fault"],
                          node=1)
        self.recovered(job, fig, step, before)
        want = ev["save"] - self.args.every
        if fig["resumed_at"] == want and not os.path.isdir(os.path.join(self.ckpt, f"step_{ev['save']}")):
            self.ok(f"the interrupted save of step {ev['save']} was never committed; resumed from step {want}")
        elif fig["resumed_at"] != want:
            self.fail(f"after the killed save of step {ev['save']} the run resumed at {fig['resumed_at']}, not {want}")

    def disk_fault(self, job, ev, pending):
        if not self.private:
            print(f"     (no private tmpfs without root: the disk is not filled at step {ev['step']})")
            return
        step = job.latest_step()
        st = os.statvfs(self.ckpt)
        free = st.f_bavail * st.f_frsize
        filler = os.path.join(self.ckpt, "filler")
        fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(1, free - (256 << 10)))  # at once: no save slips in
        finally:
            os.close(fd)
        before = job.started_count()
        err0 = len(read(job.err(0)))
        # The save of ev["save"] runs out of space; the failure ends the group, which restarts.
        full = re.compile(r"writing '\S+/step_(\d+)\.tmp/rank\d\.safetensors' failed: No space left on device: "
                          r"the disk holding the checkpoint is full")
        logs = lambda: "".join(read(os.path.join(job.run, f"workerlog.{r}")) for r in range(4))
        seen = len(full.findall(logs()))
        failed = job.wait("a save to fail on the full disk", lambda: full.findall(logs())[seen:] or None)
        t = time.time()
        fig = {"fault": f"checkpoint disk filled after step {step} (the save of step {failed[0]} fails)",
               "kind": "disk", "t": t}
        job.wait("the launchers to restart the group",
                 lambda: "Restarting the worker group" in read(job.err(0))[err0:] or None)
        os.remove(filler)  # the operator frees the disk
        step = job.latest_step()
        self.expect_named(job, r"rank \d \(node \d, host [^,]*, pid \d+\) exited with code 1", fig["fault"])
        self.ok(f"the full disk is named in the workers' logs: /{full.pattern}/")
        self.recovered(job, fig, step, before)

    def launcher_fault(self, job, ev, pending):
        node = ev["node"]
        step = job.latest_step()
        before = job.started_count()
        t = time.time()
        job.procs[node].kill()
        fig = {"fault": f"SIGKILL node {node}'s launcher after step {step}", "kind": "launcher", "t": t}
        other = 1 - node
        job.wait(f"node {other}'s launcher to end the job", lambda: not any(job.alive()), timeout=120)
        want = (r"node 1's launcher \(host [^)]*\) stopped responding" if node == 1
                else r"node 1 lost the rendezvous store")
        self.expect_named(job, want, fig["fault"], node=other)
        if job.procs[other].returncode != 1:
            self.fail(f"after {fig['fault']}, node {other}'s launcher exits {job.procs[other].returncode}, not 1")
        # The scheduler's part: start the job again; it resumes from the newest checkpoint.
        job.start(self.hold_env(job, pending))
        self.recovered(job, fig, step, before)

    def expect_named(self, job, pattern, fault, node=None):
        nodes = [node] if node is not None else [0, 1]
        for n in nodes:
            text = ""
            deadline = time.time() + 60
            while time.time() < deadline:
                text = read(job.err(n))
                if re.search(pattern, text):
                    break
                time.sleep(POLL_S)
            if re.search(pattern, text):
                self.ok(f"{fault}: named by node {n}'s launcher (/{pattern}/)")
            else:
                self.fail(f"{fault}: node {n}'s launcher does not name it (/{pattern}/ not in {job.err(n)})")

    # -- the comparison --
    def reference_run(self):
        ref_ckpt = os.path.join(self.out, "reference", "ckpt")
        job = Job(self, "reference", ref_ckpt)
        t0 = time.time()
        job.start()
        job.wait("the end of the uninterrupted run", lambda: not any(job.alive()))
        wall = time.time() - t0
        codes = [p.returncode for p in job.procs]
        if codes != [0, 0]:
            self.fail(f"the uninterrupted run's launchers exit {codes}")
            self.abort()
        self.ok(f"the uninterrupted run: {wall:.0f} s")
        return job, wall

    def compare(self, chaos, ref):
        a, b = read_bytes(chaos.weights), read_bytes(ref.weights)
        if a is not None and a == b:
            self.ok(f"final weights bitwise equal ({len(a)} bytes)")
        else:
            self.fail("final weights differ from the uninterrupted run's")
        n = self.args.steps
        for rank in range(4):
            suffix = "" if rank == 0 else f".rank{rank}"
            got = metrics_steps(os.path.join(chaos.run, "metrics.jsonl" + suffix))
            want = metrics_steps(os.path.join(ref.run, "metrics.jsonl" + suffix))
            steps = [s for s, _ in got]
            if steps != list(range(n)):
                dup = sorted({s for s in steps if steps.count(s) > 1})
                missing = sorted(set(range(n)) - set(steps))
                self.fail(f"rank {rank}'s metrics: {len(steps)} step lines; repeated {dup[:10]}, missing {missing[:10]}")
            elif got != want:
                diff = [s for (s, l), (_, m) in zip(got, want) if l != m]
                self.fail(f"rank {rank}'s metrics: losses differ from the uninterrupted run's at steps {diff[:10]}")
            else:
                self.ok(f"rank {rank}'s metrics: steps 0-{n - 1} each exactly once, every loss the uninterrupted run's")

    def leftovers(self):
        left = processes_of(self.marker)
        if left:
            self.fail(f"processes left behind: {sorted(left)}")
        else:
            self.ok("no process of the run is left")
        now = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        new = sorted(now - self.shm_before)
        if not self.private:  # a shared /dev/shm: only names made by this run's workers count
            new = [n for n in new if any(n.startswith(f"braid-{p}-") for p in self.seen_pids)]
        if new:
            self.fail(f"shared-memory segments left in /dev/shm: {new[:10]}")
        else:
            self.ok(f"nothing left in /dev/shm ({'a private tmpfs for this run' if self.private else 'segments of this run'})")

    def report(self, chaos_wall, ref_wall, ref):
        step_s = step_seconds(os.path.join(ref.run, "metrics.jsonl"))
        interval_s = step_s * self.args.every
        print(f"\nfaults survived: {len(self.figures)} of {len(self.events)}; checkpoint interval "
              f"{self.args.every} steps = {interval_s:.1f} s (median step {step_s:.3f} s, uninterrupted run)")
        # Lost time = the steps redone (at the uninterrupted run's median step) + the restart
        # itself (stopping, check-in, new processes, loading the checkpoint).
        print(f"{'fault':<72} {'resumed':>7} {'redone':>6} {'lost s':>7} {'/interval':>9} {'restart s':>9}")
        for f in self.figures:
            f["lost_intervals"] = round(f["lost_s"] / interval_s, 2) if interval_s > 0 else None
            f["restart_s"] = round(f["lost_s"] - f["redone_steps"] * step_s, 1)
            print(f"{f['fault']:<72} {f['resumed_at']:>7} {f['redone_steps']:>6} {f['lost_s']:>7.1f} "
                  f"{f['lost_intervals']:>9.2f} {f['restart_s']:>9.1f}")
        print(f"wall time: chaos {chaos_wall:.0f} s, uninterrupted {ref_wall:.0f} s "
              f"(+{chaos_wall - ref_wall:.0f} s, {chaos_wall / ref_wall:.2f}x)")
        if self.args.json:
            with open(self.args.json, "w") as f:
                json.dump({"steps": self.args.steps, "every": self.args.every, "seed": self.args.seed,
                           "nodes": self.nodes.describe(), "median_step_s": step_s,
                           "interval_s": interval_s, "faults": self.figures, "chaos_wall_s": chaos_wall,
                           "uninterrupted_wall_s": ref_wall, "failures": self.fails}, f, indent=1)

    def main(self):
        print(f"braid chaos: gpt-mini, ZeRO-2, 2 nodes x 2 ranks ({self.nodes.describe()}), {self.args.steps} steps, "
              f"asynchronous checkpoints every {self.args.every} on "
              f"{'a private tmpfs' if self.private else 'the ordinary disk (no root: the disk is not filled)'}; "
              f"runs in {self.out}")
        print("schedule (seed %d): %s" % (self.args.seed, "; ".join(describe(e) for e in self.events)), flush=True)
        # Stopped from outside (Bazel's timeout, Ctrl-C): the finally below still kills the run's
        # processes and deletes the namespaces.
        signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))
        try:
            chaos, chaos_wall = self.chaos_run()
            ref, ref_wall = self.reference_run()
            self.compare(chaos, ref)
            self.leftovers()
            self.report(chaos_wall, ref_wall, ref)
        finally:
            self.cleanup()
        if self.fails:
            print(f"{len(self.fails)} failure(s); the runs are in {self.out}")
            return 1
        print("PASS")
        return 0


def describe(e):
    if e["kind"] == "rank":
        return f"SIGKILL rank {e['rank']} after step {e['step']}"
    if e["kind"] == "launcher":
        return f"SIGKILL node {e['node']}'s launcher after step {e['step']}"
    if e["kind"] == "save":
        return f"SIGKILL rank 3 in its write of step_{e['save']}"
    return f"fill the checkpoint disk after step {e['step']}"


def read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def metrics_steps(path):
    """(step, loss text) of every step line, in file order."""
    out = []
    for line in read(path).splitlines():
        m = re.match(r'^\{"time": [0-9.]+, "step": (\d+), "loss": ([^,]+),', line)
        if m:
            out.append((int(m.group(1)), m.group(2)))
    return out


def step_seconds(path):
    vals = sorted(float(m) for m in re.findall(r'"step_s": ([0-9.eE+-]+)', read(path)))
    return vals[len(vals) // 2] if vals else 0.0


if __name__ == "__main__":
    sys.exit(Chaos(parse_args(sys.argv[1:])).main())
