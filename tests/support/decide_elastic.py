"""An elastic run's world for decide's tests (tests/unit/operator/test_decide_elastic*.py): a 4-worker run with
minReplicas 2, its MPIJob, pods and capacity probes, and what act leaves after a look."""

from __future__ import annotations

import copy
from typing import Any

from scalingrun_operator.builders import build_mpijob
from scalingrun_operator.decide import pinning
from scalingrun_operator.decide.snapshot import Create, Delete, Settings
from scalingrun_operator.schema.validation import parse_scalingrun
from tests.support.decide_pods import pod, unschedulable
from tests.support.decide_run import training
from tests.support.decide_world import NS, SPEC, World, conditions, done, merge_patched, owned, stamp, training_status

ELASTIC_SPEC = {**copy.deepcopy(SPEC), "workers": {"replicas": 4, "gpusPerWorker": 0, "minReplicas": 2,
                                                   "resizeAfter": 60}}
NO_ROOM = "0/3 nodes are available: 3 Insufficient example.com/capacity."


def elastic_run(**spec_workers: Any):
    spec = copy.deepcopy(ELASTIC_SPEC)
    spec["workers"].update(spec_workers)
    run = parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
                            "metadata": {"name": "demo", "namespace": NS}, "spec": spec})
    return run, spec


def elastic_mpijob(workers: int = 4, uid: str = "mpi-1", state: str = "Running") -> dict:
    run, _ = elastic_run()
    return owned(build_mpijob(run, NS, workers=workers), uid, status={"conditions": [done(state)]})


def worker(index: int, placed: bool = True, minutes_ago: float = 9, mpijob_uid: str = "mpi-1") -> dict:
    found = pod(f"demo-train-worker-{index}", "worker", uid=f"w{index}-{mpijob_uid}",
                phase="Running" if placed else "Pending", created=stamp(minutes_ago),
                conditions=None if placed else unschedulable(NO_ROOM),
                containers=None if placed else [])
    found["metadata"]["ownerReferences"] = [{"kind": "MPIJob", "name": "demo-train", "uid": mpijob_uid,
                                             "controller": True}]
    if placed:
        found["spec"]["nodeName"] = f"node-{index}"
    return found


def launcher(mpijob_uid: str = "mpi-1") -> dict:
    found = pod("demo-train-launcher-aaaaa", "launcher", uid=f"l-{mpijob_uid}")
    found["spec"]["nodeName"] = "node-0"
    return found


def world(unplaced: int = 2, minutes_ago: float = 2, spec_workers: dict | None = None, **changes: Any) -> World:
    _, spec = elastic_run(**(spec_workers or {}))
    pods = [launcher()] + [worker(i, placed=i < 4 - unplaced, minutes_ago=minutes_ago if i >= 4 - unplaced else 9)
                           for i in range(4)]
    found = training(spec=spec, pods=pods, status=training_status(pods=[]), **changes)
    found.children["MPIJob"] = elastic_mpijob()
    found.status[pinning.PINNED_FIELD] = pinning.pin(spec)
    found.status["training"]["processes"] = 4
    return found


def after(found: World, decision) -> World:
    """`found` as act leaves it: the status patch applied as the API server applies a merge patch, MPIJobs deleted or
    created (the MPI operator runs a new one)."""
    found.status = merge_patched(found.status, decision.status or {})
    for action in decision.actions:
        if isinstance(action, Delete) and action.found.get("kind") == "MPIJob":
            found.children.pop("MPIJob", None)
            found.pods = []
        elif isinstance(action, Create) and action.obj["kind"] == "MPIJob":
            found.children["MPIJob"] = owned(action.obj, "mpi-2", status={"conditions": [done("Created")]})
            found.status["training"]["mpiJobUid"] = "mpi-2"
    return found


def no_resize(decision) -> bool:
    """Nothing of a resize written: the size and the intent as they were (the time at the size may count)."""
    elastic = decision.desired["training"].get("elastic") or {}
    return "workers" not in elastic and not elastic.get("resizing")


def placed(decision) -> tuple[str, str, str]:
    return conditions(decision)["WorkersPlaced"]


PROBES = Settings(capacity_probe_priority_class="scalingrun-capacity-probe")


def shrunk(epoch: int = 2, probes_placed: int = 0, probes: int = 2) -> World:
    """The run after a 4 -> 2 shrink: its MPIJob at 2 workers, both placed and Running."""
    found = world(unplaced=0)
    found.children["MPIJob"] = elastic_mpijob(2)
    found.pods = [launcher(), worker(0), worker(1)]
    found.status["training"]["elastic"] = {"workers": 2, "resizes": [
        {"from": 4, "to": 2, "cause": "workersUnplaced: ...", "lostAt": stamp(9), "costSeconds": 300}]}
    found.progress = {**found.progress, "epoch": epoch}
    for index in range(probes):
        probe = pod(f"demo-capacity-{index}", "worker", created=stamp(1))
        probe["metadata"]["labels"] = {"app.kubernetes.io/component": "capacity-probe", "scalingrun.dev/run": "demo"}
        if index < probes_placed:
            probe["spec"]["nodeName"] = f"node-{index + 5}"
        else:
            probe["status"] = {"phase": "Pending", "conditions": unschedulable(NO_ROOM)}
        found.pods.append(probe)
    return found
