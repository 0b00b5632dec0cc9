"""The operator with its status endpoint on: a run's pod pushes its progress, and status follows the push.

The operator runs as a subprocess with SCALINGRUN_STATUS_PORT_NUMBER set and its serving certificate in a folder (as
the kubelet mounts the chart's Secret). It writes the ConfigMap scalingrun-status into the run's namespace; the test
reads the URL and CA from it, as a pod mounts them, and pushes with the trainer's client and a token from the
TokenRequest API bound to a worker pod of the run (no kubelet runs).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from kubernetes import client

from scalingrun_api.status_push import CA_FILE, PROGRESS, STATUS_AUDIENCE, STATUS_CONFIG_MAP, URL_FILE, push_path
from scalingrun_trainer.core.status_push import StatusPusher
from tests.support.apiserver import free_port
from tests.support.operator import (  # noqa: F401 (fixtures)
    bucket, mpijob_pod_labels, new_run, progress, progress_uri, reach_training, served, wait_for,
)
from tests.support.tls import post, write_serving_certificate

pytestmark = pytest.mark.k8s

STATUS_PORT = free_port()


def _status_env(_s3_server) -> dict[str, str]:
    tls = Path(tempfile.mkdtemp(prefix="scalingrun-status-tls-"))
    write_serving_certificate(tls)
    return {"SCALINGRUN_STATUS_PORT_NUMBER": str(STATUS_PORT), "SCALINGRUN_STATUS_TLS_DIR": str(tls),
            "SCALINGRUN_STATUS_URL": f"https://127.0.0.1:{STATUS_PORT}"}


operator, cluster = served("srh", env=_status_env)


def test_status_follows_a_push_from_the_runs_pod(cluster, operator, bucket, s3_server, tmp_path):
    run = cluster.create_run(new_run(cluster.ns, "pushed", s3_server))
    reach_training(cluster, bucket, "pushed", operator)
    bucket.put_json(progress_uri(run), progress("running", 1))
    wait_for(lambda: cluster.status("pushed").get("training", {}).get("epoch") == 1, what="epoch 1 from storage",
             operator=operator)

    # What every pod of the run mounts: the namespace's ConfigMap (written by the operator) and a bound token.
    core = client.CoreV1Api(cluster.core.api_client)
    config_map = wait_for(lambda: core.read_namespaced_config_map(STATUS_CONFIG_MAP, cluster.ns).data,
                          what="the status ConfigMap", operator=operator)
    assert config_map[URL_FILE] == f"https://127.0.0.1:{STATUS_PORT}"
    assert "BEGIN CERTIFICATE" in config_map[CA_FILE]
    mpijob = cluster.mpijob(cluster.status("pushed")["training"]["mpiJobName"])
    pod = cluster.create_pod("pushed-worker-0", mpijob_pod_labels(mpijob, "worker"), "worker", "trainer:test")
    token = core.create_namespaced_service_account_token("default", cluster.ns, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[STATUS_AUDIENCE], expiration_seconds=600,
                                       bound_object_ref=client.V1BoundObjectReference(
                                           kind="Pod", api_version="v1", name=pod["metadata"]["name"],
                                           uid=pod["metadata"]["uid"])))).status.token
    (tmp_path / "token").write_text(token)
    (tmp_path / CA_FILE).write_text(config_map[CA_FILE])
    pusher = StatusPusher(config_map[URL_FILE], push_path(cluster.ns, "pushed", "").rstrip("/"),
                          tmp_path / CA_FILE, tmp_path / "token")

    # Storage still says epoch 1: only the push says 3, and status follows it without a storage write.
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
