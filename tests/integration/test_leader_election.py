"""Two operator replicas on a real API server: one Lease holder acts, a SIGKILLed leader is replaced
within 30 s, runs get their children exactly once, and a leader whose Lease is taken stops at once."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from scalingrun_operator.leader import EXIT_LOST_LEASE
from tests.integration.test_operator import (BUCKET, Bucket, Cluster, Operator, _namespace, manifest_for, new_run,
                                             wait_for)

pytestmark = [pytest.mark.k8s, pytest.mark.s3]

LEASE = "scalingrun-operator"
HANDOVER_LIMIT = 30.0


@pytest.fixture
def ha_cluster(api_client, s3_server, request, scalingrun_crd, mpijob_crd) -> Cluster:
    name = _namespace(api_client, s3_server, request, "srl")
    yield Cluster(api_client, name)
    client.CoreV1Api(api_client).delete_namespace(name)


@pytest.fixture
def bucket(s3_server) -> Bucket:
    b = Bucket(s3_server)
    try:
        b.client.create_bucket(Bucket=BUCKET)
    except (b.client.exceptions.BucketAlreadyOwnedByYou, b.client.exceptions.BucketAlreadyExists):
        pass
    return b


def replica(kubeconfig: str, tmp_path, cluster: Cluster, identity: str) -> Operator:
    """An operator as the chart runs it (Lease leader election, the default), its Lease in the test namespace."""
    return Operator(kubeconfig, tmp_path / f"{identity}.log", [cluster.ns],
                    env={"SCALINGRUN_LEASE_NAMESPACE": cluster.ns, "SCALINGRUN_LEASE_HOLDER": identity})


def holder(cluster: Cluster) -> str | None:
    coordination = client.CoordinationV1Api(cluster.core.api_client)
    try:
        return coordination.read_namespaced_lease(LEASE, cluster.ns).spec.holder_identity
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_two_replicas_one_acts_and_the_other_takes_over_after_sigkill(ha_cluster, bucket, kubeconfig, s3_server,
                                                                      tmp_path):
    cluster = ha_cluster
    replicas = {name: replica(kubeconfig, tmp_path, cluster, name) for name in ("replica-a", "replica-b")}
    try:
        for op in replicas.values():
            op.start()  # both answer liveness: the standby too, or its pod would be restarted
        leader_name = wait_for(lambda: holder(cluster), what="a Lease holder")
        leader = replicas[leader_name]
        standby_name = next(n for n in replicas if n != leader_name)
        standby = replicas[standby_name]

        cluster.create_run(new_run(cluster.ns, "first", s3_server))
        wait_for(cluster.phase_is("first", "Preprocessing"), what="Preprocessing", operator=leader)
        assert "created Job" in leader.log_tail(400)
        assert "created" not in standby.log_tail(400) and "waiting to lead" in standby.log_tail(400)

        # The leader dies without a word. A run is created and a Job completes during the handover.
        leader.kill()
        killed = time.monotonic()
        cluster.create_run(new_run(cluster.ns, "during", s3_server))
        run = cluster.run("first")
        bucket.put_json(f"{run['spec']['dataset']['output']}/_manifest.json", manifest_for(run))
        cluster.complete_job("first-preprocess", succeeded=2)

        wait_for(lambda: holder(cluster) == standby_name, what="the standby to hold the Lease",
                 timeout=HANDOVER_LIMIT + 5, interval=0.1, operator=standby)
        handover = time.monotonic() - killed
        print(f"handover after SIGKILL: {handover:.1f} s (Lease duration 15 s, standby retry 2 s)")
        assert handover < HANDOVER_LIMIT

        wait_for(cluster.phase_is("first", "Training"), what="first Training by the new leader", operator=standby)
        wait_for(cluster.phase_is("during", "Preprocessing"), what="during Preprocessing", operator=standby)
        cluster.create_run(new_run(cluster.ns, "after", s3_server))
        wait_for(cluster.phase_is("after", "Preprocessing"), what="after Preprocessing", operator=standby)

        assert cluster.children("first") == {"ConfigMap": ["first-config"], "Job": ["first-preprocess"],
                                             "MPIJob": ["first-train"]}
        for name in ("during", "after"):
            assert cluster.children(name) == {"ConfigMap": [f"{name}-config"], "Job": [f"{name}-preprocess"],
                                              "MPIJob": []}
        log = standby.log_tail(2000)
        assert log.count(f"created Job {cluster.ns}/during-preprocess") == 1
        assert log.count(f"created MPIJob {cluster.ns}/first-train") == 1
    finally:
        for op in replicas.values():
            op.stop()


def test_a_leader_whose_lease_is_taken_stops_at_once(ha_cluster, kubeconfig, tmp_path):
    cluster = ha_cluster
    op = replica(kubeconfig, tmp_path, cluster, "replica-a")
    try:
        op.start()
        wait_for(lambda: holder(cluster) == "replica-a", what="replica-a to hold the Lease", operator=op)
        coordination = client.CoordinationV1Api(cluster.core.api_client)
        lease = coordination.read_namespaced_lease(LEASE, cluster.ns)
        lease.spec.holder_identity = "intruder"
        coordination.replace_namespaced_lease(LEASE, cluster.ns, lease)
        taken = time.monotonic()

        # The next renewal (every 5 s) finds another holder: the process exits non-zero, without
        # waiting for kopf's graceful stop, so that its pod restarts as a standby.
        assert op.process
        code = op.process.wait(timeout=20)
        print(f"leader stopped {time.monotonic() - taken:.1f} s after its Lease was taken")
        assert code == EXIT_LOST_LEASE
        assert "Lease" in op.log_tail() and "now held by intruder" in op.log_tail()
        assert holder(cluster) == "intruder"
    finally:
        op.stop()


def test_a_leader_stopped_gracefully_hands_the_lease_over_at_once(ha_cluster, kubeconfig, tmp_path):
    """SIGTERM (a rollout, a drain): the leader gives the Lease back instead of letting it expire."""
    cluster = ha_cluster
    first, second = (replica(kubeconfig, tmp_path, cluster, name) for name in ("replica-a", "replica-b"))
    try:
        first.start()
        wait_for(lambda: holder(cluster) == "replica-a", what="replica-a to hold the Lease", operator=first)
        second.start()
        time.sleep(3)  # the standby has looked at least once
        assert holder(cluster) == "replica-a"
        stopping = time.monotonic()
        first.stop()
        assert first.process and first.process.returncode == 0, first.log_tail()
        assert "released Lease" in first.log_tail()
        wait_for(lambda: holder(cluster) == "replica-b", what="replica-b to hold the Lease", timeout=10,
                 interval=0.1, operator=second)
        handover = time.monotonic() - stopping
        print(f"handover after SIGTERM: {handover:.1f} s")
        assert handover < 10
    finally:
        first.stop()
        second.stop()
