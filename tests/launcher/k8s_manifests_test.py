#!/usr/bin/env python3
"""The Kubernetes examples (launcher/examples/kubernetes) describe a job the launcher can run.

Offline, with no cluster: kubectl cannot check a manifest without an API server (even its
client-side dry run asks the server for the schema), so this parses the files with PyYAML,
checks the fields the launcher relies on, then builds each pod's environment as Kubernetes or
Kubeflow's training operator would and asks the real launcher (--dry_run) what that pod would
do: every pod must see the same job, the node ranks must be 0..N-1, and node 0's address must
be the name the other pods can resolve.
"""
import os
import re
import subprocess
import sys

try:
    import yaml
except ImportError:
    sys.exit("FAIL: this test needs PyYAML (Debian's python3-yaml)")

SRC = os.path.join(os.environ["TEST_SRCDIR"], "braid")
LAUNCHER = os.path.join(SRC, "launcher/launcher")
EXAMPLES = os.path.join(SRC, "launcher/examples/kubernetes")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
fails = 0


def check(name, cond, detail=""):
    global fails
    if cond:
        print(f"ok   {name}")
    else:
        fails += 1
        print(f"FAIL {name} {detail}")


def load(name):
    with open(os.path.join(EXAMPLES, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def check_pod(tag, pod, want_container=None):
    """The parts of a pod spec the launcher depends on; returns (container, token path)."""
    containers = pod["containers"]
    check(f"{tag}: one container", len(containers) == 1)
    c = containers[0]
    if want_container:
        check(f"{tag}: container named {want_container}", c["name"] == want_container, c["name"])
    check(f"{tag}: container name is a DNS label", DNS_LABEL.match(c["name"]) is not None)
    check(f"{tag}: runs the launcher", c["command"][0].endswith("/launcher/launcher"), c["command"][0])
    for e in c.get("env", []):
        check(f"{tag}: env {e['name']} is a valid name with a value",
              ENV_NAME.match(e["name"]) is not None and isinstance(e.get("value"), str))
    for p in c.get("ports", []):
        check(f"{tag}: port {p['containerPort']} in range", 0 < p["containerPort"] < 65536)
    # The token file lies in a mounted Secret that holds that key.
    args = c["command"]
    token = [a.split("=", 1)[1] for a in args if a.startswith("--job_token_file=")]
    check(f"{tag}: --job_token_file given", len(token) == 1, args)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    found = False
    for m in c.get("volumeMounts", []):
        v = volumes.get(m["name"], {})
        if "secret" not in v or not token or not token[0].startswith(m["mountPath"] + "/"):
            continue
        key = token[0][len(m["mountPath"]) + 1:]
        items = v["secret"].get("items")
        found = items is None or any(i["path"] == key for i in items)
        check(f"{tag}: the token's Secret is mounted read-only, readable by its owner only",
              m.get("readOnly") is True and v["secret"].get("defaultMode") == 0o400)
    check(f"{tag}: {token[:1]} is a key of a mounted Secret", found)
    check(f"{tag}: no job token on the command line or in the environment",
          not any("BRAID_JOB_TOKEN" in a for a in args) and
          not any(e["name"] == "BRAID_JOB_TOKEN" for e in c.get("env", [])))
    return c


def dry_run(tag, command, env):
    """What the launcher in this pod would do: its --dry_run lines as a dict plus the workers."""
    full_env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                "KUBERNETES_SERVICE_PORT": "443"}
    full_env.update(env)
    r = subprocess.run([LAUNCHER, "--dry_run"] + command[1:], env=full_env, capture_output=True,
                       text=True, timeout=60)
    check(f"{tag}: launcher --dry_run exits 0", r.returncode == 0, r.stderr.strip())
    facts, workers = {}, []
    for line in r.stdout.splitlines():
        if line.startswith("worker "):
            workers.append(dict(kv.split("=") for kv in line.split()[1:]))
        elif not line.startswith("layout:"):
            facts.update(kv.split("=", 1) for kv in line.split())
    facts["layout"] = next((l for l in r.stdout.splitlines() if l.startswith("layout:")), "")
    return facts, workers


def check_job(tag, pods, nnodes, master):
    """Every pod agrees on the job; ranks cover 0..world-1 once."""
    worlds = {f.get("world_size") for f, _ in pods}
    check(f"{tag}: every pod sees one world size", len(worlds) == 1 and None not in worlds, worlds)
    check(f"{tag}: node ranks are 0..{nnodes - 1}",
          sorted(f.get("node_rank", "?") for f, _ in pods) == [str(i) for i in range(nnodes)])
    check(f"{tag}: every pod has {nnodes} nodes", all(f.get("nnodes") == str(nnodes) for f, _ in pods))
    ranks = sorted(int(w["rank"]) for _, ws in pods for w in ws)
    world = worlds.pop() if len(worlds) == 1 else None
    check(f"{tag}: ranks 0..{len(ranks) - 1} each once",
          world is not None and world.isdigit() and ranks == list(range(int(world))), ranks)
    check(f"{tag}: node 0 at {master}", all(f.get("master") == master for f, _ in pods),
          [f.get("master") for f, _ in pods])


# ---- Indexed Job + headless Service -------------------------------------------------------------
docs = load("indexed-job.yaml")
kinds = {(d["apiVersion"], d["kind"]): d for d in docs}
svc = kinds.get(("v1", "Service"))
job = kinds.get(("batch/v1", "Job"))
check("indexed: a v1 Service and a batch/v1 Job", svc is not None and job is not None)
spec, pod = job["spec"], job["spec"]["template"]["spec"]
name, svc_name = job["metadata"]["name"], svc["metadata"]["name"]
check("indexed: names are DNS labels", DNS_LABEL.match(name) and DNS_LABEL.match(svc_name))
check("indexed: completionMode Indexed", spec.get("completionMode") == "Indexed")
n = spec["completions"]
check("indexed: every pod at once (parallelism = completions)", spec.get("parallelism") == n)
check("indexed: the Service is headless", svc["spec"].get("clusterIP") == "None")
check("indexed: the Service publishes pods before readiness",
      svc["spec"].get("publishNotReadyAddresses") is True)
labels = job["spec"]["template"]["metadata"]["labels"]
check("indexed: the Service selects the Job's pods",
      all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()))
check("indexed: pods live under the Service's subdomain", pod.get("subdomain") == svc_name)
check("indexed: pods are not restarted in place", pod.get("restartPolicy") == "Never")
c = check_pod("indexed", pod)
ports = {p["containerPort"] for p in c.get("ports", [])}
results = []
for i in range(n):
    # Kubernetes names pod i's host <job>-<i> and sets JOB_COMPLETION_INDEX.
    env = {e["name"]: e["value"] for e in c.get("env", [])}
    env.update({"JOB_COMPLETION_INDEX": str(i), "HOSTNAME": f"{name}-{i}"})
    results.append(dry_run(f"indexed pod {i}", c["command"], env))
check_job("indexed", results, n, f"{name}-0.{svc_name}:{min(ports) if ports else '?'}")
store_port = results[0][0].get("master", ":").rsplit(":", 1)[1]
check("indexed: the store's port is the container's and the Service's",
      store_port in {str(p) for p in ports} and
      store_port in {str(p["port"]) for p in svc["spec"]["ports"]}, store_port)

# ---- Kubeflow PyTorchJob -------------------------------------------------------------------------
(pj,) = load("pytorchjob.yaml")
check("pytorchjob: kubeflow.org/v1 PyTorchJob",
      pj["apiVersion"] == "kubeflow.org/v1" and pj["kind"] == "PyTorchJob")
name = pj["metadata"]["name"]
replicas = pj["spec"]["pytorchReplicaSpecs"]
check("pytorchjob: one Master", replicas["Master"]["replicas"] == 1)
nproc = pj["spec"].get("nprocPerNode", "auto")
check("pytorchjob: nprocPerNode is a string", isinstance(nproc, str))
total = sum(r["replicas"] for r in replicas.values())
results = []
for rtype in ("Master", "Worker"):
    r = replicas[rtype]
    c = check_pod(f"pytorchjob {rtype}", r["template"]["spec"], want_container="pytorch")
    port = [p["containerPort"] for p in c["ports"] if p.get("name") == "pytorchjob-port"]
    check(f"pytorchjob {rtype}: a port named pytorchjob-port", len(port) == 1)
    for index in range(r["replicas"]):
        # The training operator's variables (pkg/controller.v1/pytorch, v1.7 and later).
        rank = index + (1 if rtype == "Worker" else 0)
        world = total * (int(nproc) if nproc.isdigit() else 1)
        env = {e["name"]: e["value"] for e in c.get("env", [])}
        env.update({"PYTHONUNBUFFERED": "0", "MASTER_ADDR": f"{name}-master-0",
                    "PET_MASTER_ADDR": f"{name}-master-0", "MASTER_PORT": str(port[0]),
                    "PET_MASTER_PORT": str(port[0]), "WORLD_SIZE": str(world), "RANK": str(rank),
                    "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(rank),
                    "PET_NNODES": str(total), "HOSTNAME": f"{name}-{rtype.lower()}-{index}"})
        results.append(dry_run(f"pytorchjob {rtype} {index}", c["command"], env))
check_job("pytorchjob", results, total, f"{name}-master-0:{port[0]}")
check("pytorchjob: the layout came from the operator's variables",
      all("PET_NNODES=" in f["layout"] and "PET_NODE_RANK=" in f["layout"] for f, _ in results),
      [f["layout"] for f, _ in results])

print("PASS" if fails == 0 else f"{fails} failure(s)")
sys.exit(1 if fails else 0)
