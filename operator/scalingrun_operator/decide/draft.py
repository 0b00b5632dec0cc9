"""One ScalingRun decision under way: the status being built, the actions, when to look again.

A Draft is made for one call of decide_run and dropped with it (nothing outlives the call); the
phases (preprocessing.py, training.py) write into it, and `decision()` freezes it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from scalingrun_api.models import ScalingRun, StorageCredentials
from . import children
from .snapshot import (
    MANIFEST, Child, Create, Decision, Delete, Document, Nodes, NoticedNodes, Patch, PodList, Pods, Read, Server,
    ServerVersion, Settings, Snapshot, Store,
)
from .status import CHILD_CONFLICT, READY, STORAGE_READABLE, Event, StatusUpdate, get_condition


class Draft:
    def __init__(self, snapshot: Snapshot, settings: Settings):
        self.snapshot, self.settings = snapshot, settings
        self.owner = snapshot.obj
        meta = self.owner["metadata"]
        self.namespace, self.name = meta.get("namespace") or "default", meta["name"]
        self.update = StatusUpdate(self.owner.get("status") or {}, meta.get("generation"), snapshot.now)
        self.pin: Optional[str] = None
        self.drop_pin_annotation = False
        self.actions: list[Any] = []
        self.holdup = ""  # what holds the run up (a pod problem, a child's name taken), for status.message
        self.recheck_in: Optional[float] = None
        self.follow: Optional[tuple[Document, Optional[str]]] = None
        self.again = False
        self.claims = children.Claims(self.owner, self.namespace)

    # --- facts ------------------------------------------------------------------------------------

    def need(self, ask: Any) -> Any:
        return self.snapshot.need(ask)

    def built(self, key: Any, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """A child as the run renders it, rendered once per look (`key` names it)."""
        return self.snapshot.derive(("built", key), build)

    def child(self, kind: str, name: str) -> Optional[dict[str, Any]]:
        return self.need(Child(kind, name))

    def pods(self) -> list[dict[str, Any]]:
        found: PodList = self.need(Pods())
        return list(found.items)

    def deleted_pods(self) -> dict[str, str]:
        found: PodList = self.need(Pods())
        return dict(found.deleted)

    def nodes(self, names: tuple[str, ...]) -> dict[str, Optional[dict[str, Any]]]:
        """The Nodes of `names` (sorted, so that every asker of the same set shares one read); none: no read."""
        if not names:
            return {}
        return dict(self.need(Nodes(tuple(sorted(set(names))))))

    def noticed_nodes(self) -> Mapping[str, dict[str, Any]]:
        """The Nodes with a termination taint, from the operator's Node watch (no read)."""
        return self.need(NoticedNodes())

    def server(self) -> Server:
        return self.need(ServerVersion())

    def read(self, uri: str, store: Store, what: str = MANIFEST,
             versioned: bool = False, job_uid: Optional[str] = None) -> tuple[bool, Any]:
        """(readable, the document's model or None). An unreadable store is a condition and a Warning, not a
        crash.

        `versioned`: the document is followed from the version read (the progress watcher). `job_uid`: the Job
        whose pods may leave the dataset manifest (push mode takes it from no other pod; none: from no pod)."""
        ask = Document(uri, store, what, versioned, job_uid=job_uid)
        found: Read = self.need(ask)
        existing = get_condition(self.update.desired["conditions"], STORAGE_READABLE)
        if found.error:
            if not existing or existing.get("status") != "False":
                self.update.warn("StorageUnreadable", found.error)
            every = self.settings.recheck_interval_seconds
            self.update.condition(STORAGE_READABLE, "False", found.reason,
                                  f"{found.error}; retrying every {every:g} s")
            self.recheck(every)
            return False, None
        if versioned:
            self.follow = (ask, found.version)
        if existing and existing.get("status") != "True":
            self.update.condition(STORAGE_READABLE, "True", "Readable", f"read {uri}")
        return True, found.document

    # --- time ------------------------------------------------------------------------------------

    def recheck(self, seconds: float) -> None:
        self.recheck_in = seconds if self.recheck_in is None else min(self.recheck_in, seconds)

    def within_grace(self, finished_at) -> bool:
        if finished_at is None:
            return False
        return (self.update.moment - finished_at).total_seconds() < self.settings.completion_grace_seconds

    def grace_left(self, finished_at) -> float:
        left = self.settings.completion_grace_seconds - (self.update.moment - finished_at).total_seconds()
        return max(0.5, min(self.settings.recheck_interval_seconds, left + 0.5))

    def condition_true(self, type_: str) -> bool:
        condition = get_condition(self.update.desired["conditions"], type_)
        return bool(condition and condition.get("status") == "True")

    # --- children --------------------------------------------------------------------------------

    def own(self, found: dict[str, Any], desired: dict[str, Any], extra: Optional[dict[str, Any]] = None) -> bool:
        """Whether `found`, of `desired`'s kind and name, is (or now becomes) the run's; `extra` is patched with
        the adoption. False: another object holds the name, and the run says so and waits."""
        verdict, adoption = self.claims.claim(found, desired, extra)
        if verdict == children.FOREIGN:
            self.recheck(self.settings.conflict_recheck_seconds)
            return False
        if adoption is not None:
            self.actions.append(adoption)
        elif extra:
            self.patch(found, extra)
        return True

    def ensure(self, desired: dict[str, Any], event: Optional[Event] = None,
               uid_at: Optional[tuple[str, str]] = None) -> Optional[dict[str, Any]]:
        """The child `desired`: created when absent, adopted when it may be; a ConfigMap is brought to
        `desired`'s data. Returns the object as found (None when created now, or when another holds the name:
        see `blocked`)."""
        kind, name = desired["kind"], desired["metadata"]["name"]
        found = self.child(kind, name)
        if found is None:
            self.claims.free(kind, name)
            self.actions.append(Create(desired, event, uid_at))
            return None
        extra = children.data_patch(found, desired) if kind == "ConfigMap" else None
        self.own(found, desired, extra)
        return found

    @property
    def blocked(self) -> bool:
        """Another object holds a child's name: nothing that depends on that child happens now."""
        return self.claims.conflict is not None

    def patch(self, found: dict[str, Any], patch: dict[str, Any], event: Optional[Event] = None) -> None:
        """A patch of a child the run controls. One being adopted in this decision is patched on the next look
        (the adoption moves its resourceVersion)."""
        meta = found["metadata"]
        if (found.get("kind"), meta.get("name")) in self.claims.adopting:
            self.again = True
            return
        self.actions.append(Patch(found, patch, event))

    def delete_pod(self, pod: dict[str, Any], grace_seconds: Optional[int], event: Optional[Event] = None) -> None:
        """Deletes one of the run's training pods (a lost or stalled one): the MPI operator makes it anew. Once per
        look: a pod two rules delete is deleted by the first."""
        if any(isinstance(action, Delete) and action.found is pod for action in self.actions):
            return
        self.actions.append(Delete(pod, grace_seconds, event))

    def create(self, desired: dict[str, Any]) -> None:
        """Creates an object no other look reads back by name (an elastic run's capacity probe, found among the
        run's pods): a 409 when it exists after all makes the next look."""
        self.actions.append(Create(desired))

    def delete_child(self, found: dict[str, Any], event: Optional[Event] = None) -> None:
        """Deletes a child the run controls (an elastic run's MPIJob, to start it again at another size)."""
        self.actions.append(Delete(found, None, event))

    # --- the decision ------------------------------------------------------------------------------

    def decision(self) -> Decision:
        conflict = self.claims.settle(self.update, "the run's children are its own")
        if conflict:
            self.holdup = self.holdup or f"{CHILD_CONFLICT}: {conflict}"
        ready = get_condition(self.update.desired["conditions"], READY)
        message = self.holdup or (ready or {}).get("message")
        if message:
            self.update.desired["message"] = message
        return Decision(phase=self.update.phase, pin=self.pin, drop_pin_annotation=self.drop_pin_annotation,
                        actions=tuple(self.actions),
                        status=self.update.patch(), desired=self.update.desired, events=tuple(self.update.events),
                        recheck_in=self.recheck_in, follow=self.follow, again=self.again)


def store_of(run: ScalingRun) -> Store:
    """Where the run's documents are read, with its Secret only when s3:// needs it (none with podIdentity: the
    operator's own identity reads them)."""
    s = run.spec.storage
    read = (run.spec.dataset.output, run.spec.training.checkpoint.location)
    s3 = any(uri and uri.startswith("s3://") for uri in read)
    return Store(s.endpoint, s.region, s.credentials_secret if s3 else None, s.access_key_id_key,
                 s.secret_access_key_key, pod_identity=s3 and s.credentials == StorageCredentials.pod_identity.value)
