"""bench/chaos.py's faults, applied to the e2e's cluster with the e2e's own helpers (tests/support/node_faults.py):
a worker pod deleted, a worker frozen (`docker pause`), the kubelet stopped and started (../shared/node/cluster.sh),
the operator's leader pod killed, its TCP connections to the API server reset (`ss -K` in its pod's network
namespace: its watches and requests broken, the process alive), SeaweedFS's pod killed, the node's capacity (an extended resource) dropped under an
elastic run and returned, and a push flood from a run's own pod. The freeze and the kubelet need the node cluster
(SCALINGRUN_E2E_NODE_DIR); the connection reset, root on the node's host (docker, nsenter); elsewhere they are
skipped, saying so.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional

from bench.chaos_plan import CLUSTER_FAULTS, Applied, Fault
from tests.e2e.environment import S3_SERVICE, SYSTEM_NAMESPACE
from tests.support.e2e_runs import OPERATOR_PODS
from tests.support.node_faults import freeze, kill, kubelet, set_capacity

STORE_BACK_WITHIN_S = 600.0
LEASE = "scalingrun-operator"  # scalingrun_operator.config's lease_name, the chart's default
# A hostile pod's pushes for `seconds`: its own valid token at a kind the endpoint does not route, an oversized body
# (over scalingrun_api.status_push.MAX_BODY_BYTES), and a forged token at its heartbeat path; all must be refused
# without a healthy run's status or the operator's memory suffering. Run with the pod's python (trainer image).
FLOOD = r"""
import http.client, os, ssl, sys, threading, time, urllib.parse
d = os.environ.get("SCALINGRUN_STATUS_DIR", "/var/run/scalingrun.dev/status")
url = urllib.parse.urlsplit(open(f"{d}/url").read().strip()); path = os.environ["SCALINGRUN_STATUS_PATH"]
token = open(f"{d}/token").read().strip(); ctx = ssl.create_default_context(cafile=f"{d}/ca.crt")
end = time.monotonic() + float(sys.argv[1]); sent = {}
def post(kind, auth, body):
    c = http.client.HTTPSConnection(url.hostname, url.port or 443, timeout=5, context=ctx)
    try:
        c.request("POST", f"{path}/{kind}", body=body, headers={"Authorization": f"Bearer {auth}"})
        r = c.getresponse(); r.read(); return r.status
    finally:
        c.close()
def loop(kind, auth, body):
    while time.monotonic() < end:
        try: s = post(kind, auth, body)
        except Exception as e: s = type(e).__name__
        sent[s] = sent.get(s, 0) + 1
threads = [threading.Thread(target=loop, args=a) for a in (
    ("flood", token, b"{}"), ("flood", token, b"{}"), ("progress", token, b"x" * 70000),
    ("heartbeat", token[:-8] + "AAAAAAAA", b"{}"))]
[t.start() for t in threads]; [t.join() for t in threads]; print(sent)
"""


class Faults:
    """Applies a schedule's faults. `run_of(slot)` gives a slot's current run name and its last status; `note`
    logs a line."""

    def __init__(self, cluster: Any, run_of: Callable[[int], tuple[Optional[str], dict]], capacity_total: int,
                 seed: int, note: Callable[[str], None]):
        self.cluster, self.run_of, self.capacity_total, self.note = cluster, run_of, capacity_total, note
        self.rng = random.Random(seed ^ 0x5EED)
        self.node_dir = os.environ.get("SCALINGRUN_E2E_NODE_DIR", "")
        [self.node] = [n.metadata.name for n in cluster.core().list_node().items]

    def apply(self, fault: Fault) -> Applied:
        if fault.kind in CLUSTER_FAULTS:
            applied = Applied(fault, None, False, time.time())
            getattr(self, fault.kind)(fault, applied)
            return applied
        name, status = self.run_of(fault.target)
        training = (status.get("training") or {})
        applied = Applied(fault, name, False, time.time(), launcher_before=(training.get("heartbeat") or {}).get(
            "launcherUid"), epoch_before=training.get("epoch"))
        if name is None or status.get("phase") != "Training":
            applied.why_not = f"slot {fault.target}'s run not Training ({status.get('phase')})"
            return applied
        getattr(self, fault.kind)(fault, applied)
        return applied

    # --- run faults

    def workers(self, name: str) -> list[Any]:
        return sorted((p for p in self.cluster.run_pods(name)
                       if (p.metadata.labels or {}).get("training.kubeflow.org/job-role") == "worker"
                       and p.metadata.deletion_timestamp is None and p.status.phase == "Running"),
                      key=lambda p: p.metadata.name)

    def worker_deleted(self, fault: Fault, applied: Applied) -> None:
        workers = self.workers(applied.run)
        if not workers:
            applied.why_not = "no running worker"
            return
        pod = self.rng.choice(workers)
        self.cluster.core().delete_namespaced_pod(pod.metadata.name, self.cluster.namespace)
        applied.took, applied.notes = True, [pod.metadata.name]

    def worker_frozen(self, fault: Fault, applied: Applied) -> None:
        if not self.node_dir:
            applied.why_not = "not the node cluster: no docker to pause a container with"
            return
        workers = self.workers(applied.run)
        if not workers:
            applied.why_not = "no running worker"
            return
        pod = self.rng.choice(workers)
        ids = freeze([pod])
        applied.took, applied.notes = True, [pod.metadata.name]
        time.sleep(fault.hold)  # past the stall timeout: the operator has restarted the attempt by now
        kill(ids)  # what the node's reboot does to a hung process

    def push_flood(self, fault: Fault, applied: Applied) -> None:
        workers = self.workers(applied.run)
        if not workers:
            applied.why_not = "no running worker"
            return
        pod = workers[0].metadata.name
        done = subprocess.run([*self.cluster.kubectl, "exec", "-n", self.cluster.namespace, pod, "-c", "worker", "--",
                               "python", "-c", FLOOD, str(fault.hold)], capture_output=True, text=True,
                              timeout=fault.hold + 60)
        applied.took = done.returncode == 0
        applied.notes = [pod, (done.stdout.strip() or done.stderr.strip())[-300:]]
        applied.why_not = "" if applied.took else f"exec failed: {done.stderr.strip()[-200:]}"

    def capacity_drop(self, fault: Fault, applied: Applied) -> None:
        run = self.cluster.get_run(applied.run)
        spec = run["spec"]["workers"]
        extra = spec["replicas"] - spec.get("minReplicas", spec["replicas"])
        workers = self.workers(applied.run)
        if len(workers) < spec["replicas"]:
            applied.why_not = f"{len(workers)} of {spec['replicas']} workers running: already short"
            return
        set_capacity(self.cluster, self.node, self.capacity_total - extra)
        try:
            for pod in workers[-extra:]:
                self.cluster.core().delete_namespaced_pod(pod.metadata.name, self.cluster.namespace)
            applied.took, applied.counted = True, extra
            applied.notes = [p.metadata.name for p in workers[-extra:]]
            time.sleep(fault.hold)
        finally:
            set_capacity(self.cluster, self.node, self.capacity_total)

    # --- cluster faults

    def kubelet_restart(self, fault: Fault, applied: Applied) -> None:
        if not self.node_dir:
            applied.why_not = "not the node cluster: its kubelet cannot be stopped from here"
            return
        try:
            kubelet(Path(self.node_dir), "kubelet-stop")
            applied.took = True
            time.sleep(fault.hold)
        finally:
            try:
                kubelet(Path(self.node_dir), "kubelet-start")
            except AssertionError as exc:
                self.note(f"kubelet-start failed: {exc}")

    def leader_pod(self) -> Optional[str]:
        from kubernetes import client

        try:
            holder = client.CoordinationV1Api(self.cluster.api).read_namespaced_lease(
                LEASE, SYSTEM_NAMESPACE).spec.holder_identity or ""
        except client.ApiException:
            holder = ""
        pods = [p.metadata.name for p in self.cluster.core().list_namespaced_pod(
            SYSTEM_NAMESPACE, label_selector=OPERATOR_PODS).items if p.metadata.deletion_timestamp is None]
        leaders = [p for p in pods if holder.startswith(p)]
        self.holder = holder  # the lease's holderIdentity then, for a fault's notes
        return (leaders or pods or [None])[0]

    def operator_killed(self, fault: Fault, applied: Applied) -> None:
        pod = self.leader_pod()
        if pod is None:
            applied.why_not = "no operator pod"
            return
        self.cluster.core().delete_namespaced_pod(pod, SYSTEM_NAMESPACE, grace_period_seconds=0)
        applied.took, applied.notes = True, [pod]

    def watch_broken(self, fault: Fault, applied: Applied) -> None:
        """Resets every TCP connection of the leader's pod to the API server (the `kubernetes` Service's address and
        the endpoint's it is translated to), from the host, in the pod's network namespace: the kernel sends each a
        reset, as a load balancer or an API server restart would."""
        pod = self.leader_pod()
        if not self.node_dir or pod is None:
            applied.why_not = "not the node cluster: no docker and nsenter into the operator's pod" if pod else \
                "no operator pod"
            return
        ids = subprocess.run([DOCKER, "ps", "-q", "--filter", f"label=io.kubernetes.pod.name={pod}"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        if not ids:
            applied.why_not = f"no container of {pod}"
            return
        pid = subprocess.run([DOCKER, "inspect", "-f", "{{.State.Pid}}", ids[0]], capture_output=True, text=True,
                             timeout=30).stdout.strip()
        done = subprocess.run(["nsenter", "-t", pid, "-n", "ss", "-K", "-tn", *api_server_filter(self.cluster)],
                              capture_output=True, text=True, timeout=30)
        reset = [line for line in done.stdout.splitlines()[1:] if line.strip()]
        applied.took = done.returncode == 0 and bool(reset)
        applied.notes = [pod, f"{len(reset)} connections reset", f"lease holder {self.holder or 'none'}"]
        applied.why_not = "" if applied.took else f"ss -K: rc {done.returncode}, {len(reset)} reset, " \
            f"{done.stderr.strip()[-200:]}"

    def store_killed(self, fault: Fault, applied: Applied) -> None:
        """The store's pod killed; the outage is measured until its new pod is Ready (the invariants allow stalls
        for runs that trained into an outage longer than stallTimeout)."""
        pod = f"{S3_SERVICE}-0"  # tests/e2e/environment.py's StatefulSet
        core = self.cluster.core()
        old_uid = core.read_namespaced_pod(pod, self.cluster.namespace).metadata.uid
        core.delete_namespaced_pod(pod, self.cluster.namespace, grace_period_seconds=0)
        applied.took, applied.notes = True, [pod]
        deadline = time.time() + STORE_BACK_WITHIN_S
        while time.time() < deadline:
            time.sleep(2)
            with contextlib.suppress(Exception):  # not there yet, or the API server through another fault
                now = core.read_namespaced_pod(pod, self.cluster.namespace)
                ready = any(c.type == "Ready" and c.status == "True" for c in now.status.conditions or [])
                if now.metadata.uid != old_uid and ready:
                    applied.outage_s = round(time.time() - applied.at_wall, 1)
                    applied.notes.append(f"back in {applied.outage_s} s")
                    return
        applied.notes.append(f"not Ready within {STORE_BACK_WITHIN_S} s")


DOCKER = "/usr/bin/docker"  # the node cluster's (../shared/node/README.md)


def api_server_filter(cluster: Any) -> list[str]:
    """ss's filter for connections to the API server: the `kubernetes` Service's address and port, and its endpoints'
    (what kube-proxy translates it to; a client given the address directly uses those)."""
    core = cluster.core()
    service = core.read_namespaced_service("kubernetes", "default").spec
    targets = [(service.cluster_ip, port.port) for port in service.ports]
    for subset in core.read_namespaced_endpoints("kubernetes", "default").subsets or []:
        targets += [(address.ip, port.port) for address in subset.addresses or [] for port in subset.ports or []]
    return filter_text(targets)


def filter_text(targets: list[tuple[str, int]]) -> list[str]:
    """[(ip, port)] -> ss's filter expression, one token per word: ( dst IP and dport = PORT or ... )."""
    words = ["("]
    for i, (ip, port) in enumerate(targets):
        words += (["or"] if i else []) + ["(", "dst", ip, "and", "dport", "=", str(port), ")"]
    return words + [")"]


def operator_rss(cluster: Any) -> Optional[int]:
    """The leader's (or any operator pod's) processes' resident memory in bytes, read inside its container."""
    pods = cluster.core().list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=OPERATOR_PODS).items
    total = 0
    for pod in pods:
        if pod.status.phase != "Running":
            continue
        done = subprocess.run([*cluster.kubectl, "exec", "-n", SYSTEM_NAMESPACE, pod.metadata.name, "--", "python",
                               "-c",
                               "import glob\nprint(sum(int(l.split()[1]) for f in glob.glob('/proc/[0-9]*/status') "
                               "for l in open(f) if l.startswith('VmRSS')))"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode == 0 and done.stdout.strip().isdigit():
            total = max(total, int(done.stdout.strip()) * 1024)
    return total or None


def operator_memory_limit(cluster: Any) -> int:
    from kubernetes import client
    from kubernetes.utils import parse_quantity

    apps = client.AppsV1Api(cluster.api)
    [deployment] = apps.list_namespaced_deployment(SYSTEM_NAMESPACE, label_selector=OPERATOR_PODS).items
    container = deployment.spec.template.spec.containers[0]
    return int(parse_quantity(container.resources.limits["memory"]))
