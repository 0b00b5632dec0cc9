"""The operator with its status endpoint on: a run's pods push its progress, status follows the push, and the
operator reads no storage and no Secret at all.

The operator runs as a subprocess with SCALINGRUN_STATUS_PORT_NUMBER set and its serving certificate in a folder (as
the kubelet mounts the chart's Secret). It writes the ConfigMap scalingrun-status into the run's namespace; the test
reads the URL and CA from it, as a pod mounts them, and pushes with the trainer's client and a token from the
TokenRequest API bound to a worker pod of the run (no kubelet runs). The preprocessing Job's pod ends with the
dataset's manifest in its termination message, as the trainer leaves it.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from kubernetes import client

from scalingrun_api.status_push import (
    CA_FILE, HEARTBEAT, PROGRESS, STATUS_CONFIG_MAP, URL_FILE, push_path,
)
from scalingrun_operator import config
from scalingrun_operator.pull.stored_documents import read_manifest
from scalingrun_operator.pull.storage import Clients, Credentials, StorageError
from scalingrun_operator.pull.store_source import target_of
from tests.support.apiserver import free_port
from tests.support.operator import (  # noqa: F401 (fixtures)
    SCHEDULED, controller_for, finish_preprocessing_by_pod, mpijob_pod_labels, new_run, progress, running, served,
    status_pusher, wait_for,
)
from tests.support.tls import post, write_serving_certificate

pytestmark = pytest.mark.k8s

STATUS_PORT = free_port()
BUCKET_NEVER_WRITTEN = "scalingrun-push-never-written"


def _status_env(_s3_server) -> dict[str, str]:
    tls = Path(tempfile.mkdtemp(prefix="scalingrun-status-tls-"))
    write_serving_certificate(tls)
    return {"SCALINGRUN_STATUS_PORT_NUMBER": str(STATUS_PORT), "SCALINGRUN_STATUS_TLS_DIR": str(tls),
            "SCALINGRUN_STATUS_URL": f"https://127.0.0.1:{STATUS_PORT}"}


operator, cluster = served("srh", env=_status_env)


def test_status_follows_a_push_from_the_runs_pod(cluster, operator, s3_server, tmp_path):
    # Storage holds nothing of this run: the manifest comes from the Job's pod, progress by push.
    cluster.create_run(new_run(cluster.ns, "pushed", s3_server))
    finish_preprocessing_by_pod(cluster, "pushed", operator)

    # What every pod of the run mounts: the namespace's ConfigMap (written by the operator) and a bound token.
    core = client.CoreV1Api(cluster.core.api_client)
    config_map = wait_for(lambda: core.read_namespaced_config_map(STATUS_CONFIG_MAP, cluster.ns).data,
                          what="the status ConfigMap", operator=operator)
    assert config_map[URL_FILE] == f"https://127.0.0.1:{STATUS_PORT}"
    assert "BEGIN CERTIFICATE" in config_map[CA_FILE]
    mpijob = cluster.mpijob(cluster.status("pushed")["training"]["mpiJobName"])
    pod = cluster.create_pod("pushed-worker-0", mpijob_pod_labels(mpijob, "worker"), "worker", "trainer:test",
                             owner=mpijob)  # as mpi-operator makes a worker: its push is taken by this owner
    pusher = status_pusher(cluster, pod, "pushed", tmp_path)
    token = (tmp_path / "token").read_text()

    # Only the push says 3, and status follows it without a storage write.
    pushed_at = time.monotonic()
    pusher.push(PROGRESS, progress("running", 3))
    assert pusher.flush(60) and pusher.sent == 1
    wait_for(lambda: cluster.status("pushed").get("training", {}).get("epoch") == 3, what="epoch 3 from the push",
             operator=operator)
    print(f"push -> status.training.epoch: {time.monotonic() - pushed_at:.2f} s")
    assert 'scalingrun_status_pushes_total{document="progress"} 1.0' in operator.metrics()

    # A namespace this operator does not serve is refused before any token is looked at.
    code, answer = post(STATUS_PORT, tmp_path / CA_FILE, push_path("elsewhere", "pushed", PROGRESS), b"{}", token)
    assert (code, answer["reason"]) == (403, "NotWatched")


class LoggedStore:
    """The run's store endpoint: a TCP front of the S3 server that records every connection it accepts. Only the
    operator is told its address (the run's spec.storage.endpoint); the test writes to the S3 server directly."""

    def __init__(self, upstream: str):
        target = urllib.parse.urlsplit(upstream)
        self.upstream = (target.hostname, target.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.clients: list[tuple[str, int]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, peer = self.listener.accept()
            except OSError:
                return  # closed
            self.clients.append(peer)
            upstream = socket.create_connection(self.upstream)
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._copy, args=(source, sink), daemon=True).start()

    @staticmethod
    def _copy(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError), source, sink:  # the other direction may close both first
            while data := source.recv(65536):
                sink.sendall(data)

    def close(self) -> None:
        self.listener.close()


def test_with_push_on_the_operator_reaches_no_store_and_reads_no_secret(cluster, operator, s3_server,
                                                                       controller_for, tmp_path):
    store = LoggedStore(s3_server.endpoint)
    try:
        # What the test watches for can happen: the operator's own storage read (its pull path) through the front.
        target = target_of(config.load({"SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT": "true"}),
            store.endpoint, "us-east-1", Credentials(s3_server.access_key, s3_server.secret_key), Clients())
        try:
            read_manifest(f"s3://{BUCKET_NEVER_WRITTEN}/_manifest.json", target)
        except StorageError:
            pass  # no such bucket: the connection was made all the same
        assert store.clients, "a read through the logged store is seen"
        seen_by_the_test = len(store.clients)

        controller_for(cluster.ns)
        # The run names a store (the logged one) and a Secret that does not exist: neither is needed with push on.
        cluster.create_run(new_run(cluster.ns, "quiet", s3_server,
                                   storage={"endpoint": store.endpoint, "credentialsSecret": "never-made"}))
        finish_preprocessing_by_pod(cluster, "quiet", operator)
        mpijob = cluster.status("quiet")["training"]["mpiJobName"]
        workers = wait_for(lambda: (lambda pods: len(pods) == 2 and pods)(cluster.core.list_namespaced_pod(
            cluster.ns, label_selector=f"training.kubeflow.org/job-name={mpijob}").items),
            what="the stand-in controller's worker pods", operator=operator)
        for worker in workers:  # what the kubelet would report: the controller then makes the launcher
            cluster.set_pod_status(worker.metadata.name, phase="Running", containers=running("worker"),
                                   conditions=[*SCHEDULED, {"type": "Ready", "status": "True"}])
        pusher = status_pusher(cluster, cluster.core.api_client.sanitize_for_serialization(workers[0]), "quiet", tmp_path)
        pusher.push(HEARTBEAT, {"time": time.time(), "step": 10, "rank": 0, "phase": "training"})
        pusher.push(PROGRESS, progress("running", 2))
        wait_for(lambda: cluster.status("quiet").get("training", {}).get("epoch") == 2, what="epoch 2 from the push",
                 operator=operator)
        pusher.push(PROGRESS, progress("succeeded", 5))
        assert pusher.flush(60)
        launcher = wait_for(lambda: cluster.job(f"{mpijob}-launcher"), what="the launcher Job", operator=operator)
        cluster.complete_job(launcher["metadata"]["name"], succeeded=1)  # the stand-in controller: MPIJob Succeeded
        wait_for(cluster.phase_is("quiet", "Succeeded"), what="quiet Succeeded", operator=operator)

        assert store.clients[seen_by_the_test:] == [], "the operator connected to the run's store"
        conditions = {c["type"]: c for c in cluster.status("quiet")["conditions"]}
        assert "StorageReadable" not in conditions, conditions  # nothing was read, so nothing failed to be
        assert cluster.status("quiet")["training"]["epoch"] == 5
    finally:
        store.close()
