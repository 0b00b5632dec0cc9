"""Kueue as Kueue expects, against a real API server, with the test playing Kueue (no Kueue can be installed here):
it admits a held MPIJob by resuming it and preempts it by suspending it again, as Kueue's job integration does. The
run is Queued while held, Training once admitted, Queued (Preempted) again with no interruption counted, and the
operator never un-suspends what Kueue holds, not even when the user sets spec.runPolicy.suspend back to false."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.support.operator import (  # noqa: F401 (bucket: a fixture)
    Cluster, bucket, manifest_for, new_run, served, wait_for,
)

pytestmark = pytest.mark.k8s

SERVED = "srz"  # namespaces srz-* are served by this module's operator
QUEUE = "team-a"
KUEUE_LABEL = "kueue.x-k8s.io/queue-name"


operator, cluster = served(SERVED)


class PlayedKueue:
    """What Kueue's MPIJob integration does to a job of a LocalQueue: admit (resume) and preempt (suspend)."""

    def __init__(self, cluster: Cluster, name: str):
        self.cluster, self.name = cluster, name

    def _suspend(self, value: bool) -> None:
        self.cluster.custom.patch_namespaced_custom_object("kubeflow.org", "v2beta1", self.cluster.ns, "mpijobs",
                                                           self.name, {"spec": {"runPolicy": {"suspend": value}}})

    def admit(self) -> None:
        self._suspend(False)
        self.cluster.set_mpijob_condition(self.name, "Running", "", "")

    def preempt(self) -> None:
        self._suspend(True)


def test_kueue_holds_admits_and_preempts_and_the_operator_leaves_suspend_to_it(cluster, operator, bucket, s3_server):
    cluster.create_run(new_run(cluster.ns, "queued", s3_server, runPolicy={"kueueQueueName": QUEUE}))
    job = wait_for(lambda: cluster.job("queued-preprocess"), what="the preprocessing Job", operator=operator)
    # Queued too (its suspend: true, which Kueue resumes on admission, is a field 1.20's API server drops).
    assert job["metadata"]["labels"][KUEUE_LABEL] == QUEUE
    run = cluster.run("queued")
    bucket.put_json(f"{run['spec']['dataset']['output']}/_manifest.json", manifest_for(run))
    cluster.complete_job(job["metadata"]["name"], succeeded=2)

    # (The look that created the Job said Queued too, from the Job as created: wait for the MPIJob's.)
    wait_for(lambda: cluster.mpijob("queued-train") and cluster.phase_is("queued", "Queued")(),
             what="Queued with its MPIJob", operator=operator)
    mpijob = cluster.mpijob("queued-train")
    assert mpijob["spec"]["runPolicy"]["suspend"] is True, "created suspended: Kueue admits it by resuming it"
    assert mpijob["metadata"]["labels"][KUEUE_LABEL] == QUEUE
    assert cluster.condition("queued", "Queued")["reason"] == "WaitingForAdmission"

    # Another look at the held job (a spec change makes one, and says so): it stays suspended.
    cluster.patch_run("queued", {"spec": {"training": {"maxEpochs": 7}}})
    wait_for(lambda: cluster.condition("queued", "SpecChangeIgnored").get("status") == "True",
             what="the look at the spec change", operator=operator)
    assert cluster.mpijob("queued-train")["spec"]["runPolicy"]["suspend"] is True
    assert cluster.status("queued")["phase"] == "Queued"

    kueue = PlayedKueue(cluster, "queued-train")
    kueue.admit()
    wait_for(cluster.phase_is("queued", "Training"), what="Training once admitted", operator=operator)
    assert cluster.condition("queued", "Queued")["reason"] == "Admitted"

    kueue.preempt()
    wait_for(cluster.phase_is("queued", "Queued"), what="Queued again after the preemption", operator=operator)
    assert cluster.condition("queued", "Queued")["reason"] == "Preempted"
    assert not (cluster.status("queued").get("training") or {}).get("restarts"), "a preemption is no interruption"
    assert cluster.mpijob("queued-train")["spec"]["runPolicy"]["suspend"] is True

    kueue.admit()
    wait_for(cluster.phase_is("queued", "Training"), what="Training again", operator=operator)

    # The user's own suspend still works, once: the operator suspends the MPIJob and leaves it there.
    cluster.patch_run("queued", {"spec": {"runPolicy": {"suspend": True}}})
    wait_for(cluster.phase_is("queued", "Suspended"), what="Suspended by the user", operator=operator)
    assert cluster.mpijob("queued-train")["spec"]["runPolicy"]["suspend"] is True

    # Set back to false, the run returns to the queue: the operator never writes suspend: false under Kueue (that
    # would start pods no quota was granted for); Kueue resumes the MPIJob when it admits it.
    cluster.patch_run("queued", {"spec": {"runPolicy": {"suspend": False}}})
    wait_for(lambda: cluster.condition("queued", "Suspended").get("reason") == "ReturnedToQueue",
             what="the run back in the queue", operator=operator)
    assert cluster.status("queued")["phase"] == "Queued"
    assert cluster.condition("queued", "Queued")["reason"] == "WaitingForAdmission"
    assert cluster.status("queued")["training"]["suspendApplied"] is False
    assert cluster.mpijob("queued-train")["spec"]["runPolicy"]["suspend"] is True, "only Kueue resumes it"
    kueue.admit()
    wait_for(cluster.phase_is("queued", "Training"), what="Training once Kueue admits it again", operator=operator)
