"""An MPIJob that nothing reconciles, on a real API server: the API server with the MPIJob CRD and no controller is
exactly a cluster without mpi-operator (or with only the Training Operator v1's). The run gets MPIJobServed=False
naming the controller and its install command, and True once the test-only MPIJob controller
(tests/e2e/mpijob_controller, mpi-operator v0.8's stand-in) serves it; a run whose MPIJob that controller serves from
the start never gets the condition."""

from __future__ import annotations

import datetime as dt

import pytest

from scalingrun_operator.builders.mpijob import MPI_OPERATOR_INSTALL
from tests.support.operator import (  # noqa: F401 (fixtures)
    bucket, controller_for, new_run, progress, progress_uri, reach_training, served, wait_for,
)

pytestmark = pytest.mark.k8s

# The stand-in controller writes its first condition after it has made the launcher and workers: a second when the
# machine is idle, several under CI's load. The bound is well above that, so "served from the start" holds.
UNSERVED_SECONDS = 20

operator, cluster = served("srq", env=lambda s3_server: {"SCALINGRUN_MPIJOB_UNSERVED_SECONDS": str(UNSERVED_SECONDS)})


def test_an_mpijob_nothing_reconciles_names_the_missing_controller_until_one_serves_it(
        cluster, operator, bucket, s3_server, controller_for):
    cluster.create_run(new_run(cluster.ns, "alone", s3_server))
    reach_training(cluster, bucket, "alone", operator)
    unserved = wait_for(lambda: cluster.condition("alone", "MPIJobServed"), what="MPIJobServed", operator=operator)
    assert (unserved["status"], unserved["reason"]) == ("False", "NoMPIJobController")
    assert MPI_OPERATOR_INSTALL in unserved["message"] and "Training Operator v1" in unserved["message"]
    assert not cluster.mpijob("alone-train").get("status"), "nothing reconciled it: that is the case under test"
    cluster.wait_events("alone", lambda events: [r for _, r, _ in events].count("NoMPIJobController") == 1, operator)

    controller_for(cluster.ns)  # mpi-operator arrives: it writes the MPIJob's conditions, the run says so
    served_now = wait_for(lambda: cluster.condition("alone", "MPIJobServed").get("status") == "True"
                          and cluster.condition("alone", "MPIJobServed"), what="MPIJobServed True", operator=operator)
    assert served_now["reason"] == "Served"
    assert (cluster.mpijob("alone-train").get("status") or {}).get("conditions")


def test_an_mpijob_served_from_the_start_gets_no_such_condition(cluster, operator, bucket, s3_server, controller_for):
    controller_for(cluster.ns)
    created = cluster.create_run(new_run(cluster.ns, "served", s3_server))
    reach_training(cluster, bucket, "served", operator)
    mpijob = wait_for(lambda: (lambda m: m and (m.get("status") or {}).get("conditions") and m)(
        cluster.mpijob("served-train")), what="the controller's conditions on the MPIJob", operator=operator)
    born = dt.datetime.fromisoformat(mpijob["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    # The case: a look after the bound has passed. Wait for the bound itself, then make a look happen (the
    # trainer reports an epoch) and wait for its result in status.
    wait_for(lambda: (dt.datetime.now(dt.timezone.utc) - born).total_seconds() > UNSERVED_SECONDS + 1,
             what="the bound to pass", operator=operator)
    bucket.put_json(progress_uri(created), progress("running", 1))
    wait_for(lambda: (cluster.status("served").get("training") or {}).get("epoch") == 1,
             what="a look after the bound (epoch 1 in status)", operator=operator)
    first = min(c["lastTransitionTime"] for c in mpijob["status"]["conditions"])
    assert not cluster.condition("served", "MPIJobServed"), (
        f"MPIJob created {mpijob['metadata']['creationTimestamp']}, first controller condition {first}",
        cluster.status("served")["conditions"])
