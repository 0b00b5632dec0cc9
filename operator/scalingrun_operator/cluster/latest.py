"""The newest copy of what a reconcile reads most, so that it need not ask the API server again: each run's body
and each run's Job and MPIJob, from their watch events and the answers to the operator's own writes, and each
store's keys from its Secret; and every known run's uid (KnownRuns), which does not age.

With 300 runs' pods moving, a reconcile read its run, its MPIJob and its Secret anew every time: three of its six
API requests. A copy stands in for a read for at most `max_age` seconds after the API server last showed it (an
event, the answer to a write, a read): a DELETED event lost in a watch gap (kopf's re-list reports none) or a
Secret rotated costs at most that long. A copy older than one already held is never taken (resourceVersions
compared as the numbers etcd makes them; a deleted object leaves its last version behind, so that the answer to
a write that raced its deletion is not taken for it), and a reconcile whose write conflicts reads the run and its
children anew.
Level-triggered reconciles keep this safe: every change of a run or child is an event that updates the copy
before it triggers the reconcile that reads it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional

# The child kinds whose watch (handlers.runs.child_changed) keeps a copy current; a ConfigMap is not watched, and a
# copy of one would hide its deletion or an edit for max_age.
WATCHED_CHILD_KINDS = frozenset({"Job", "MPIJob"})
RUN_MAX_AGE_SECONDS = 60.0
CHILD_MAX_AGE_SECONDS = 60.0
CREDENTIALS_MAX_AGE_SECONDS = 30.0  # a rotated key is used within this long


def _newer_or_same(version: Optional[str], held: Optional[str]) -> bool:
    if version and held and version.isdigit() and held.isdigit():
        return int(version) >= int(held)
    return True  # not comparable: the newest to arrive wins


@dataclass
class _Copy:
    value: Any  # None: deleted at `version`
    version: Optional[str]
    shown: float  # when the API server last showed it (clock seconds)


class Latest:
    """Copies by key, each good for `max_age` seconds after it was last shown."""

    def __init__(self, max_age: float, clock: Callable[[], float] = time.monotonic):
        self.max_age, self._clock = max_age, clock
        self._guard = threading.Lock()
        self._copies: dict[Hashable, _Copy] = {}
        self._stores = 0

    def seen(self, key: Hashable, value: Any, version: Optional[str] = None) -> None:
        """The API server showed `value` at `version` (a resourceVersion; None: not comparable) just now."""
        now = self._clock()
        with self._guard:
            held = self._copies.get(key)
            if held is not None and not _newer_or_same(version, held.version):
                return  # a watch event that lags behind the answer to a write
            self._copies[key] = _Copy(value, version, now)
            self._stores += 1
            if self._stores % 1024 == 0:  # copies nobody asks for again (a run's last Secret) go too
                self._copies = {k: c for k, c in self._copies.items() if now - c.shown <= self.max_age}

    def gone(self, key: Hashable, version: Optional[str]) -> None:
        """The object was deleted at `version`: no copy, and none older than that is taken afterwards."""
        self.seen(key, None, version)

    def get(self, key: Hashable) -> Optional[Any]:
        """The copy, or None when there is none, it is older than `max_age` or the object was deleted."""
        with self._guard:
            held = self._copies.get(key)
            if held is None:
                return None
            if self._clock() - held.shown > self.max_age:
                del self._copies[key]
                return None
            return held.value

    def forget(self, key: Hashable) -> None:
        """No copy: the next read asks the API server (a write that failed, or a copy that may be wrong)."""
        with self._guard:
            self._copies.pop(key, None)

    def __len__(self) -> int:
        with self._guard:
            return len(self._copies)


def version_of(obj: dict[str, Any]) -> Optional[str]:
    return (obj.get("metadata") or {}).get("resourceVersion")


class KnownRuns:
    """Every run this operator's watch has shown and not seen deleted, (namespace, name) -> uid: what the status
    endpoint asks before a push costs anything (push_auth.py). Unlike a copy it does not age: a run that no event
    moved for an hour still exists. A deletion lost in a watch gap leaves its entry until the name is seen again;
    the push is then refused by the owner chain (the run's children went with it)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._uids: dict[tuple[str, str], str] = {}

    def seen(self, event_type: Optional[str], run: dict[str, Any]) -> None:
        meta = run.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        with self._guard:
            if event_type == "DELETED":
                if not meta.get("uid") or self._uids.get(key) == meta["uid"]:  # not a newer run of the same name
                    self._uids.pop(key, None)
            elif meta.get("uid"):
                self._uids[key] = meta["uid"]

    def uid(self, namespace: str, name: str) -> Optional[str]:
        with self._guard:
            return self._uids.get((namespace, name))

    def __len__(self) -> int:
        with self._guard:
            return len(self._uids)


@dataclass
class LatestObjects:
    """The operator's copies: runs by (namespace, name); Jobs and MPIJobs by (kind, namespace, name); a store's
    keys by (namespace, Secret, access key's key, secret key's key)."""

    runs: Latest = field(default_factory=lambda: Latest(RUN_MAX_AGE_SECONDS))
    children: Latest = field(default_factory=lambda: Latest(CHILD_MAX_AGE_SECONDS))
    credentials: Latest = field(default_factory=lambda: Latest(CREDENTIALS_MAX_AGE_SECONDS))
    known_runs: KnownRuns = field(default_factory=KnownRuns)

    def run_seen(self, event_type: Optional[str], run: dict[str, Any]) -> None:
        """A run's watch event, or the answer to a write of its status."""
        meta = run["metadata"]
        self.known_runs.seen(event_type, run)
        _seen(self.runs, (meta["namespace"], meta["name"]), event_type, run)

    def child_seen(self, event_type: Optional[str], child: dict[str, Any]) -> None:
        meta = child["metadata"]
        _seen(self.children, (child.get("kind"), meta.get("namespace"), meta["name"]), event_type, child)

    def child(self, kind: str, namespace: str, name: str, read: Callable[[], Optional[dict[str, Any]]]
              ) -> Optional[dict[str, Any]]:
        """The Job or MPIJob from its copy, else `read()` from the API server (and kept)."""
        copy = self.children.get((kind, namespace, name))
        if copy:
            return copy
        found = read()
        self.child_read(kind, namespace, found)
        return found

    def child_read(self, kind: str, namespace: str, child: Optional[dict[str, Any]]) -> None:
        """A child as a read found it (None: absent), kept for a watched kind only: a Job or MPIJob that no event
        moved for max_age is read once, then served from the copy again."""
        if child is not None and kind in WATCHED_CHILD_KINDS:
            _seen(self.children, (kind, namespace, child["metadata"]["name"]), None, child)


def _seen(latest: Latest, key: Hashable, event_type: Optional[str], obj: dict[str, Any]) -> None:
    if event_type == "DELETED":
        latest.gone(key, version_of(obj))
    else:
        latest.seen(key, _without_managed_fields(obj), version_of(obj))


def _without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without its managedFields, which nothing reads and which grow with every write (a run's with
    every status write): most of a kept copy's memory otherwise."""
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
