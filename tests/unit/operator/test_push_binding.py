"""What ties a push to a run (cluster/push_auth.py): the pushing pod's owner chain, not its labels. A pod is the run's
when its controller is the run's own Job or MPIJob, or the launcher Job of the run's MPIJob (mpi-operator v0.8), whose
controller is the run with the run's uid; and the run must be one the operator's watch knows (KnownRuns). The same
chain against a real API server: tests/integration/test_push_ownership.py."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from scalingrun_operator.cluster.latest import LatestObjects
from scalingrun_operator.cluster.push_auth import owner_chain

RUN_UID, OTHER_RUN_UID = "uid-alpha", "uid-beta"


def _ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    api_version = {"ScalingRun": "scalingrun.dev/v1alpha1", "MPIJob": "kubeflow.org/v2beta1", "Job": "batch/v1"}[kind]
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


def _object(name: str, uid: str, owner: Optional[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "ownerReferences": [owner] if owner else []}}


# What the operator and mpi-operator v0.8 make for runs alpha and beta (../shared/mpi-operator/README.md): the run
# controls its preprocessing Job and its MPIJob; the MPIJob its workers and its launcher Job; that Job the launcher.
OBJECTS = {
    ("Job", "alpha-preprocess"): _object("alpha-preprocess", "job-a", _ref("ScalingRun", "alpha", RUN_UID)),
    ("MPIJob", "alpha-train"): _object("alpha-train", "mpi-a", _ref("ScalingRun", "alpha", RUN_UID)),
    ("Job", "alpha-train-launcher"): _object("alpha-train-launcher", "launcher-a",
                                             _ref("MPIJob", "alpha-train", "mpi-a")),
    ("MPIJob", "beta-train"): _object("beta-train", "mpi-b", _ref("ScalingRun", "beta", OTHER_RUN_UID)),
    ("Job", "loose"): _object("loose", "job-loose", None),
    ("Job", "nested"): _object("nested", "job-nested", _ref("Job", "alpha-preprocess", "job-a")),
}


def _pod(owner: Optional[dict[str, Any]]) -> dict[str, Any]:
    return _object("pod", "pod-uid", owner)


@pytest.mark.parametrize("owner, why", [
    (_ref("Job", "alpha-preprocess", "job-a"), None),  # a preprocessing (or table check) pod
    (_ref("MPIJob", "alpha-train", "mpi-a"), None),  # a worker
    (_ref("Job", "alpha-train-launcher", "launcher-a"), None),  # the launcher, through its Job
    (_ref("MPIJob", "beta-train", "mpi-b"), "its MPIJob beta-train is another run's"),
    (None, "its controller is no Job or MPIJob"),  # a pod labelled as alpha's and owned by nothing
    (_ref("ScalingRun", "alpha", RUN_UID), "its controller is no Job or MPIJob"),  # an elastic capacity probe
    (_ref("MPIJob", "alpha-train", "made-up-uid"), "its MPIJob alpha-train is gone"),  # the name, not the object
    (_ref("Job", "no-such-job", "job-x"), "its Job no-such-job is gone"),
    (_ref("Job", "loose", "job-loose"), "its Job loose is controlled by no run"),
    (_ref("Job", "nested", "job-nested"), "its Job nested is controlled by no run"),  # only Job -> MPIJob nests
    ({**_ref("MPIJob", "alpha-train", "mpi-a"), "apiVersion": "example.com/v1"}, "its controller is no Job or MPIJob"),
])
def test_a_pod_is_the_runs_when_its_owner_chain_reaches_the_run_by_uid(owner, why):
    lookups: list[tuple[str, str, str]] = []

    def lookup(kind: str, namespace: str, name: str) -> Optional[dict[str, Any]]:
        lookups.append((kind, namespace, name))
        return OBJECTS.get((kind, name))

    assert owner_chain(_pod(owner), RUN_UID, lookup) == why
    assert len(lookups) <= 2 and all(namespace == "ns" for _, namespace, _ in lookups)


def test_a_copy_of_an_older_object_of_the_name_is_read_again():
    """A resize makes a new MPIJob of the same name: its pods push before the operator's watch shows it, while the
    copy is still the old one. The API server's answer decides, not the copy (elastic e2e: every push of the grown
    run's pods was refused, and its status stayed at the epoch of the grow)."""
    new_mpijob = _object("alpha-train", "mpi-a2", _ref("ScalingRun", "alpha", RUN_UID))
    worker = _pod(_ref("MPIJob", "alpha-train", "mpi-a2"))
    copies = lambda kind, ns, name: OBJECTS.get((kind, name))  # noqa: E731 (the old alpha-train, mpi-a)
    reads: list[str] = []

    def reread(kind: str, namespace: str, name: str) -> Optional[dict[str, Any]]:
        reads.append(name)
        return new_mpijob

    assert owner_chain(worker, RUN_UID, copies) == "its MPIJob alpha-train is gone"
    assert owner_chain(worker, RUN_UID, copies, reread) is None and reads == ["alpha-train"]
    assert owner_chain(_pod(_ref("MPIJob", "alpha-train", "mpi-a")), RUN_UID, copies, reread) is None
    assert reads == ["alpha-train"]  # a copy with the uid asked for is not read again


def test_a_controller_that_is_not_the_only_one_counts_for_nothing():
    pod = _pod(_ref("MPIJob", "alpha-train", "mpi-a"))
    pod["metadata"]["ownerReferences"].append(_ref("Job", "alpha-preprocess", "job-a"))
    assert owner_chain(pod, RUN_UID, lambda kind, ns, name: OBJECTS.get((kind, name))) is not None


def test_the_runs_the_watch_showed_are_known_by_uid_until_deleted():
    latest = LatestObjects()
    run = {"metadata": {"namespace": "ns", "name": "alpha", "uid": RUN_UID, "resourceVersion": "1"}}
    assert latest.known_runs.uid("ns", "alpha") is None
    latest.run_seen(None, run)  # kopf's listing at start-up
    assert latest.known_runs.uid("ns", "alpha") == RUN_UID and latest.known_runs.uid("other", "alpha") is None
    # Created again under the same name: the new uid; a late DELETED of the old one takes nothing away.
    latest.run_seen("ADDED", {"metadata": {**run["metadata"], "uid": "uid-alpha-2", "resourceVersion": "3"}})
    latest.run_seen("DELETED", run)
    assert latest.known_runs.uid("ns", "alpha") == "uid-alpha-2"
    latest.run_seen("DELETED", {"metadata": {**run["metadata"], "uid": "uid-alpha-2", "resourceVersion": "4"}})
    assert latest.known_runs.uid("ns", "alpha") is None and len(latest.known_runs) == 0
