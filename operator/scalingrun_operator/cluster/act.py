"""act: applies a Decision to the cluster, and nothing else: the pinned spec, children created or patched,
the status, Events.

Order matters for what a crash in between leaves behind: the pin first, in status (the rest of the status is
written with the resourceVersion it returns), children next (an Event that explains a child goes out with it), the status
after them (a conflict there re-runs the whole look, which finds the children made), and the status's
Events last: at most once, since posting them first would repeat them on a retry.

Every patch of a child goes through `patch_child`, which refuses an object the owner does not control
(or, for an adoption, one with a controller or without the owner's labels) and patches only the
resourceVersion it checked.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import logging
import time
from typing import Any, Callable, Iterator, Optional

import kopf
from kubernetes.client.rest import ApiException

from ..decide import children, pinning
from ..decide.snapshot import Create, Decision, Delete, Patch
from ..decide.status import parse_time
from .api_answers import namespace_terminating
from .k8s import Kube
from .metrics import Metrics

log = logging.getLogger(__name__)


class NotControlled(RuntimeError):
    """A patch was about to reach an object its owner does not control; it was not sent."""


def apply(kube: Kube, metrics: Metrics, owner: dict[str, Any], decision: Decision, now: dt.datetime,
          patch_status: Callable[..., Any]) -> None:
    """Applies `decision` about `owner` (a ScalingRun or ScalingSweep); `patch_status(namespace, name, patch,
    resource_version=)` writes its status. ApiException (a 409 above all) propagates: the caller looks again."""
    meta = owner["metadata"]
    namespace, name, version = meta["namespace"], meta["name"], meta.get("resourceVersion")
    if decision.drop_pin_annotation:
        patched = kube.patch_run_annotations(namespace, name, {pinning.PINNED_ANNOTATION: None},
                                             resource_version=version)
        version = patched["metadata"]["resourceVersion"]
    if decision.pin is not None:  # before any child is made from it
        with _pushing(metrics, "status"):
            patched = patch_status(namespace, name, {pinning.PINNED_FIELD: decision.pin}, resource_version=version)
        version = patched["metadata"]["resourceVersion"]
    status = copy.deepcopy(decision.status) if decision.status else None
    for action in decision.actions:
        with _pushing(metrics, "child"):
            if isinstance(action, Create):
                created = create_child(kube, metrics, owner, action.obj, now)
                if action.uid_at:
                    section, key = action.uid_at
                    status = status or {}
                    status[section] = {**(status.get(section) or {}), key: created["metadata"]["uid"]}
            elif isinstance(action, Delete) and action.found.get("kind") == "MPIJob":
                delete_mpijob(kube, owner, action)
            elif isinstance(action, Delete):
                delete_pod(kube, owner, action)
            else:
                patch_child(kube, owner, action)
        if action.event is not None:
            # With the change itself: if the status patch below conflicts, the next look finds the change made
            # and would never say why.
            _post(kube, metrics, owner, action.event)
    if status:
        with _pushing(metrics, "status"):
            patch_status(namespace, name, status, resource_version=version)
    for event in decision.events:
        _post(kube, metrics, owner, event)


def create_child(kube: Kube, metrics: Metrics, owner: dict[str, Any], obj: dict[str, Any],
                 now: dt.datetime) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    kopf.adopt(obj, owner=owner)
    started = time.monotonic()
    created = kube.create(obj)
    metrics.child_create_seconds.labels(kind=obj["kind"]).observe(time.monotonic() - started)
    born = parse_time(owner["metadata"].get("creationTimestamp"))
    if born:
        metrics.run_to_child_seconds.labels(kind=obj["kind"]).observe(max(0.0, (now - born).total_seconds()))
    log.info("created %s %s/%s", obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
    return created


def patch_child(kube: Kube, owner: dict[str, Any], action: Patch) -> Optional[dict[str, Any]]:
    """The one way a child is patched: only one its owner controls (or may adopt), at the version checked."""
    found, meta = action.found, action.found["metadata"]
    kind, name = found.get("kind") or "", meta["name"]
    namespace = meta.get("namespace") or owner["metadata"]["namespace"]
    why = children.refusal(found, owner["metadata"].get("uid"), action.adopt, action.labels)
    if why:
        raise NotControlled(f"{kind} {namespace}/{name} {why}; not patched")
    body = {**action.patch, "metadata": {**(action.patch.get("metadata") or {}),
                                         "resourceVersion": meta.get("resourceVersion")}}
    patched = kube.patch(kind, namespace, name, body)
    log.info("%s %s %s/%s", "adopted" if action.adopt else "patched", kind, namespace, name)
    return patched


def delete_pod(kube: Kube, owner: dict[str, Any], action: Delete) -> None:
    """Deletes one of the run's training pods (it carries the run's label: decide found it by that), the uid it saw."""
    meta = action.found["metadata"]
    namespace = meta.get("namespace") or owner["metadata"]["namespace"]
    deleted = kube.delete_pod(namespace, meta["name"], meta.get("uid", ""), action.grace_seconds)
    log.info("%s pod %s/%s%s", "deleted" if deleted else "found gone", namespace, meta["name"],
             " (grace 0)" if action.grace_seconds == 0 else "")


def delete_mpijob(kube: Kube, owner: dict[str, Any], action: Delete) -> None:
    """Deletes the run's MPIJob (an elastic run's resize), only one the run controls and only the uid decide saw."""
    found, meta = action.found, action.found["metadata"]
    namespace = meta.get("namespace") or owner["metadata"]["namespace"]
    why = children.refusal(found, owner["metadata"].get("uid"), False, {})
    if why:
        raise NotControlled(f"MPIJob {namespace}/{meta['name']} {why}; not deleted")
    deleted = kube.delete_mpijob(namespace, meta["name"], meta.get("uid", ""))
    log.info("%s MPIJob %s/%s", "deleted" if deleted else "found gone", namespace, meta["name"])


@contextlib.contextmanager
def _pushing(metrics: Metrics, what: str) -> Iterator[None]:
    """Counts a write the API server refused (scalingrun_push_errors_total); a conflict (409) is the routine
    "look again", and a namespace being deleted takes the run with it: neither is an error."""
    try:
        yield
    except ApiException as exc:
        if exc.status != 409 and not namespace_terminating(exc):
            metrics.push_errors.labels(what=what).inc()
        raise


def _post(kube: Kube, metrics: Metrics, owner: dict[str, Any], event) -> None:
    if not kube.post_event(owner, event.type, event.reason, event.message):
        metrics.push_errors.labels(what="event").inc()
    metrics.events.labels(type=event.type, reason=event.reason).inc()
    log.info("%s/%s: %s %s", owner["metadata"]["namespace"], owner["metadata"]["name"], event.reason, event.message)
