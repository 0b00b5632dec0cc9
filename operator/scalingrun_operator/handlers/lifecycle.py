"""The operator's own life: kopf settings and the Runtime's threads at start-up, their end at cleanup, the
liveness probe (kopf's loop, and the progress watcher's heartbeat).

There is no timer, daemon or deletion handler per run: kopf would put a finalizer on every run for one,
and a run (or its namespace) could then not be deleted while the operator is down. kopf keeps its own
bookkeeping in annotations under scalingrun.dev/, because the status schema is structural and would
prune status.kopf.
"""

from __future__ import annotations

from typing import Any

import kopf

from scalingrun_api.models import KIND, MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION, SWEEP_KIND
from ..cluster.k8s import MANAGED_SELECTOR

ANNOTATION_PREFIX = "scalingrun.dev"
CHANGE_HANDLED_KINDS = (KIND, SWEEP_KIND)  # the kinds with on.create/on.update handlers (handlers/runs.py, sweeps.py)
DIFF_BASE_METADATA = ("name", "labels", "annotations", "ownerReferences")  # what kopf's build and keys read


class ChangeHandledDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base (the last handled spec) of the kinds with change handlers only. kopf builds one for every
    event of every kind it watches, a deep copy of the whole object: for pods and Jobs, which have event handlers
    only, it is never used, and with 300 runs' pods moving it was a fifth of kopf's share of the CPU (measured).
    The status and the server's metadata (managedFields grows with every status write) are left out before the
    copy, not after: the diff base never holds them (kopf keeps labels and annotations of the metadata)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        if body.get("kind") not in CHANGE_HANDLED_KINDS:
            return None
        if not extra_fields:
            meta = body.get("metadata") or {}
            light = {k: v for k, v in body.items() if k not in ("status", "metadata")}
            light["metadata"] = {k: meta[k] for k in DIFF_BASE_METADATA if k in meta}
            body = kopf.Body(light)
        return super().build(body=body, extra_fields=extra_fields)


# What the operator creates (Jobs, MPIJobs) and the pods made from them: watched by label, server-side.
WATCHED_CHILDREN = (("v1", "pods"), ("batch", "v1", "jobs"), (MPIJOB_GROUP, MPIJOB_VERSION, MPIJOB_PLURAL))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = memo.runtime.config
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = ChangeHandledDiffBase(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"  # unused: deletion is left to GC
    settings.posting.enabled = False  # our Events are written by Kube.post_event, one per phase change
    settings.execution.max_workers = config.max_workers
    settings.peering.lifetime = config.peering_lifetime_seconds
    # Re-list now and then (no watch lives forever); a re-list reconciles only what changed (Memory).
    settings.watching.server_timeout = config.watch_timeout_seconds
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # The handlers' `labels=` filter only after the event arrived: the API server filters these watches and
    # lists itself, so the pods, Jobs and MPIJobs of everyone else in the cluster never reach the operator.
    for resource in WATCHED_CHILDREN:
        settings.watching.label_selectors[resource] = MANAGED_SELECTOR
    memo.runtime.start()


@kopf.on.cleanup()
def stop_watching(memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.stop()


@kopf.on.probe(id="watcher")
def watcher_probe(memo: kopf.Memo, **_: Any) -> str:
    """Liveness fails (HTTP 500, and the pod is restarted) when the progress watcher stopped passing or a check of
    it outlived any budget: every tenant's progress, rechecks and pending-pod diagnoses depend on it."""
    problem = memo.runtime.health()
    if problem:
        raise kopf.PermanentError(problem)
    return "passing"


@kopf.on.probe(id="runs")
def runs_probe(memo: kopf.Memo, **_: Any) -> int:
    """Liveness: kopf answers on its endpoint while its loop is alive; this adds the runs tracked."""
    return memo.runtime.metrics.tracked_runs()
