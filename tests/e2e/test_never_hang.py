"""Never hang (issue 29), on the node cluster's real kubelet: a frozen worker and a lost node, in one run.

- A frozen worker: after the first checkpoint, worker 1's containers are paused (`docker pause`: its process is
  alive and silent, as a hung GPU's would be, and its pod reads Running 1/1). No heartbeat for
  spec.training.stallTimeout -> `Stalled`; the operator deletes the workers and the launcher, the run resumes
  from its checkpoint.
- A lost node: the kubelet stops and the run's containers on the node are paused (the machine is gone); the node
  is `Unknown` 40 s later (the controller manager's grace) and spec.training.nodeLossGracePeriod after that
  -> `NodeLost` naming the node, its pods force-deleted; their replacements wait (the node is tainted
  unreachable) until the kubelet starts again, after the "reboot" killed what it lost. The run resumes and
  Succeeds, the interruption counted as nodeLost, not against backoffLimit. This part runs with the default
  stallTimeout (auto, 10 min): with part one's 60 s, shorter than the node's 40 s plus the grace, the silence
  would be taken as a stall first (and counted as one), which is not what this part checks.

Only the node cluster (scripts/e2e.sh exports SCALINGRUN_E2E_NODE_DIR) can stop its kubelet and pause containers.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.support.env import require
from tests.support.node_faults import freeze, kill, kubelet
from tests.support.e2e_runs import (
    RESUMED, _name, condition_texts, finished, launcher_log, phase, resumed_epochs, run_body, wait_for_launcher_line,
)

pytestmark = [pytest.mark.e2e, pytest.mark.k8s]

STALL_TIMEOUT = 60
NODE_LOSS_GRACE = 20
# Epochs: two before the freeze, two after the first resume, and room for those that pass while the test stops
# the kubelet and pauses the containers, and after the second resume. The faults are timed from the launcher's
# log, not from status: status follows progress.json at the operator's next poll (15 s), and on a busy node a run
# was at epoch 12 of 20 in status when the test froze its worker, and had finished before the node was lost.
EPOCHS = 14


def node_cluster() -> Path:
    node_dir = os.environ.get("SCALINGRUN_E2E_NODE_DIR", "")
    require(bool(node_dir) and (Path(node_dir) / "cluster.sh").is_file(),
            "the frozen worker and the lost node need the node cluster (SCALINGRUN_E2E_NODE_DIR: scripts/e2e.sh "
            "sets it when it starts ../shared/node), whose kubelet and containers the test stops")
    return Path(node_dir)


def condition(run: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def training_status(run: dict[str, Any]) -> dict[str, Any]:
    return (run.get("status") or {}).get("training") or {}


def interruptions(run: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in (training_status(run).get("interruptions") or {}).items() if v}


def not_failed(run: dict[str, Any]) -> None:
    if phase(run) == "Failed":
        pytest.fail(f"{run['metadata']['name']} failed:\n{condition_texts(run)}")


def resumed_epoch_done(run: dict[str, Any], after: Optional[int]) -> bool:
    """A new attempt, resumed from a checkpoint later than `after`, finished an epoch."""
    training = training_status(run)
    resumed = training.get("resumedFromEpoch")
    return resumed is not None and (after is None or resumed > after) and (training.get("epoch") or 0) > resumed


def resumed_in_log(cluster, name: str) -> int:
    """The checkpoint epoch the launcher's current attempt resumed from."""
    return resumed_epochs(launcher_log(cluster, name))


def node_ready(cluster, node: str) -> str:
    conditions = cluster.core().read_node(node).status.conditions or []
    return next((c.status for c in conditions if c.type == "Ready"), "")


def training_pods(cluster, name: str) -> list[Any]:
    return [p for p in cluster.run_pods(name)
            if (p.metadata.labels or {}).get("training.kubeflow.org/job-role") in ("launcher", "worker")
            and p.metadata.deletion_timestamp is None and p.status.phase in ("Pending", "Running")]


def test_a_frozen_worker_and_a_lost_node_each_end_in_a_resumed_run(cluster):
    node_dir = node_cluster()
    name = _name("neverhang")
    body = run_body(cluster, name, output=f"s3://scalingrun-e2e/runs/{name}/parquet", epochs=EPOCHS,
                    patience=EPOCHS)
    body["spec"]["training"].update(stallTimeout=STALL_TIMEOUT, nodeLossGracePeriod=NODE_LOSS_GRACE)
    cluster.create_run(body)
    applied = time.monotonic()
    frozen: list[str] = []
    paused_for_good: list[str] = []
    kubelet_stopped = False
    seen: dict[str, float] = {}

    def watch(run: dict[str, Any]) -> None:
        """Records when each fault's condition was first seen True (a poll may come after it turned False)."""
        not_failed(run)
        for kind in ("Stalled", "NodeLost"):
            if condition(run, kind).get("status") == "True" and kind not in seen:
                seen[kind] = time.monotonic()
                seen[f"{kind}-message"] = condition(run, kind).get("message")  # type: ignore[assignment]

    try:
        # --- a frozen worker, after the first checkpoint (epoch 2 is recorded once epoch 1's is committed)
        wait_for_launcher_line(cluster, name, f"epoch 2/{EPOCHS}:", timeout=480)
        worker = cluster.core().read_namespaced_pod(f"{name}-train-worker-1", cluster.namespace)
        frozen = freeze([worker])
        at_freeze = time.monotonic()
        print(f"\napply -> epoch 2 (the freeze): {at_freeze - applied:.0f} s")
        run = cluster.get_run(name)
        watch(run)
        assert not interruptions(run), "a healthy attempt was interrupted"
        epoch_at_freeze = training_status(run).get("epoch")
        cluster.wait(name, lambda r: "Stalled" in seen, timeout=STALL_TIMEOUT + 180, what="Stalled", each=watch,
                     every=1)
        stalled_after = seen["Stalled"] - at_freeze
        message = str(seen["Stalled-message"])
        assert "no heartbeat for" in message and f"stallTimeout ({STALL_TIMEOUT}" in message, message
        assert f"{name}-train-worker-1" in message, message  # deleted for the restart: named
        wait_for_launcher_line(cluster, name, f"/{EPOCHS}:", timeout=480, after=RESUMED)
        first_resume = resumed_in_log(cluster, name)
        back_after = time.monotonic() - at_freeze
        print(f"frozen worker at epoch {epoch_at_freeze} in status: Stalled {stalled_after:.0f} s after the freeze "
              f"(stallTimeout {STALL_TIMEOUT} s), resumed from epoch {first_resume}, its first epoch done "
              f"{back_after:.0f} s after the freeze")
        assert first_resume >= 1, launcher_log(cluster, name)[-3000:]
        paused_for_good, frozen = frozen, []  # killed at the end if the kubelet could not

        # --- a lost node: the kubelet stops and the machine dies with it, once the resumed attempt committed a
        # checkpoint of its own (its second epoch recorded), so that the next resume is seen to be a later one
        wait_for_launcher_line(cluster, name, f"epoch {first_resume + 2}/{EPOCHS}:", timeout=300, after=RESUMED)
        # Stalled, and nothing else (counted when the attempt was restarted). A paused container cannot take the
        # kubelet's SIGKILL (a hung process could), so while it lingers the next attempt may stall on it too:
        # counted again, as stalled.
        run = cluster.get_run(name)
        watch(run)
        assert set(interruptions(run)) == {"stalled"}, interruptions(run)
        node = worker.spec.node_name
        pods = training_pods(cluster, name)
        assert len(pods) == 3 and {p.spec.node_name for p in pods} == {node}, \
            [(p.metadata.name, p.spec.node_name) for p in pods]
        cluster.custom().patch_namespaced_custom_object(  # the default, as most runs have it (docstring)
            "scalingrun.dev", "v1alpha1", cluster.namespace, "scalingruns", name,
            {"spec": {"training": {"stallTimeout": "auto"}}})
        kubelet(node_dir, "kubelet-stop")
        kubelet_stopped, at_stop = True, time.monotonic()
        frozen = freeze(pods)
        lost_uids = {p.metadata.uid for p in pods}
        # Status shows the resumed attempt at the operator's next poll of its progress.json (the operator's pod is
        # not paused; a lingering frozen container may have stalled one more attempt, resumed later still).
        cluster.wait(name, lambda r: resumed_epoch_done(r, first_resume - 1), timeout=120,
                     what=f"status resumed from epoch {first_resume} or later", each=watch, every=1)
        deadline = at_stop + 180
        while node_ready(cluster, node) == "True":
            assert time.monotonic() < deadline, f"node {node} still Ready 180 s after its kubelet stopped"
            time.sleep(1)
        unknown_after = time.monotonic() - at_stop
        run = cluster.wait(name, lambda r: "NodeLost" in seen, timeout=NODE_LOSS_GRACE + 120, what="NodeLost",
                           each=watch, every=1)
        lost_after = seen["NodeLost"] - at_stop
        message = str(seen["NodeLost-message"])
        # It names a pod of the stopped node: a worker past the grace, or the launcher, whose deletion by a stall
        # restart on the way (a frozen container lingering) may end its grace period first.
        assert f"on node {node} lost" in message and re.search(rf"{name}-train-(launcher-[a-z0-9]+|worker-\d+) ",
                                                               message), message
        assert "force-deleted" in message, message
        deadline = time.monotonic() + 120
        while True:  # the lost pods gone, their replacements made and waiting for a node
            now = cluster.run_pods(name)
            waiting = [p for p in now if p.metadata.uid not in lost_uids and p.status.phase == "Pending"
                       and (p.metadata.labels or {}).get("training.kubeflow.org/job-role") == "worker"]
            if not {p.metadata.uid for p in now} & lost_uids and len(waiting) == 2:
                break
            assert time.monotonic() < deadline, [(p.metadata.name, p.status.phase) for p in now]
            time.sleep(1)
        # The node comes back once the operator gave up on it and the replacements wait for it: a longer absence
        # only holds them Pending longer.
        kill(frozen)  # the reboot
        frozen = []
        absent = time.monotonic() - at_stop
        kubelet(node_dir, "kubelet-start")
        kubelet_stopped, at_start = False, time.monotonic()
        run = cluster.wait(name, lambda r: resumed_epoch_done(r, first_resume), timeout=480,
                           what="training again after the node's return", each=watch, every=1)
        second_resume = training_status(run)["resumedFromEpoch"]
        trained_after = time.monotonic() - at_start
        print(f"lost node {node}: Unknown {unknown_after:.0f} s after the kubelet stopped, NodeLost {lost_after:.0f} s "
              f"after (nodeLossGracePeriod {NODE_LOSS_GRACE} s); kubelet started again after {absent:.0f} s; resumed "
              f"from epoch {second_resume}, its first epoch done {trained_after:.0f} s after the kubelet's start")
        run = cluster.wait(name, finished, timeout=900, what="Succeeded after its faults", each=watch)
        print(f"apply -> Succeeded: {time.monotonic() - applied:.0f} s")
        training = training_status(run)
        assert training["epoch"] == EPOCHS, training
        # Interruptions by cause, none counted against backoffLimit (launcherFailed, workerFailed).
        assert set(interruptions(run)) == {"stalled", "nodeLost"}, interruptions(run)
        assert training["restarts"] >= 2, training
        warnings = [(e.reason, e.message) for e in cluster.events(name) if e.type == "Warning"]
        assert any(r == "Stalled" for r, _ in warnings) and any(r == "NodeLost" and node in m for r, m in warnings), \
            warnings
    finally:
        kill(frozen + paused_for_good)
        if kubelet_stopped:
            kubelet(node_dir, "kubelet-start")
        cluster.delete_run(name)
