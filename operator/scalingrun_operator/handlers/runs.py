"""kopf handlers of ScalingRuns and of what a run is made of: every trigger runs the same reconcile.

What a handler saw last does not matter: the reconcile (cluster/reconcile.py) reads the world again.
What no event announces (object storage) is watched by one operator-wide thread (cluster/reconcile_scheduler.py).
"""

from __future__ import annotations

from typing import Any, Optional

import kopf

from scalingrun_api.models import GROUP, KIND, MANAGED_BY, MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION, PLURAL, VERSION
from ..builders.common import RUN_LABEL
from ..decide.children import controller_name

MANAGED = MANAGED_BY


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
def run_created(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.reconcile_run(namespace, name, "create")


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def spec_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.reconcile_run(namespace, name, "update")


# track and pod_changed are coroutines: they only note what came and never wait for a reconcile, so kopf runs them
# in its loop instead of handing each of thousands of events to a worker thread and back.
@kopf.on.event(GROUP, VERSION, PLURAL)
async def track(type: Optional[str], body: kopf.Body, uid: str, namespace: str, name: str, status: dict[str, Any],
                memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.latest.run_seen(type, dict(body))  # what the next reconcile starts from, not a GET
    deleted = type == "DELETED"
    memo.runtime.metrics.observe_run(uid, status.get("phase"), deleted=deleted, body=dict(body))
    if deleted:
        memo.runtime.forget_run(namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
@kopf.on.event(MPIJOB_GROUP, MPIJOB_VERSION, MPIJOB_PLURAL, labels=MANAGED)
def child_changed(type: Optional[str], body: kopf.Body, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """A child's status moved (Job complete, MPIJob failed) or it was deleted: reconcile its run now.

    A deleted child is found by the reconcile itself (status records it), so one deleted while the operator
    was down counts too."""
    child = dict(body)
    memo.runtime.latest.child_seen(type, child)  # before the trigger: the reconcile reads it
    owner = controller_name(child, KIND)
    if owner and memo.runtime.memory.child_event_matters(type, child):
        memo.runtime.reconcile_run(namespace, owner, "child")


@kopf.on.event("v1", "pods", labels=MANAGED)
async def pod_changed(type: Optional[str], body: kopf.Body, namespace: str, labels: kopf.Labels,
                      memo: kopf.Memo, **_: Any) -> None:
    """A run's pod cannot pull its image, cannot be scheduled, restarted or is gone: say so in seconds.

    A thousand workers starting make thousands of events: at most one reconcile of the run a second, which
    reads the pods from the index this keeps (cluster/pod_index.py), not from a list."""
    run = labels.get(RUN_LABEL)
    if not run:
        return
    pod = dict(body)
    memo.runtime.pods.observe(type, pod)  # before the trigger: the reconcile reads it
    if memo.runtime.memory.pod_event_matters(type, pod):
        memo.runtime.reconcile_run(namespace, run, "pod", urgent=False)  # never here: after the burst settled


@kopf.on.event("v1", "nodes")
async def node_changed(type: Optional[str], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A node got a cloud's termination taint (GKE, AWS NTH): the runs with pods on it look now, and delete those
    pods gracefully (decide/faults.py: terminating_nodes). Other Node events only keep the index current."""
    node = dict(body)
    if memo.runtime.notices.observe(type, node):
        for namespace, run in memo.runtime.pods.runs_on(node["metadata"]["name"]):
            memo.runtime.reconcile_run(namespace, run, "node", urgent=False)  # never here: in the trigger pool
