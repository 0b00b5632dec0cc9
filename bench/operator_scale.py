"""The operator's latency, scale and cost at rest, on a real kube-apiserver and a real S3 server.

Starts its own etcd + kube-apiserver 1.20 (KUBEBUILDER_ASSETS, as the tests do; no controller manager, so
only this script and the operator talk to it), SeaweedFS, and the operator as in its pod (`scalingrun
operator`, production settings, watching every namespace). Nothing plays the kubelet or the
mpi-operator: the script writes what they would (Job and MPIJob status, the manifest, progress.json).

Measures, each against a baseline taken in the same run:
- create -> Job and Job done -> MPIJob latency, p50/p95 over --runs runs, one at a time; the baseline is
  the same watch seeing a ConfigMap the script creates itself (the API server's and the watch's floor);
- --concurrent runs created at once: time until every one has its Job, peak RSS;
- those runs all in Training with nothing changing: API requests per minute caused by the operator
  (the API server's request counter, minus the rate measured before the operator started) and its CPU;
- RSS after each of --cycles cycles of --cycle-runs runs (created, trained to Training, deleted);
- the chart's default topology too (--topology both, the default, or deployed): the standalone operator
  stopped, two replicas started as the chart starts them (`--lease`, the Lease in their namespace, the
  chart's lease timings, the kubelet's probes), one leading, the other a standby; with the same runs in
  Training: API requests per minute (the Lease's renewals and the standby's retries included) and the
  leader's CPU.
Both topologies also count the operator's S3 requests per minute at rest: the runs' storage endpoint is a
counting proxy in front of SeaweedFS (the script's own writes go to SeaweedFS directly).

With --pods, the pods mode instead (bench/pod_scale.py): a 1,024-worker run and 300 runs of 4 workers whose
pods the script creates and moves, beside 10,000 unrelated pods.
With --push, the push path instead (bench/push_scale.py): the same runs report a new epoch every --interval s by
pushing to the status endpoint, and, as the baseline in the same run, by writing progress.json that the operator
polls; then the pushes again beside the attackers of bench/push_attackers.py.

Run: KUBEBUILDER_ASSETS=... .venv/bin/python bench/operator_scale.py [--runs 100] [--concurrent 300]
     [--topology standalone|deployed|both] [--only-rest: skip the latency and RSS-cycle measurements]
     [--pods [--unrelated 10000] [--big-workers 1024] [--small-runs 300] [--small-workers 4]]
     [--push [--big-workers 1024] [--small-runs 300] [--small-workers 4] [--interval 10] [--report-seconds 60]
             [--pushers 4] [--hostile-rate 1000] [--no-hostile] [--no-baseline]]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config, watch  # noqa: E402

from scalingrun_api import models  # noqa: E402
from scalingrun_operator.schema.crd import build_crd  # noqa: E402
from scalingrun_operator.local.s3server import S3Server  # noqa: E402
from tests.support.apiserver import api_server, free_port, install_crd  # noqa: E402
from tests.support.operator import (  # noqa: E402
    BUCKET, SECRET, Bucket, Cluster, manifest_for, new_run, progress, progress_uri,
)
from tests.support.flaky_s3 import FlakyS3  # noqa: E402  (fail=0: a counting proxy)

TARGETS = {"p50_ms": 100.0, "p95_ms": 250.0, "all_children_s": 15.0, "peak_rss_mib": 200.0,
           "requests_per_min": 300.0, "cpu_millicores": 25.0, "rss_drift": 0.10}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- the operator process -------------------------------------------------------------------------


class OperatorProcess:
    """One operator process: standalone by default; with a Lease, as the chart starts each replica."""

    def __init__(self, kubeconfig: str, log_path: Path, peers: Optional[list[str]] = None,
                 env_extra: Optional[dict[str, str]] = None, metrics_port: int = 0):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SCALINGRUN_"))}
        # The bench's store is on 127.0.0.1, which an operator refuses by default (schema/endpoints.py).
        env.update(KUBECONFIG=kubeconfig, PYTHONUNBUFFERED="1", SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT="true")
        if "SCALINGRUN_STATUS_PORT_NUMBER" not in (env_extra or {}):
            env["SCALINGRUN_PULL_DOCUMENTS"] = "true"  # this bench's runs write progress to their store
        env.update(env_extra or {})
        self.process = subprocess.Popen(
            [sys.executable, "-m", "scalingrun_operator.cli", "operator", "--all-namespaces",
             *(peers or ["--standalone", "--liveness", ""]), "--log-format", "plain", "--metrics-port", str(metrics_port)],
            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.log_path = log_path
        self.peak_rss = 0
        self._sampling = True
        threading.Thread(target=self._sample, daemon=True).start()

    def _status(self) -> dict[str, str]:
        text = Path(f"/proc/{self.process.pid}/status").read_text()
        return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)

    def rss_mib(self) -> float:
        return int(self._status()["VmRSS"].split()[0]) / 1024

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime

    def _sample(self) -> None:
        while self._sampling and self.process.poll() is None:
            with contextlib.suppress(OSError, KeyError):
                self.peak_rss = max(self.peak_rss, self.rss_mib())
            time.sleep(0.1)

    def reset_peak(self) -> None:
        self.peak_rss = self.rss_mib()

    def check(self) -> None:
        if self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the operator exited with {self.process.returncode}:\n{tail}")

    def stop(self) -> None:
        self._sampling = False
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


# --- watching children appear ---------------------------------------------------------------------


class Arrivals:
    """When each object of one kind was first seen by a watch, by name (monotonic seconds)."""

    def __init__(self, list_fn: Callable[..., Any], *args: Any):
        self.seen: dict[str, float] = {}
        self.condition = threading.Condition()
        self._watch = watch.Watch()
        threading.Thread(target=self._run, args=(list_fn, args), daemon=True).start()

    def _run(self, list_fn: Callable[..., Any], args: tuple) -> None:
        with contextlib.suppress(Exception):  # the API server stops under a watch at the end
            self._stream(list_fn, args)

    def _stream(self, list_fn: Callable[..., Any], args: tuple) -> None:
        for event in self._watch.stream(list_fn, *args):
            obj = event["object"]
            name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
            with self.condition:
                self.seen.setdefault(name, time.monotonic())
                self.condition.notify_all()

    def wait(self, names: list[str], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        with self.condition:
            while not all(n in self.seen for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.seen]
                    raise TimeoutError(f"{len(missing)} of {len(names)} not seen within {timeout:.0f} s: {missing[:5]}")
                self.condition.wait(left)
            return max(self.seen[n] for n in names)

    def stop(self) -> None:
        self._watch.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# --- the API server's own request counter ---------------------------------------------------------

_REQUEST_LINE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def resource_requests(api: client.ApiClient) -> float:
    """Requests on resources the API server has answered so far (its /metrics; watches count on close)."""
    text = api.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False)[0].data.decode()
    total = 0.0
    for line in text.splitlines():
        match = _REQUEST_LINE.match(line)
        if match and not re.search(r'(^|,)resource=""', match["labels"]):
            total += float(match["value"])
    return total


def requests_per_minute(api: client.ApiClient, seconds: float) -> float:
    before = resource_requests(api)
    time.sleep(seconds)
    return (resource_requests(api) - before) * 60 / seconds


# --- driving runs ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, api: client.ApiClient, s3: S3Server, bucket: Bucket, storage: FlakyS3):
        self.api, self.s3, self.bucket, self.storage = api, s3, bucket, storage  # storage: the runs' endpoint
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def namespace(self, name: str) -> Cluster:
        self.core.create_namespace({"metadata": {"name": name}})
        self.core.create_namespaced_secret(name, {"metadata": {"name": SECRET}, "stringData": {
            "AWS_ACCESS_KEY_ID": self.s3.access_key, "AWS_SECRET_ACCESS_KEY": self.s3.secret_key}})
        return Cluster(self.api, name)

    def job_name(self, cluster: Cluster, run: str) -> str:
        return f"{run}-preprocess"

    def finish_preprocessing(self, cluster: Cluster, run: str) -> None:
        """What the preprocessing pods would leave: the manifest, then a complete Job."""
        admitted = cluster.run(run)
        self.bucket.put_json(f"{admitted['spec']['dataset']['output']}/_manifest.json", manifest_for(admitted))
        cluster.complete_job(self.job_name(cluster, run), succeeded=2)

    def start_training(self, cluster: Cluster, run: str, epoch: int = 1) -> None:
        cluster.set_mpijob_condition(f"{run}-train", "Running", "MPIJobRunning", "running")
        self.bucket.put_json(progress_uri(cluster.run(run)), progress("running", epoch))


def measure_latency(bench: Bench, operator: OperatorProcess, runs: int) -> dict[str, Any]:
    cluster = bench.namespace("bench-latency")
    jobs = Arrivals(bench.batch.list_namespaced_job, cluster.ns)
    mpijobs = Arrivals(bench.custom.list_namespaced_custom_object, "kubeflow.org", "v2beta1", cluster.ns, "mpijobs")
    maps = Arrivals(bench.core.list_namespaced_config_map, cluster.ns)
    floor, to_job, to_mpijob = [], [], []
    for index in range(runs):
        operator.check()
        name = f"floor-{index}"
        start = time.monotonic()
        cluster.core.create_namespaced_config_map(cluster.ns, {"metadata": {"name": name}})
        floor.append(maps.wait([name], 30) - start)

        run = f"lat-{index}"
        start = time.monotonic()
        cluster.create_run(new_run(cluster.ns, run, bench.storage))
        to_job.append(jobs.wait([bench.job_name(cluster, run)], 60) - start)
        bench.finish_preprocessing(cluster, run)
        start = time.monotonic()
        to_mpijob.append(mpijobs.wait([f"{run}-train"], 60) - start)
    for arrivals in (jobs, mpijobs, maps):
        arrivals.stop()
    ms = lambda values, q: 1000 * percentile(values, q)  # noqa: E731
    return {"floor_p50_ms": ms(floor, 0.5), "floor_p95_ms": ms(floor, 0.95),
            "create_to_job_p50_ms": ms(to_job, 0.5), "create_to_job_p95_ms": ms(to_job, 0.95),
            "job_done_to_mpijob_p50_ms": ms(to_mpijob, 0.5), "job_done_to_mpijob_p95_ms": ms(to_mpijob, 0.95)}


def create_all(bench: Bench, cluster: Cluster, names: list[str]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: cluster.create_run(new_run(cluster.ns, n, bench.storage)), names))


def drive_to_training(bench: Bench, cluster: Cluster, names: list[str], operator: OperatorProcess) -> None:
    mpijobs = Arrivals(bench.custom.list_namespaced_custom_object, "kubeflow.org", "v2beta1", cluster.ns, "mpijobs")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: bench.finish_preprocessing(cluster, n), names))
    mpijobs.wait([f"{n}-train" for n in names], 300)
    mpijobs.stop()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: bench.start_training(cluster, n), names))
    deadline = time.monotonic() + 300
    while True:
        operator.check()
        items = bench.custom.list_namespaced_custom_object(models.GROUP, models.VERSION, cluster.ns,
                                                           models.PLURAL)["items"]
        training = [i for i in items if (i.get("status") or {}).get("phase") == "Training"
                    and (i["status"].get("training") or {}).get("epoch") == 1]
        if len(training) >= len(names):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(training)} of {len(names)} runs reached Training with epoch 1")
        time.sleep(2)


class DeployedReplicas:
    """The chart's default: two replicas electing a leader with a Lease named after the release in its
    namespace (holder = pod name), the chart's lease timings, and the kubelet's liveness (every 20 s) and
    readiness (every 10 s) probes on each replica's health endpoint."""

    RELEASE, NAMESPACE = "scalingrun", "scalingrun-system"
    LEASE_TIMINGS = {"SCALINGRUN_LEASE_DURATION_SECONDS": "15", "SCALINGRUN_LEASE_RENEW_DEADLINE_SECONDS": "10",
                     "SCALINGRUN_LEASE_RENEW_SECONDS": "5"}  # charts/scalingrun/values.yaml

    def __init__(self, bench: "Bench", kubeconfig: str, folder: Path):
        import yaml

        chart = yaml.safe_load((ROOT / "charts/scalingrun/values.yaml").read_text())
        timings = chart["leaderElection"]
        assert [self.LEASE_TIMINGS[k] for k in sorted(self.LEASE_TIMINGS)] == [
            str(timings[k]) for k in ("leaseDurationSeconds", "renewDeadlineSeconds", "renewSeconds")], timings
        self.replicas = chart["replicaCount"]
        bench.core.create_namespace({"metadata": {"name": self.NAMESPACE}})
        self.coordination = client.CoordinationV1Api(bench.api)
        self.ports = [free_port() for _ in range(self.replicas)]
        self.operators = [
            OperatorProcess(kubeconfig, folder / f"replica-{i}.log",
                            peers=[f"--lease={self.RELEASE}", f"--liveness=http://127.0.0.1:{port}/healthz"],
                            env_extra={"SCALINGRUN_LEASE_NAMESPACE": self.NAMESPACE,
                                       "SCALINGRUN_LEASE_HOLDER": f"{self.RELEASE}-replica-{i}", **self.LEASE_TIMINGS})
            for i, port in enumerate(self.ports)]
        self._probing = True
        threading.Thread(target=self._probe, daemon=True).start()

    def _probe(self) -> None:
        import urllib.request

        tick = 0
        while self._probing:
            for port in self.ports:
                for _ in range(2 if tick % 2 == 0 else 1):  # readiness every 10 s, liveness every 20 s
                    with contextlib.suppress(OSError):
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
            tick += 1
            time.sleep(10)

    def leader(self, timeout: float = 60) -> OperatorProcess:
        """The replica holding the Lease, once one does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for operator in self.operators:
                operator.check()
            with contextlib.suppress(client.ApiException):
                holder = self.coordination.read_namespaced_lease(self.RELEASE, self.NAMESPACE).spec.holder_identity
                for i, operator in enumerate(self.operators):
                    if holder and holder.startswith(f"{self.RELEASE}-replica-{i}"):
                        return operator
            time.sleep(1)
        raise TimeoutError(f"no replica took the Lease {self.NAMESPACE}/{self.RELEASE} within {timeout:.0f} s")

    def stop(self) -> None:
        self._probing = False
        for operator in self.operators:
            operator.stop()


def measure_rest(bench: Bench, operator: OperatorProcess, rest_seconds: float, baseline_rpm: float) -> dict[str, Any]:
    """API and S3 requests per minute, and the acting operator's CPU, with nothing changing."""
    cpu_before, wall_before = operator.cpu_seconds(), time.monotonic()
    s3_before = len(bench.storage.requests)
    rpm = requests_per_minute(bench.api, rest_seconds)
    elapsed = time.monotonic() - wall_before
    cpu = (operator.cpu_seconds() - cpu_before) / elapsed
    return {"rest_requests_per_min": rpm - baseline_rpm, "baseline_requests_per_min": baseline_rpm,
            "rest_s3_requests_per_min": (len(bench.storage.requests) - s3_before) * 60 / elapsed,
            "rest_cpu_millicores": 1000 * cpu, "rest_seconds": rest_seconds}


def measure_deployed(bench: Bench, kubeconfig: str, folder: Path, count: int, rest_seconds: float,
                     baseline_rpm: float, settle_seconds: float) -> dict[str, Any]:
    """The same runs at rest under the chart's two replicas (the standalone operator stopped before)."""
    replicas = DeployedReplicas(bench, kubeconfig, folder)
    try:
        started = time.monotonic()
        leader = replicas.leader()
        took = time.monotonic() - started
        # kopf resumes every run once at start: not rest. Settled: a 10 s window of the leader below 50 m CPU.
        settled = time.monotonic() + settle_seconds
        while time.monotonic() < settled:
            before = leader.cpu_seconds()
            time.sleep(10)
            if (leader.cpu_seconds() - before) / 10 < 0.05:
                break
        print(f"  a replica held the Lease after {took:.1f} s; runs resumed after {time.monotonic() - started:.0f} s",
              flush=True)
        for operator in replicas.operators:
            operator.check()
        standby = next(o for o in replicas.operators if o is not leader)
        standby_before, wall_before = standby.cpu_seconds(), time.monotonic()
        rest = measure_rest(bench, leader, rest_seconds, baseline_rpm)
        rest["standby_cpu_millicores"] = 1000 * (standby.cpu_seconds() - standby_before) / (
            time.monotonic() - wall_before)
        return {**rest, "runs": count, "replicas": replicas.replicas, "lease_taken_s": took}
    finally:
        replicas.stop()


def measure_scale(bench: Bench, operator: OperatorProcess, count: int, rest_seconds: float,
                  baseline_rpm: float) -> dict[str, Any]:
    cluster = bench.namespace("bench-scale")
    names = [f"scale-{i}" for i in range(count)]
    jobs = Arrivals(bench.batch.list_namespaced_job, cluster.ns)
    operator.reset_peak()
    start = time.monotonic()
    create_all(bench, cluster, names)
    created = time.monotonic() - start
    all_children = jobs.wait([bench.job_name(cluster, n) for n in names], 300) - start
    jobs.stop()
    peak_creating = operator.peak_rss
    drive_to_training(bench, cluster, names, operator)
    time.sleep(20)  # let the last status patches and Events settle
    return {"runs": count, "create_calls_s": created, "all_children_s": all_children,
            "peak_rss_mib": max(peak_creating, operator.peak_rss),
            **measure_rest(bench, operator, rest_seconds, baseline_rpm)}


def measure_drift(bench: Bench, operator: OperatorProcess, cycles: int, per_cycle: int) -> dict[str, Any]:
    rss = []
    for cycle in range(cycles):
        cluster = bench.namespace(f"bench-cycle-{cycle}")
        names = [f"cycle-{i}" for i in range(per_cycle)]
        create_all(bench, cluster, names)
        Arrivals(bench.batch.list_namespaced_job, cluster.ns).wait([bench.job_name(cluster, n) for n in names], 300)
        drive_to_training(bench, cluster, names, operator)
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(cluster.delete_run, names))
        # No controller manager here: the children go by hand, as GC would take them.
        bench.batch.delete_collection_namespaced_job(cluster.ns)
        bench.custom.delete_collection_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.ns, "mpijobs")
        bench.core.delete_collection_namespaced_config_map(cluster.ns)
        time.sleep(10)
        rss.append(operator.rss_mib())
        print(f"  cycle {cycle + 1}/{cycles}: RSS {rss[-1]:.0f} MiB", flush=True)
    return {"rss_mib": rss, "rss_drift": (rss[-1] - rss[0]) / rss[0]}


@contextlib.contextmanager
def environment(state: Path) -> Iterator[tuple[client.ApiClient, str, S3Server, Bucket]]:
    with api_server(state / "cluster", controllers=False) as kubeconfig:
        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        # The script's threads keep their connections, as a kubelet and the MPI operator do: with the default 10,
        # a TLS handshake per request over it loaded the API server that the operator shares.
        configuration.connection_pool_maxsize = 32
        api = client.ApiClient(configuration)
        install_crd(api, build_crd())
        import yaml

        crd = ROOT.parent / "shared/crds/kubeflow.org_mpijobs.yaml"
        install_crd(api, yaml.safe_load(Path(os.environ.get("SCALINGRUN_MPIJOB_CRD", crd)).read_text()))
        s3 = S3Server(state / "seaweedfs", "bench-" + secrets.token_hex(4), secrets.token_hex(20)).start()
        try:
            s3.create_bucket(BUCKET)
            yield api, kubeconfig, s3, Bucket(s3)
        finally:
            s3.stop()


def verdict(value: float, target: float) -> str:
    return f"{value / target:.2f}x target ({'met' if value <= target else 'MISSED'})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs for the latency percentiles")
    parser.add_argument("--concurrent", type=int, default=300, help="runs created at once")
    parser.add_argument("--rest-seconds", type=float, default=60, help="how long to count requests at rest")
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--cycle-runs", type=int, default=100)
    parser.add_argument("--topology", choices=("standalone", "deployed", "both"), default="both",
                        help="standalone: one operator without a Lease (the figures before issue 23); deployed: "
                             "the chart's two replicas with the Lease, at rest only; both (default)")
    parser.add_argument("--only-rest", action="store_true",
                        help="only the runs created at once and the figures at rest (no latency, no RSS cycles)")
    parser.add_argument("--settle-seconds", type=float, default=180,
                        help="deployed: at most this long for the new leader to resume every run (until a 10 s "
                             "window of it below 50 m CPU)")
    parser.add_argument("--pods", action="store_true",
                        help="the pods mode (bench/pod_scale.py): the script creates the runs' pods and moves their "
                             "phases beside --unrelated pods; one run of --big-workers, then --small-runs runs")
    parser.add_argument("--unrelated", type=int, default=10000, help="--pods: unrelated pods in another namespace")
    parser.add_argument("--big-workers", type=int, default=1024, help="--pods: workers of the one big run")
    parser.add_argument("--small-runs", type=int, default=300, help="--pods: small runs at once")
    parser.add_argument("--small-workers", type=int, default=4, help="--pods: workers of each small run")
    parser.add_argument("--push", action="store_true",
                        help="the push path (bench/push_scale.py): --small-runs runs of --small-workers and one of "
                             "--big-workers report an epoch every --interval s, pushed and (baseline) polled")
    parser.add_argument("--interval", type=float, default=10, help="--push: seconds between a run's reports")
    parser.add_argument("--report-seconds", type=float, default=60, help="--push: how long the runs report")
    parser.add_argument("--pushers", type=int, default=4,
                        help="--push: pods of each run that push (rank 0 progress, the others heartbeats)")
    parser.add_argument("--hostile-rate", type=float, default=1000,
                        help="--push: each kind of the attackers' pushes, at most this many a second")
    parser.add_argument("--no-hostile", dest="hostile", action="store_false", help="--push: no attackers")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="--push: no pull-mode baseline")
    args = parser.parse_args()
    if not os.environ.get("KUBEBUILDER_ASSETS"):
        parser.error("set KUBEBUILDER_ASSETS (the envtest binaries: ../shared/envtest/build-assets.sh | tail -n1)")
    if args.pods:
        return main_pods(args)
    if args.push:
        return main_push(args)
    latency = drift = deployed = None
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp, environment(Path(tmp)) as (api, kubeconfig, s3, bucket):
        storage = FlakyS3(s3.endpoint)  # counts the operator's S3 requests (the runs' endpoint)
        storage.server.handle_error = lambda *_: None  # clients dropping idle keep-alive connections: not news
        bench = Bench(api, s3, bucket, storage)
        print(f"baseline: API requests at rest without the operator ({args.rest_seconds:.0f} s)...", flush=True)
        baseline_rpm = requests_per_minute(api, args.rest_seconds)
        operator = OperatorProcess(kubeconfig, Path(tmp) / "operator.log")
        try:
            time.sleep(3)
            if not args.only_rest:
                print(f"latency over {args.runs} runs...", flush=True)
                latency = measure_latency(bench, operator, args.runs)
            print(f"{args.concurrent} runs at once...", flush=True)
            scale = measure_scale(bench, operator, args.concurrent, args.rest_seconds, baseline_rpm)
            if not args.only_rest:
                print(f"RSS over {args.cycles} cycles of {args.cycle_runs} runs...", flush=True)
                drift = measure_drift(bench, operator, args.cycles, args.cycle_runs)
        finally:
            operator.stop()
        if args.topology != "standalone":
            print(f"the chart's topology: two replicas with the Lease, the same {args.concurrent} runs at rest...",
                  flush=True)
            deployed = measure_deployed(bench, kubeconfig, Path(tmp), args.concurrent, args.rest_seconds,
                                        baseline_rpm, args.settle_seconds)
        storage.close()
    print()
    if args.topology != "deployed":
        print_standalone(args, latency, scale, drift)
    if deployed:
        print_deployed(scale, deployed)
    return 0


def main_pods(args: argparse.Namespace) -> int:
    from bench import pod_scale

    with tempfile.TemporaryDirectory(prefix="bench-pods-") as tmp, environment(Path(tmp)) as (api, kubeconfig, s3, bucket):
        storage = FlakyS3(s3.endpoint)
        storage.server.handle_error = lambda *_: None
        bench = Bench(api, s3, bucket, storage)
        counting = pod_scale.CountingApi(api)
        per_pod_without = pod_scale.calibrate(bench)
        port = free_port()
        operator = OperatorProcess(kubeconfig, Path(tmp) / "operator.log", metrics_port=port)
        try:
            time.sleep(3)
            print(f"{args.unrelated} unrelated pods...", flush=True)
            unrelated = pod_scale.measure_unrelated(bench, operator, args.unrelated, per_pod_without)
            scenarios = []
            for label, runs, workers in (("big", 1, args.big_workers), ("small", args.small_runs, args.small_workers)):
                if not runs or not workers:
                    continue  # that scenario not asked for
                print(f"{runs} run(s) of {workers} workers...", flush=True)
                scenarios.append(pod_scale.Scenario(bench, operator, port, counting, label, runs, workers,
                                                    drive_to_training, create_all).run())
                print(f"  {scenarios[-1]}", flush=True)  # kept should a later scenario not finish
                operator.check()
        finally:
            operator.stop()
            storage.close()
            if os.environ.get("BENCH_OPERATOR_LOG"):  # the operator's log kept past the temporary folder
                import shutil
                shutil.copy(Path(tmp) / "operator.log", os.environ["BENCH_OPERATOR_LOG"])
    print()
    pod_scale.print_pods(unrelated, scenarios)
    return 0


def main_push(args: argparse.Namespace) -> int:
    from bench import push_scale

    modes = []
    for push in ((True, False) if args.baseline else (True,)):  # push first: the pull baseline after it
        print(f"{'push' if push else 'pull'} mode...", flush=True)
        modes.append(push_scale.measure_mode(push, args, environment, Bench, OperatorProcess, create_all, FlakyS3))
    print()
    push_scale.print_push(args, modes)
    return 0


def print_standalone(args: argparse.Namespace, latency: Optional[dict], scale: dict, drift: Optional[dict]) -> None:
    print("| measure | value | baseline | against target |")
    print("|---|---|---|---|")
    if latency:
        floor = f"{latency['floor_p50_ms']:.0f} / {latency['floor_p95_ms']:.0f} ms (watch floor)"
        for key, label in (("create_to_job", "create -> Job"), ("job_done_to_mpijob", "Job done -> MPIJob")):
            p50, p95 = latency[f"{key}_p50_ms"], latency[f"{key}_p95_ms"]
            print(f"| {label}, p50 / p95 over {args.runs} runs | {p50:.0f} / {p95:.0f} ms | {floor} | "
                  f"p50 {verdict(p50, TARGETS['p50_ms'])}, p95 {verdict(p95, TARGETS['p95_ms'])} |")
    print(f"| {scale['runs']} runs at once: all Jobs exist | {scale['all_children_s']:.1f} s | "
          f"creates took {scale['create_calls_s']:.1f} s | {verdict(scale['all_children_s'], TARGETS['all_children_s'])} |")
    print(f"| peak RSS | {scale['peak_rss_mib']:.0f} MiB | | {verdict(scale['peak_rss_mib'], TARGETS['peak_rss_mib'])} |")
    print(f"| at rest, {scale['runs']} runs Training: API requests/min by the operator | "
          f"{scale['rest_requests_per_min']:.0f} | {scale['baseline_requests_per_min']:.0f}/min without it | "
          f"{verdict(max(scale['rest_requests_per_min'], 0), TARGETS['requests_per_min'])} |")
    print(f"| at rest: operator CPU | {scale['rest_cpu_millicores']:.1f} m | | "
          f"{verdict(scale['rest_cpu_millicores'], TARGETS['cpu_millicores'])} |")
    if drift:
        rss = " -> ".join(f"{v:.0f}" for v in drift["rss_mib"])
        print(f"| RSS over {args.cycles} cycles of {args.cycle_runs} runs | {rss} MiB ({100 * drift['rss_drift']:+.1f} %) | "
              f"first cycle | {verdict(max(drift['rss_drift'], 0), TARGETS['rss_drift'])} |")
    print(f"| at rest, {scale['runs']} runs Training: S3 requests/min by the operator | "
          f"{scale['rest_s3_requests_per_min']:.0f} | | |")


def print_deployed(standalone: dict, deployed: dict) -> None:
    """The chart's topology beside the standalone figures of the same run (the baseline)."""
    print()
    print(f"At rest, {deployed['runs']} runs in Training, {deployed['rest_seconds']:.0f} s each "
          f"(the Lease was taken {deployed['lease_taken_s']:.1f} s after the replicas started):")
    print()
    print("| at rest | standalone (1 operator, no Lease) | chart default "
          f"({deployed['replicas']} replicas, Lease) | ratio |")
    print("|---|---|---|---|")
    for key, label, unit in (("rest_requests_per_min", "API requests/min by the operator", ""),
                             ("rest_s3_requests_per_min", "S3 requests/min by the operator", ""),
                             ("rest_cpu_millicores", "CPU of the acting operator", " m")):
        a, b = standalone[key], deployed[key]
        ratio = f"{b / a:.2f}" if a > 0 else "-"
        print(f"| {label} | {a:.1f}{unit} | {b:.1f}{unit} | {ratio} |")
    print(f"| CPU of the standby | | {deployed['standby_cpu_millicores']:.1f} m | |")
    print(f"| API requests/min without any operator (subtracted) | {standalone['baseline_requests_per_min']:.0f} | "
          f"{deployed['baseline_requests_per_min']:.0f} | |")


if __name__ == "__main__":
    sys.exit(main())
