"""One reconcile of one ScalingRun or ScalingSweep: observe -> decide -> act.

Level-triggered on purpose: every trigger (create, resume, spec change, a child's or pod's event, a
changed progress document, a recheck) runs the same look at the object, its children and its storage
documents as they are now. An operator killed at any point therefore converges on restart: children
are created only if absent, the phase is derived from what the children report, and status is written
with the resourceVersion it was computed from; a conflict (409) anywhere reads again and decides again.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from kubernetes.client.rest import ApiException

from .. import clock
from ..config import Config
from ..decide.run import decide_run, derived_signature
from ..decide.snapshot import Decision, Settings, Snapshot, look
from ..decide.sweep import decide_sweep
from ..document_source import DocumentSources, PushedSources
from . import act
from .api_answers import namespace_terminating
from .k8s import Kube
from .latest import LatestObjects
from .memory import Memory
from .metrics import Metrics
from .observe import Observer
from .node_notices import NodeNotices
from .pod_index import PodIndex
from ..pushed import PushedDocuments
from .reconcile_scheduler import ReconcileScheduler

log = logging.getLogger(__name__)

ATTEMPTS = 4  # looks at one object per trigger when conflicts keep coming
DERIVED_KEPT = 1024  # runs whose parsed spec and rendered children are kept between looks (~30 KiB each)


def document_sources(config: Config, kube: Kube, latest: Optional[LatestObjects] = None,
                     pushed: Optional[PushedDocuments] = None) -> DocumentSources:
    """The one place the operator chooses where documents come from: the runs' pods (push, the default), or their
    stores (pull mode, deprecated: Config.pull_documents), with the keys of their Secrets, kept by `latest`."""
    if not config.reads_storage:
        return PushedSources(pushed)
    from ..pull.secret_keys import SecretKeys  # pull mode only: the push path loads no storage client
    from ..pull.store_source import StoreSources

    return StoreSources(SecretKeys(kube.core), config, latest.credentials if latest else None)


def settings_of(config: Config, started: Optional[dt.datetime] = None) -> Settings:
    return Settings(completion_grace_seconds=config.completion_grace_seconds,
                    recheck_interval_seconds=config.recheck_interval_seconds,
                    allowed_storage_endpoints=config.allowed_storage_endpoints,
                    endpoint_policy=config.endpoint_policy(), trainer_images=config.trainer_images,
                    trainer_image_digests=tuple(config.trainer_image_digest_map().items()),
                    gpu_tolerations=config.gpu_tolerations, allow_host_path=config.allow_host_path,
                    mpijob_unserved_seconds=config.mpijob_unserved_seconds or None,
                    reads_storage=config.reads_storage,
                    pushes_since=None if config.reads_storage else started,
                    capacity_probe_priority_class=config.capacity_probe_priority_class or None,
                    max_capacity_probes=config.max_capacity_probes)


@dataclass
class _Reconciler:
    kube: Kube
    config: Config
    watcher: Optional[ReconcileScheduler] = None  # follows documents and rechecks; none in tools
    memory: Memory = field(default_factory=Memory)
    metrics: Metrics = field(default_factory=Metrics)
    pods: Optional[PodIndex] = None  # the pod watch's index (Runtime); None: a look lists the run's pods
    latest: Optional[LatestObjects] = None  # copies from the watches (Runtime); None: a look reads them anew
    pushed: Optional[PushedDocuments] = None  # documents the runs' pods pushed (Runtime); None: storage only
    notices: Optional[NodeNotices] = None  # the Node watch's tainted Nodes (Runtime); None: no notices seen
    started: dt.datetime = field(default_factory=clock.now)  # since when it takes pushes (Settings.pushes_since)
    documents: Optional[DocumentSources] = None  # None: as the config chooses (document_sources), one per reconciler

    kind = ""

    def __post_init__(self) -> None:
        if self.documents is None:
            self.documents = document_sources(self.config, self.kube, self.latest, self.pushed)

    def _get(self, namespace: str, name: str, fresh: bool) -> Optional[dict[str, Any]]:
        """The object; with `fresh`, as the API server has it now (not a copy: a write of the last look conflicted)."""
        raise NotImplementedError

    def _distrust(self, namespace: str, name: str) -> None:
        """A look failed: the next one reads the object anew."""

    def _derived_for(self, namespace: str, name: str, body: dict[str, Any]) -> dict[Any, Any]:
        """Where the look keeps what decide derives from the object: a fresh dict (sweeps), or the last look's."""
        return {}

    def _decide(self, snapshot: Snapshot, settings: Settings) -> Decision:
        raise NotImplementedError

    def _patch_status(self) -> Callable[..., Any]:
        raise NotImplementedError

    def _followed(self, namespace: str, name: str, decision: Optional[Decision],
                  observer: Optional[Observer]) -> None:
        """What the object waits on that no Kubernetes event will announce (runs only)."""

    def __call__(self, namespace: str, name: str) -> Optional[str]:
        """Reconciles one object; returns its phase (None when it is gone)."""
        with self.memory.lock((self.kind, namespace, name)):
            attempt = passes = 0
            while attempt < ATTEMPTS:
                body = self._get(namespace, name, fresh=attempt > 0)
                if body is None or body["metadata"].get("deletionTimestamp"):
                    self._followed(namespace, name, None, None)
                    return None
                # After a conflict no copy either: a child's may lag behind the write it conflicted with.
                copies = attempt == 0
                observer = Observer(self.kube, self.memory, self.documents.for_look(namespace, name, copies),
                                    namespace, name, self.pods, self.latest if copies else None, self.notices)
                moment = clock.now()
                snapshot = Snapshot(body, moment, derived=self._derived_for(namespace, name, body))
                try:
                    decision = look(snapshot, self._decide, observer.read, settings_of(self.config, self.started))
                    act.apply(self.kube, self.metrics, body, decision, moment, self._patch_status())
                except ApiException as exc:
                    self.metrics.api_errors.labels(code=str(exc.status or 0)).inc()
                    # 409: the object or a child moved on since it was read; 404: it or a child is gone (a copy may
                    # still show a run deleted since). Either way, look again from what the API server has now.
                    if exc.status in (404, 409) and attempt < ATTEMPTS - 1:
                        log.debug("%s/%s changed while reconciling (HTTP %s); again", namespace, name, exc.status)
                        attempt += 1
                        continue
                    self._distrust(namespace, name)
                    if namespace_terminating(exc):
                        return None  # the namespace is going away, and the object with it
                    raise
                except Exception:
                    self._distrust(namespace, name)
                    raise
                self._followed(namespace, name, decision, observer)
                if decision.again and passes < 2:
                    passes += 1  # a deleted child was counted (and that written): now make it anew
                    continue
                return decision.phase
        return None


@dataclass
class Reconciler(_Reconciler):
    """ScalingRuns; `watcher` follows their progress documents and looks again when they wait."""

    kind = "run"
    _derived: dict[tuple[str, str], tuple[Any, dict[Any, Any]]] = field(default_factory=dict, init=False, repr=False)
    _derived_guard: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def _get(self, namespace: str, name: str, fresh: bool) -> Optional[dict[str, Any]]:
        if self.latest is not None and not fresh:
            copy = self.latest.runs.get((namespace, name))
            if copy is not None:
                return copy
        found = self.kube.get_run(namespace, name)
        if self.latest is not None and found is not None:
            self.latest.run_seen(None, found)  # the next look starts from it, however long no event came
        return found

    def _distrust(self, namespace: str, name: str) -> None:
        if self.latest is not None:
            self.latest.runs.forget((namespace, name))

    def _derived_for(self, namespace: str, name: str, body: dict[str, Any]) -> dict[Any, Any]:
        # The parsed spec and the rendered children, kept from the last look while the run's signature holds: a
        # third of decide's CPU was parsing the same spec again (300 runs' pods moving, measured).
        signature = derived_signature(body)
        with self._derived_guard:
            kept = self._derived.pop((namespace, name), None)
            if kept is None or kept[0] != signature:
                kept = (signature, {})
            self._derived[(namespace, name)] = kept  # the most recent last: the least recent go first
            while len(self._derived) > DERIVED_KEPT:
                del self._derived[next(iter(self._derived))]
            return kept[1]

    def forget(self, namespace: str, name: str) -> None:
        """The run is gone: what was derived from it goes too."""
        with self._derived_guard:
            self._derived.pop((namespace, name), None)

    def _decide(self, snapshot: Snapshot, settings: Settings) -> Decision:
        return decide_run(snapshot, settings)

    def _patch_status(self) -> Callable[..., Any]:
        if self.latest is None:
            return self.kube.patch_run_status
        latest = self.latest

        def patch_and_keep(*args: Any, **kwargs: Any) -> Any:
            written = self.kube.patch_run_status(*args, **kwargs)
            latest.run_seen(None, written)  # the run as it is now: the next look starts from it
            return written

        return patch_and_keep

    def _followed(self, namespace: str, name: str, decision: Optional[Decision],
                  observer: Optional[Observer]) -> None:
        if self.watcher is None:
            return
        if decision is None or observer is None:
            self.watcher.forget(namespace, name)
            return
        followed = observer.documents.followed(decision.follow[0]) if decision.follow is not None else None
        if followed is not None:  # pull mode: the watch checks the store; pushes make their own reconciles
            self.watcher.watch(namespace, name, followed, decision.follow[1])
        else:
            self.watcher.unwatch(namespace, name)
        if decision.recheck_in is not None:
            self.watcher.schedule_recheck(namespace, name, decision.recheck_in)


@dataclass
class SweepReconciler(_Reconciler):
    """ScalingSweeps: no finalizer, timer or daemon; the events of their points move them on, and `watcher` (one
    of their own: it calls this reconciler) looks again when a point's name is taken."""

    kind = "sweep"

    def _get(self, namespace: str, name: str, fresh: bool) -> Optional[dict[str, Any]]:
        return self.kube.get_sweep(namespace, name)

    def _decide(self, snapshot: Snapshot, settings: Settings) -> Decision:
        return decide_sweep(snapshot, settings)

    def _patch_status(self) -> Callable[..., Any]:
        return self.kube.patch_sweep_status

    def _followed(self, namespace: str, name: str, decision: Optional[Decision],
                  observer: Optional[Observer]) -> None:
        if self.watcher is not None and decision is not None and decision.recheck_in is not None:
            self.watcher.schedule_recheck(namespace, name, decision.recheck_in)
