"""`bench/operator_scale.py --pods`: the operator beside many pods, on a real kube-apiserver with no kubelet.

The script plays the kubelet and the MPI operator: it creates each run's launcher and worker pods on the API
server (with the labels the MPI operator gives them) and moves their phases, Pending -> Running, one worker
of each run OOMKilled, then Succeeded, beside unrelated pods in another namespace that it creates and moves
too. Two scenarios: one run of --big-workers workers, then --small-runs runs of --small-workers workers.

Per scenario: the operator's CPU seconds and peak RSS, API requests it made (the API server's counter minus
the script's own requests, counted client-side), reconciles (its scalingrun_reconciles_total where it has
one, else its namespaced pod LISTs: one per reconcile before this change), the largest run status, and the
lag from a pod change to the status that shows it (p50/p95 over runs): the last pod created -> every pod
recorded in status, a worker OOMKilled -> workerPodsLost counted. The figures are taken once the operator is
idle again (its backlog worked off: 5 s under 5 % of a core), at most SETTLE_AT_MOST seconds after the last pod
change. For the unrelated pods: how many pod watch
events the API server sent (apiserver_watch_events_total{kind="Pod"}: only the operator watches pods here).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional

from kubernetes import client, watch

from scalingrun_api import models
# Answers read off the connection, not made into client models: a kubelet spends no CPU on that, and the script's
# 16 threads doing it (~5 ms a pod) took CPU from the operator on the same cores.
from scalingrun_operator.cluster.k8s import released

POOL = 16
SETTLE_AT_MOST = 240.0  # seconds the operator gets to work off its backlog after the last pod change


class CountingApi:
    """The script's own API requests, counted, so that the operator's are the server's total minus these."""

    def __init__(self, api: client.ApiClient):
        self.count = 0
        self._lock = threading.Lock()
        call = api.call_api

        def counted(resource_path: str, *args: Any, **kwargs: Any) -> Any:
            # As the server counts: resources only, a watch when it ends (the script's end after the figures).
            watching = any(k == "watch" and v for k, v in kwargs.get("query_params") or [])
            if resource_path.startswith("/api") and not watching:
                with self._lock:
                    self.count += 1
            return call(resource_path, *args, **kwargs)

        api.call_api = counted


def server_metrics(api: client.ApiClient) -> str:
    return api.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False)[0].data.decode()


def metric_lines(text: str, name: str) -> Iterator[tuple[str, float]]:
    """(labels, value) of each sample of metric `name` in a /metrics text."""
    for match in re.finditer(rf"^{name}\{{(?P<labels>[^}}]*)\}} (?P<value>\S+)$", text, re.M):
        yield match["labels"], float(match["value"])


def metric_sum(text: str, name: str, where: Callable[[str], bool] = lambda labels: True) -> float:
    return sum((value for labels, value in metric_lines(text, name) if where(labels)), 0.0)


def requests_total(text: str) -> float:
    return metric_sum(text, "apiserver_request_total", lambda labels: not re.search(r'(^|,)resource=""', labels))


def requests_by_resource(text: str) -> dict[str, float]:
    """apiserver_request_total by "resource verb", every client's."""
    counts: dict[str, float] = {}
    for text_labels, value in metric_lines(text, "apiserver_request_total"):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', text_labels))
        if labels.get("resource"):
            key = f"{labels['resource']} {labels.get('verb', '')}"
            counts[key] = counts.get(key, 0.0) + value
    return counts


def _most(end: dict[str, float], start: dict[str, float], count: int = 12) -> dict[str, int]:
    """The `count` largest differences, the bench's own requests included."""
    grown = {k: int(v - start.get(k, 0.0)) for k, v in end.items() if v > start.get(k, 0.0)}
    return dict(sorted(grown.items(), key=lambda kv: -kv[1])[:count])


def pod_lists(text: str) -> float:
    """Namespaced LISTs of pods: the reconcile's (kopf lists cluster-wide)."""
    return metric_sum(text, "apiserver_request_total",
                      lambda labels: re.search(r'(^|,)resource="pods"', labels) and 'verb="LIST"' in labels
                      and 'scope="namespace"' in labels)


def pod_watch_events(text: str) -> float:
    return metric_sum(text, "apiserver_watch_events_total", lambda labels: 'kind="Pod"' in labels)


def operator_reconciles(port: int) -> Optional[float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    if "scalingrun_reconciles_total" not in text:
        return None
    return metric_sum(text, "scalingrun_reconciles_total", lambda labels: 'kind="run"' in labels)


class StatusWatch:
    """Watches the runs of a namespace; `expect(run, predicate)` notes when the run's status first satisfies it."""

    def __init__(self, custom: client.CustomObjectsApi, namespace: str):
        self.custom, self.namespace = custom, namespace
        self.largest = 0
        self._lock = threading.Condition()
        self._expected: dict[str, tuple[Callable[[dict], bool], float]] = {}
        self.lags: dict[str, float] = {}
        self._last: dict[str, dict] = {}
        self._watch = watch.Watch()
        self._stopped = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        # A watch that ends (a dropped connection on a loaded machine) starts again, from every run as it is: one
        # that ended silently left the script waiting out its timeout with every status already there.
        while not self._stopped:
            try:
                for event in self._watch.stream(self.custom.list_namespaced_custom_object, models.GROUP,
                                                models.VERSION, self.namespace, models.PLURAL, timeout_seconds=3600):
                    obj = event["object"]
                    status = obj.get("status") or {}
                    size = len(json.dumps(status, separators=(",", ":")).encode())
                    with self._lock:
                        self.largest = max(self.largest, size)
                        name = obj["metadata"]["name"]
                        self._last[name] = status
                        self._check(name, status)
            except Exception:  # the API server stops under the watch at the end
                time.sleep(0.5)
            self._watch = watch.Watch()

    def _check(self, name: str, status: dict) -> None:
        expected = self._expected.get(name)
        if expected and expected[0](status):
            self.lags[name] = time.monotonic() - expected[1]
            del self._expected[name]
            self._lock.notify_all()

    def expect(self, name: str, predicate: Callable[[dict], bool], since: float) -> None:
        with self._lock:
            self.lags.pop(name, None)
            self._expected[name] = (predicate, since)
            if name in self._last:
                self._check(name, self._last[name])

    def wait(self, names: list[str], timeout: float) -> list[float]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while any(n not in self.lags for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.lags]
                    raise TimeoutError(f"{len(missing)} runs' status did not show it within {timeout:.0f} s: "
                                       f"{missing[:3]}")
                self._lock.wait(left)
            return [self.lags[n] for n in names]

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def recorded_pods(status: dict) -> int:
    training = status.get("training") or {}
    summary = training.get("podSummary")
    return int(summary["total"]) if summary else len(training.get("pods") or [])


def workers_lost(status: dict) -> int:
    return int((status.get("training") or {}).get("workerPodsLost") or 0)


def training_pod(mpijob: dict, role: str, name: str) -> dict:
    replica = mpijob["spec"]["mpiReplicaSpecs"]["Launcher" if role == "launcher" else "Worker"]
    template = replica["template"]["spec"]["containers"][0]
    labels = {**replica["template"]["metadata"]["labels"], "training.kubeflow.org/job-name": mpijob["metadata"]["name"],
              "training.kubeflow.org/job-role": role}
    # A worker is controlled by its MPIJob, as mpi-operator makes it (its pushes are taken by that owner chain); the
    # launcher's controller, the launcher Job, is not made here.
    owner = {"apiVersion": mpijob["apiVersion"], "kind": "MPIJob", "name": mpijob["metadata"]["name"],
             "uid": mpijob["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    return {"metadata": {"name": name, "labels": labels, "ownerReferences": [owner] if role == "worker" else []},
            "spec": {"automountServiceAccountToken": False, "containers": [
                {"name": template["name"], "image": template["image"], "resources": template.get("resources") or {}}]}}


def container_status(name: str, state: dict, restarts: int = 0, last: Optional[dict] = None) -> dict:
    status = {"name": name, "ready": "running" in state, "restartCount": restarts, "image": "", "imageID": "",
              "state": state}
    if last:
        status["lastState"] = last
    return status


def set_phase(core: client.CoreV1Api, namespace: str, name: str, container: str, phase: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    state = {"Running": {"running": {"startedAt": now}},
             "Succeeded": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}},
             "OOMKilled": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": now}}}[phase]
    released(core.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": "Failed" if phase == "OOMKilled" else phase,
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
        "containerStatuses": [container_status(container, state)]}}, _preload_content=False))


def default_service_account(core: client.CoreV1Api, namespace: str) -> None:
    """What the controller manager (not running here) would make: pods are admitted only with it."""
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})


def create_unrelated(core: client.CoreV1Api, namespace: str, count: int) -> None:
    core.create_namespace({"metadata": {"name": namespace}})
    default_service_account(core, namespace)

    def one(index: int) -> None:
        name = f"other-{index}"
        released(core.create_namespaced_pod(namespace, {
            "metadata": {"name": name, "labels": {"app": "someone-else", "tier": f"t{index % 7}"}},
            "spec": {"automountServiceAccountToken": False,
                     "containers": [{"name": "app", "image": "registry.invalid/app:1"}]}}, _preload_content=False))
        set_phase(core, namespace, name, "app", "Running")

    with ThreadPoolExecutor(POOL) as pool:
        list(pool.map(one, range(count)))


class Scenario:
    """Runs of `workers` workers each, trained by the script from creation to their pods Succeeded."""

    def __init__(self, bench: Any, operator: Any, metrics_port: int, counting: CountingApi, label: str,
                 runs: int, workers: int, drive: Callable[..., None], create_all: Callable[..., None]):
        self.bench, self.operator, self.port, self.counting = bench, operator, metrics_port, counting
        self.label, self.runs, self.workers = label, runs, workers
        self.drive, self.create_all = drive, create_all

    def _snapshot(self) -> dict[str, Any]:
        text = server_metrics(self.bench.api)
        return {"cpu": self.operator.cpu_seconds(), "requests": requests_total(text), "mine": self.counting.count,
                "pod_lists": pod_lists(text), "reconciles": operator_reconciles(self.port), "wall": time.monotonic(),
                "by_resource": requests_by_resource(text)}

    def run(self) -> dict[str, Any]:
        bench, core = self.bench, self.bench.core
        cluster = bench.namespace(f"bench-pods-{self.label}")
        default_service_account(core, cluster.ns)
        names = [f"{self.label}-{i}" for i in range(self.runs)]
        statuses = StatusWatch(bench.custom, cluster.ns)
        self.operator.reset_peak()
        start = self._snapshot()
        self.create_all(bench, cluster, names)
        deadline = time.monotonic() + 300
        while {f"{n}-preprocess" for n in names} - {j.metadata.name for j in bench.batch.list_namespaced_job(
                cluster.ns).items}:
            self.operator.check()
            if time.monotonic() > deadline:
                raise TimeoutError("not every run got its Job within 300 s")
            time.sleep(1)
        self.drive(bench, cluster, names, self.operator)
        mpijobs = {n: cluster.mpijob(f"{n}-train") for n in names}
        pods = {n: [("launcher", f"{n}-train-launcher-abcde")] +
                [("worker", f"{n}-train-worker-{i}") for i in range(self.workers)] for n in names}
        containers = {"launcher": mpijobs[names[0]]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"][
            "containers"][0]["name"], "worker": mpijobs[names[0]]["spec"]["mpiReplicaSpecs"]["Worker"]["template"][
            "spec"]["containers"][0]["name"]}
        pods_phase = self._snapshot()
        last_change: dict[str, float] = {}

        def create(item: tuple[str, str, str]) -> None:
            run, role, name = item
            released(core.create_namespaced_pod(cluster.ns, training_pod(mpijobs[run], role, name),
                                              _preload_content=False))
            last_change[run] = time.monotonic()

        work = [(run, role, name) for run in names for role, name in pods[run]]
        with ThreadPoolExecutor(POOL) as pool:
            list(pool.map(create, work))
        for run in names:
            statuses.expect(run, lambda s: recorded_pods(s) >= self.workers + 1, last_change[run])
        created_lags = statuses.wait(names, 600)

        def move(phase: str) -> Callable[[tuple[str, str, str]], None]:
            def one(item: tuple[str, str, str]) -> None:
                run, role, name = item
                set_phase(core, cluster.ns, name, containers[role], phase)
                last_change[run] = time.monotonic()
            return one

        with ThreadPoolExecutor(POOL) as pool:
            list(pool.map(move("Running"), work))
        failing = [(run, "worker", f"{run}-train-worker-0") for run in names]
        with ThreadPoolExecutor(POOL) as pool:
            list(pool.map(move("OOMKilled"), failing))
        for run in names:
            statuses.expect(run, lambda s: workers_lost(s) >= 1, last_change[run])
        failed_lags = statuses.wait(names, 600)
        with ThreadPoolExecutor(POOL) as pool:
            list(pool.map(move("Succeeded"), [w for w in work if w not in failing]))
        last = max(last_change.values())
        idle = self._settle()
        end = self._snapshot()
        statuses.stop()
        lags = created_lags + failed_lags
        pod_seconds = end["wall"] - pods_phase["wall"]
        reconciles = (end["reconciles"] - start["reconciles"] if end["reconciles"] is not None
                      and start["reconciles"] is not None else None)
        pod_reconciles = (end["reconciles"] - pods_phase["reconciles"] if reconciles is not None
                          else end["pod_lists"] - pods_phase["pod_lists"])
        return {
            "label": self.label, "runs": self.runs, "workers": self.workers,
            "cpu_s": end["cpu"] - start["cpu"], "peak_rss_mib": self.operator.peak_rss,
            "api_requests": (end["requests"] - start["requests"]) - (end["mine"] - start["mine"]),
            "reconciles": reconciles, "pod_lists": end["pod_lists"] - start["pod_lists"],
            "requests_by_resource": _most(end["by_resource"], start["by_resource"]),
            "pod_phase_reconciles_per_run_s": pod_reconciles / self.runs / pod_seconds, "pod_phase_s": pod_seconds,
            "largest_status_kib": statuses.largest / 1024,
            "lag_p50_s": percentile(lags, 0.5), "lag_p95_s": percentile(lags, 0.95),
            "created_lag_p95_s": percentile(created_lags, 0.95), "failed_lag_p95_s": percentile(failed_lags, 0.95),
            "idle_after_s": (idle - last) if idle is not None else None,
        }

    def _settle(self, window: float = 5.0, most: float = SETTLE_AT_MOST) -> Optional[float]:
        """Waits until the operator has worked off what the pods' events left it (a window of 5 s under 5 % of a
        core); returns when that window began, or None when it was still busy after `most` seconds."""
        deadline = time.monotonic() + most
        while time.monotonic() < deadline:
            began, cpu = time.monotonic(), self.operator.cpu_seconds()
            time.sleep(window)
            if (self.operator.cpu_seconds() - cpu) / window < 0.05:
                return began
        return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def calibrate(bench: Any, count: int = 20) -> float:
    """Pod watch events the API server sends per unrelated pod (created, set Running) with no operator running: its
    own watchers' share (kube-apiserver 1.20 keeps one pod watch of its own), subtracted from the figure later."""
    before = pod_watch_events(server_metrics(bench.api))
    create_unrelated(bench.core, "bench-calibration", count)
    time.sleep(3)
    return (pod_watch_events(server_metrics(bench.api)) - before) / count


def measure_unrelated(bench: Any, operator: Any, count: int, per_pod_without: float) -> dict[str, Any]:
    before_text, cpu, rss = server_metrics(bench.api), operator.cpu_seconds(), operator.rss_mib()
    operator.reset_peak()
    started = time.monotonic()
    create_unrelated(bench.core, "bench-someone-else", count)
    time.sleep(5)  # the last events delivered
    after_text = server_metrics(bench.api)
    return {"unrelated_pods": count, "unrelated_s": time.monotonic() - started,
            "unrelated_watch_events": pod_watch_events(after_text) - pod_watch_events(before_text)
            - per_pod_without * count, "server_events_per_pod": per_pod_without,
            "unrelated_cpu_s": operator.cpu_seconds() - cpu, "unrelated_peak_rss_mib": operator.peak_rss,
            "rss_before_mib": rss}


def print_pods(unrelated: dict[str, Any], scenarios: list[dict[str, Any]]) -> None:
    print(f"{unrelated['unrelated_pods']} unrelated pods created and set Running in {unrelated['unrelated_s']:.0f} s: "
          f"{unrelated['unrelated_watch_events']:.0f} pod watch events sent to the operator (the API server's own "
          f"{unrelated['server_events_per_pod']:.1f} a pod, measured before it started, subtracted), its CPU "
          f"{unrelated['unrelated_cpu_s']:.1f} s, peak RSS {unrelated['unrelated_peak_rss_mib']:.0f} MiB "
          f"({unrelated['rss_before_mib']:.0f} MiB before)")
    print()
    print("| measure | " + " | ".join(f"{s['runs']} run(s) x {s['workers']} workers" for s in scenarios) + " |")
    print("|---|" + "---|" * len(scenarios))
    rows = (("operator CPU", "cpu_s", "{:.1f} s"), ("peak RSS", "peak_rss_mib", "{:.0f} MiB"),
            ("API requests by the operator", "api_requests", "{:.0f}"),
            ("reconciles (operator metric)", "reconciles", "{:.0f}"),
            ("pod LISTs (namespaced)", "pod_lists", "{:.0f}"),
            ("reconciles per run per second, pod phase", "pod_phase_reconciles_per_run_s", "{:.2f}"),
            ("largest status", "largest_status_kib", "{:.1f} KiB"),
            ("lag pod change -> status, p50", "lag_p50_s", "{:.2f} s"),
            ("lag pod change -> status, p95", "lag_p95_s", "{:.2f} s"),
            ("operator idle after the last pod change", "idle_after_s", "{:.1f} s"))
    for label, key, fmt in rows:
        cells = [fmt.format(s[key]) if s[key] is not None else
                 (f"busy after {SETTLE_AT_MOST:.0f} s" if key == "idle_after_s" else "n/a") for s in scenarios]
        print(f"| {label} | " + " | ".join(cells) + " |")
