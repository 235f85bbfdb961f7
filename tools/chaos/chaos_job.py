"""The machine and the job for tools/chaos (chaos.py): where the two launchers run (network
namespaces or loopback), the private tmpfs mounts, the run's processes, and one job's launchers
with what they report (metrics lines, launcher output)."""
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

POLL_S = 0.05  # how often the run's files are read: observation only, nothing waits on it


def die(msg, code=2):
    print(f"braid chaos: {msg}", file=sys.stderr)
    sys.exit(code)


def program_root():
    """The folder holding launcher/launcher and launcher/train: this tool's runfiles under
    `bazel run` or `bazel test`, else the workspace's bazel-bin."""
    here = os.path.dirname(os.path.abspath(__file__))
    ws = os.environ.get("BUILD_WORKSPACE_DIRECTORY", "")
    candidates = [os.path.join(os.environ.get("TEST_SRCDIR", ""), "braid"),
                  os.path.join(os.environ.get("RUNFILES_DIR", ""), "braid"), os.getcwd(),
                  os.path.join(here, "../.."), os.path.join(here, "../../bazel-bin"),
                  os.path.join(ws, "bazel-bin") if ws else ""]
    for root in candidates:
        if root and all(os.access(os.path.join(root, "launcher", n), os.X_OK) for n in ("launcher", "train")):
            return os.path.abspath(root)
    die("cannot find launcher/launcher and launcher/train: run through `bazel run //tools/chaos`, "
        "or build //launcher and //launcher:train first")


# ---- the machine ---------------------------------------------------------------------------
CLONE_NEWNS = 0x00020000


def private_mounts(ckpt, tmpfs_mb):
    """A private mount namespace for this process and its children: the checkpoint folder and
    /dev/shm become tmpfs mounts that exist only for this run and vanish with it. False when this
    machine does not allow it (no root)."""
    if os.geteuid() != 0:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        return False
    ok = subprocess.run(["mount", "--make-rprivate", "/"]).returncode == 0
    ok = ok and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_mb}m", "tmpfs", ckpt]).returncode == 0
    ok = ok and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", "/dev/shm"]).returncode == 0
    if not ok:
        die("cannot mount tmpfs in this tool's private mount namespace", 1)
    return True


class Nodes:
    """Where the two launchers run: two network namespaces, or this machine's loopback."""

    def __init__(self, mode):
        self.netns = []
        self.held = None
        if mode in ("auto", "netns") and os.geteuid() == 0 and shutil.which("ip"):
            tag = f"{os.getpid() % 100000}{random.SystemRandom().randrange(65536):04x}"
            ns = [f"braid_c0_{tag}", f"braid_c1_{tag}"]
            cmds = [["ip", "netns", "add", ns[0]], ["ip", "netns", "add", ns[1]],
                    ["ip", "-n", ns[0], "link", "add", f"bc0_{tag}", "type", "veth", "peer", "name",
                     f"bc1_{tag}", "netns", ns[1]],
                    ["ip", "-n", ns[0], "addr", "add", "10.124.0.1/24", "dev", f"bc0_{tag}"],
                    ["ip", "-n", ns[1], "addr", "add", "10.124.0.2/24", "dev", f"bc1_{tag}"]]
            for n in ns:
                cmds += [["ip", "-n", n, "link", "set", "lo", "up"]]
            cmds += [["ip", "-n", ns[0], "link", "set", f"bc0_{tag}", "up"],
                     ["ip", "-n", ns[1], "link", "set", f"bc1_{tag}", "up"]]
            self.netns = ns
            for c in cmds:
                r = subprocess.run(c, capture_output=True, text=True)
                if r.returncode != 0:
                    self.close()
                    if mode == "netns":
                        die(f"cannot make the network namespaces: {' '.join(c)}: {r.stderr.strip()}", 1)
                    break
        if self.netns:
            self.addr, self.port = "10.124.0.1", 29500  # namespaces of our own: nothing else there
        else:
            if mode == "netns":
                die("--nodes=netns needs root and `ip` (iproute2)", 1)
            # A port this tool holds (bound, never listening) for the whole run: the store, which
            # sets SO_REUSEADDR, can still listen there; nobody else gets it.
            self.held = socket.socket()
            self.held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.held.bind(("127.0.0.1", 0))
            self.addr, self.port = "127.0.0.1", self.held.getsockname()[1]

    def describe(self):
        if self.netns:
            return f"2 network namespaces ({self.netns[0]}, {self.netns[1]}) joined by a veth pair"
        return f"2 launchers on this machine's loopback (port {self.port})"

    def prefix(self, node):
        return ["ip", "netns", "exec", self.netns[node]] if self.netns else []

    def close(self):
        for n in self.netns:
            r = subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True)
            for p in r.stdout.split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        self.netns = []


def processes_of(marker):
    """pid -> environment of every process that carries this run's marker variable."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        if marker.encode() not in raw:
            continue
        env = {}
        for item in raw.split(b"\0"):
            k, _, v = item.partition(b"=")
            env[k.decode(errors="replace")] = v.decode(errors="replace")
        found[int(d)] = env
    return found


# ---- one job ------------------------------------------------------------------------------
STEP_LINE = re.compile(r'^\{"time": ([0-9.]+), "step": (\d+), "loss"')


def step_lines(path):
    """(time, step) of every step line in a metrics file."""
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = STEP_LINE.match(line)
                if m:
                    out.append((float(m.group(1)), int(m.group(2))))
    except FileNotFoundError:
        pass
    return out


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


class Job:
    """The launchers of one job (both nodes), started again after a launcher is killed."""

    def __init__(self, tool, name, ckpt):
        self.t = tool
        self.name = name
        self.dir = os.path.join(tool.out, name)
        self.run = os.path.join(self.dir, "run")
        os.makedirs(self.run, exist_ok=True)
        self.cfg = os.path.join(self.dir, "job.pbtxt")
        self.weights = os.path.join(self.dir, "final.safetensors")
        with open(self.cfg, "w") as f:
            f.write(f"""model {{ name: "gpt-mini" }}
data {{ dataset: "moby-dick" sampler: "random" seed: 1234 }}
train_micro_batch_size_per_gpu: {tool.args.micro}
steps: {tool.args.steps}
optimizer {{ type: "AdamW" params {{ lr: 1e-3 betas: [0.9, 0.95] weight_decay: 0.1 }} }}
zero_optimization {{ stage: 2 }}
strategy {{ name: "zero" }}
checkpoint {{ dir: "{ckpt}" every_steps: {tool.args.every} keep_last: 2 async: true }}
log {{ print_every: 10 }}
""")
        self.procs = [None, None]
        self.sessions = 0
        self.epoch = 0.0  # when the current worker group started: its metrics lines are newer

    def err(self, node):
        return os.path.join(self.dir, f"launcher{node}.err")

    def start(self, fault_env=""):
        self.sessions += 1
        common = ["--nnodes=2", "--nproc_per_node=2", f"--master_addr={self.t.nodes.addr}",
                  f"--master_port={self.t.nodes.port}", f"--max_restarts={self.t.max_restarts}",
                  f"--log_dir={self.run}", "--heartbeat_timeout_s=5", "--stop_grace_s=3",
                  "--connect_timeout_s=60", "--rdzv_timeout_s=120", "--tail_lines=4"]
        env = dict(os.environ, BRAID_JOB_TOKEN=self.t.token, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", BRAID_CHAOS_RUN=self.t.marker)
        env.pop("BRAID_FAULT", None)
        if self.t.runfiles:
            env["RUNFILES_DIR"] = self.t.runfiles
        if fault_env:
            env["BRAID_FAULT"] = fault_env
        for node in (0, 1):
            with open(self.err(node), "a") as e:
                e.write(f"===== braid chaos: job session {self.sessions}"
                        f"{' with BRAID_FAULT=' + fault_env if fault_env else ''} =====\n")
            cmd = self.t.nodes.prefix(node) + [self.t.launcher] + common + [
                f"--node_rank={node}", "--", f"--config={self.cfg}", f"--save_to={self.weights}"]
            self.procs[node] = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                                stdout=open(os.path.join(self.dir, f"launcher{node}.out"), "a"),
                                                stderr=open(self.err(node), "a"))

    def started_count(self):
        """How many times node 0's launcher said it started its workers (first start and restarts)."""
        return len(re.findall(r"node 0 \([^)]*\) started ranks 0-1 of 4", read(self.err(0))))

    def alive(self):
        return [p is not None and p.poll() is None for p in self.procs]

    def latest_step(self):
        """The newest step the current worker group reported (-1: none yet)."""
        steps = [s for t, s in step_lines(os.path.join(self.run, "metrics.jsonl")) if t >= self.epoch]
        return max(steps) if steps else -1

    def first_step(self):
        steps = [s for t, s in step_lines(os.path.join(self.run, "metrics.jsonl")) if t >= self.epoch]
        return steps[0] if steps else None

    def wait(self, what, cond, timeout=None):
        deadline = time.time() + (timeout or self.t.args.timeout_s)
        while True:
            v = cond()
            if v:
                return v
            if time.time() > deadline:
                self.t.fail(f"{self.name}: gave up waiting for {what}")
                self.t.abort()
            if not any(self.alive()):
                # Both launchers ended: the job is over, whatever we waited for.
                v = cond()
                if v:
                    return v
                self.t.fail(f"{self.name}: the job ended while waiting for {what} "
                            f"(exit codes {[p.returncode for p in self.procs]}); see {self.dir}")
                self.t.abort()
            time.sleep(POLL_S)

    def new_group(self, before):
        """Waits until node 0 starts a worker group again (a restart or a new session); the
        current group's lines are those written after that."""
        self.wait("the worker group to start again", lambda: self.started_count() > before)
        self.epoch = time.time()

    def worker_pid(self, rank):
        for pid, env in processes_of(self.t.marker).items():
            if env.get("RANK") == str(rank) and "BRAID_RESTART_COUNT" in env:
                return pid
        return None
