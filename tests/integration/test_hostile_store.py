"""A tenant's hostile store costs its own runs only: the operator (a subprocess, against a real kube-apiserver)
serves runs whose stores (tests/support/hostile_store.py on 127.0.0.1, on the operator's allow-list) answer with a
200 MiB error body, trickle their headers or their body, list pages without end, or redirect to the cloud
metadata address, next to healthy runs on SeaweedFS. Each hostile run gets a condition that says what its store
did; the operator stays up, under its memory limit; the healthy runs created while the hostile reads are going
on reach their preprocessing Job as healthy runs do on a quiet operator (their latency is printed, not asserted).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client, watch

from tests.support.hostile_store import HostileStore
from tests.support.operator import Bucket, Cluster, Operator, new_namespace, new_run, started, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.s3]

PREFIX = "srx"
BUCKET = "scalingrun-operator"
MEMORY_LIMIT = 512 * 2 ** 20  # the chart's limit for the operator
HEALTHY = 5
# What each store does, and the condition reason its run must get.
HOSTILE = {"huge-error": "StorageAnswerTooLarge", "trickle-headers": "StorageTooSlow",
           "trickle-body": "StorageTooSlow", "redirect": "StorageRedirected",
           "endless-listing": "StorageListingEndless"}


@pytest.fixture(scope="module")
def stores():
    made = {behaviour: HostileStore(behaviour, pace=0.2) for behaviour in HOSTILE}
    yield made
    for store in made.values():
        store.close()


@pytest.fixture(scope="module")
def operator(kubeconfig, scalingrun_crd, mpijob_crd, s3_server, stores, tmp_path_factory) -> Operator:
    allowed = ",".join([s3_server.endpoint] + [s.endpoint for s in stores.values()])
    with started(Operator(kubeconfig, tmp_path_factory.mktemp("hostile-operator") / "operator.log", [f"{PREFIX}-*"],
                      "--standalone", env={"SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS": allowed,
                                           "SCALINGRUN_STORAGE_TIMEOUT_SECONDS": "2",
                                           "SCALINGRUN_STORAGE_DEADLINE_SECONDS": "5"})) as op:
        yield op


@pytest.fixture
def namespaces(api_client, s3_server, request, scalingrun_crd, mpijob_crd):
    made: list[Cluster] = []

    def new() -> Cluster:
        made.append(Cluster(api_client, new_namespace(api_client, s3_server, request, PREFIX)))
        return made[-1]

    yield new
    for cluster in made:
        client.CoreV1Api(cluster.core.api_client).delete_namespace(cluster.ns)


class JobArrivals:
    """When each Job of a namespace was first seen by a watch (monotonic seconds), by name."""

    def __init__(self, cluster: Cluster):
        self.seen: dict[str, float] = {}
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(cluster,), daemon=True)
        self._thread.start()

    def _run(self, cluster: Cluster) -> None:
        try:
            for event in self._watch.stream(cluster.batch.list_namespaced_job, cluster.ns):
                self.seen.setdefault(event["object"].metadata.name, time.monotonic())
        except Exception:  # the namespace goes away under it at the end
            pass

    def stop(self) -> None:
        self._watch.stop()


def served(cluster: Cluster, s3_server, operator: Operator) -> Cluster:
    """`cluster` once the operator serves it: a first run, not measured, has its Job (and the storage client is
    warm)."""
    cluster.create_run(new_run(cluster.ns, "warmup", s3_server))
    wait_for(cluster.phase_is("warmup", "Preprocessing"), what="warmup Preprocessing", operator=operator)
    return cluster


def healthy_batch(cluster: Cluster, s3_server, operator: Operator) -> list[float]:
    """HEALTHY runs on SeaweedFS; the seconds from each create to its preprocessing Job, seen by a watch."""
    arrivals = JobArrivals(cluster)
    wait_for(lambda: "warmup-preprocess" in arrivals.seen, what="the Jobs' watch", operator=operator)
    created: dict[str, float] = {}
    for index in range(HEALTHY):
        name = f"healthy{index}"
        created[name] = time.monotonic()
        cluster.create_run(new_run(cluster.ns, name, s3_server))
    try:
        wait_for(lambda: all(f"{n}-preprocess" in arrivals.seen for n in created), what="the healthy runs' Jobs",
                 operator=operator, interval=0.05)
        for name in created:
            wait_for(cluster.phase_is(name, "Preprocessing"), what=f"{name} Preprocessing", operator=operator)
        return [arrivals.seen[f"{n}-preprocess"] - t for n, t in created.items()]
    finally:
        arrivals.stop()


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_hostile_stores_cost_their_own_runs_only(namespaces, operator, stores, s3_server):
    Bucket.created(s3_server, BUCKET)
    quiet = healthy_batch(served(namespaces(), s3_server, operator), s3_server, operator)
    later = served(namespaces(), s3_server, operator)  # served before the hostile runs come: measured after

    tenant = namespaces()
    tenant.core.create_namespaced_secret(tenant.ns, {"metadata": {"name": "hostile-creds"}, "stringData": {
        "AWS_ACCESS_KEY_ID": "AKIDHOSTILE", "AWS_SECRET_ACCESS_KEY": uuid.uuid4().hex}})
    for behaviour, store in stores.items():
        tenant.create_run(new_run(tenant.ns, behaviour, s3_server,
                                  storage={"endpoint": store.endpoint, "credentialsSecret": "hostile-creds"}))
    # The operator is busy with every hostile store (the trickles are being read) before the healthy runs come.
    wait_for(lambda: all(store.requests for store in stores.values()), what="a request at every hostile store",
             operator=operator)
    busy = healthy_batch(later, s3_server, operator)

    for behaviour, reason in HOSTILE.items():
        if behaviour == "endless-listing":
            continue
        condition = wait_for(lambda: tenant.condition(behaviour, "StorageReadable").get("status") == "False" and
                             tenant.condition(behaviour, "StorageReadable"), what=f"{behaviour}: StorageReadable=False",
                             operator=operator)
        assert condition["reason"] == reason, (behaviour, condition)
        assert stores[behaviour].endpoint in condition["message"], condition["message"]
    assert "error answer is over the operator's cap of 64 KiB" in tenant.condition("huge-error", "StorageReadable")[
        "message"]
    for behaviour in ("trickle-headers", "trickle-body"):
        assert "within the operator's budget of 5 s" in tenant.condition(behaviour, "StorageReadable")["message"]
    assert "does not follow redirects" in tenant.condition("redirect", "StorageReadable")["message"]
    assert "169.254" not in tenant.condition("redirect", "StorageReadable")["message"]

    # The endless listing is read to explain a failed preprocessing: its store answers no manifest (404), so the
    # run gets its Job; the Job fails, and the listing of its shard manifests is stopped and named.
    job = wait_for(lambda: tenant.job("endless-listing-preprocess"), what="the endless-listing run's Job",
                   operator=operator)
    tenant.fail_job(job["metadata"]["name"], succeeded=0, failed=3, reason="BackoffLimitExceeded", message="failed")
    status = wait_for(tenant.phase_is("endless-listing", "Failed"), what="endless-listing Failed", operator=operator)
    assert "the shard manifests could not be listed" in status["message"] and \
        "listing pages with 0 keys and still more to come" in status["message"], status["message"]
    listing_requests = [r for r in stores["endless-listing"].requests if "list-type=2" in r]
    assert 0 < len(listing_requests) <= 2 * 9, "stopped after a few pages, at most twice (the breaker opens)"

    assert operator.process.poll() is None and operator.healthy()
    rss = peak_rss(operator.process.pid)
    assert rss < MEMORY_LIMIT, f"operator peak RSS {rss / 2**20:.0f} MiB"
    print(f"\ncreate -> Job, {HEALTHY} healthy runs: quiet operator p50 {statistics.median(quiet) * 1000:.0f} ms, "
          f"max {max(quiet) * 1000:.0f} ms; beside {len(HOSTILE)} hostile runs p50 "
          f"{statistics.median(busy) * 1000:.0f} ms, max {max(busy) * 1000:.0f} ms; "
          f"operator peak RSS {rss / 2**20:.0f} MiB; bytes the huge-error store got out: "
          f"{stores['huge-error'].bytes_sent / 2**20:.1f} MiB")
