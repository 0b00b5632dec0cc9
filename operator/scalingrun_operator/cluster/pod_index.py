"""The runs' pods as the pod watch reports them: what a reconcile reads instead of listing the run's pods.

kopf already receives every event of the operator's pods (the watch is filtered by label, server-side), so a
reconcile need not list them again: 300 runs whose pods move make thousands of reconciles, and a list each was
most of their cost. A run's pods are served from here only once this process has listed them itself (the first
reconcile of each run after a start lists and seeds: nothing is trusted from before), and again by a list every
`resync_seconds` or after kopf re-listed pods (a watch that expired may have missed a deletion), so the index can
be behind the API server for at most that long, and only where an event was lost.

Events and a list may overlap: each entry carries the sequence number of what wrote it, and a list keeps what an
event wrote after the list began (newer than the list), including a deletion.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..builders.common import RUN_LABEL
from .k8s import trimmed_pod

Key = tuple[str, str]  # (namespace, run)


@dataclass
class _Run:
    pods: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # uid -> (seq, trimmed pod)
    gone: dict[str, int] = field(default_factory=dict)  # uid -> seq of its deletion, until the next list
    listed_at: Optional[float] = None  # monotonic time of the last list that seeded it; None: not trusted


class PodIndex:
    def __init__(self, resync_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.resync_seconds, self._clock = resync_seconds, clock
        self._guard = threading.Lock()
        self._runs: dict[Key, _Run] = {}
        self._seq = itertools.count(1)

    def observe(self, event_type: Optional[str], pod: dict[str, Any]) -> None:
        """A pod's watch event (type None: kopf's listing, at start-up or after its watch expired)."""
        meta = pod.get("metadata") or {}
        run, uid = (meta.get("labels") or {}).get(RUN_LABEL), meta.get("uid")
        if not run or not uid:
            return
        key = (meta.get("namespace") or "", run)
        kept = None if event_type == "DELETED" else trimmed_pod(pod)
        with self._guard:
            entry = self._runs.get(key)
            if entry is None:
                if kept is None:
                    return
                entry = self._runs[key] = _Run()
            seq = next(self._seq)
            if kept is None:
                entry.pods.pop(uid, None)
                if entry.pods or entry.listed_at is not None:
                    entry.gone[uid] = seq
                else:
                    del self._runs[key]  # a forgotten run's last pod
                return
            if event_type is None and entry.listed_at is not None:
                entry.listed_at = None  # kopf listed again: events may have been missed; list at the next look
            entry.pods[uid] = (seq, kept)
            entry.gone.pop(uid, None)

    def pods(self, namespace: str, run: str) -> Optional[list[dict[str, Any]]]:
        """The run's pods sorted by name (as a list returns them), or None when they must be listed."""
        with self._guard:
            entry = self._runs.get((namespace, run))
            if entry is None or entry.listed_at is None or self._clock() - entry.listed_at > self.resync_seconds:
                return None
            return sorted((pod for _, pod in entry.pods.values()), key=lambda p: p["metadata"].get("name", ""))

    def listing(self, namespace: str, run: str, list_pods: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """Lists the run's pods with `list_pods` (trimmed), seeds the index with them, and returns the run's pods."""
        with self._guard:
            began = next(self._seq)
            at = self._clock()
        listed = list_pods()
        with self._guard:
            entry = self._runs.setdefault((namespace, run), _Run())
            fresh: dict[str, tuple[int, dict[str, Any]]] = {}
            for pod in listed:
                uid = pod["metadata"].get("uid", "")
                if entry.gone.get(uid, 0) > began:
                    continue  # deleted after the list began
                known = entry.pods.get(uid)
                fresh[uid] = known if known and known[0] > began else (began, pod)
            for uid, known in entry.pods.items():
                if uid not in fresh and known[0] > began:
                    fresh[uid] = known  # created after the list began
            entry.pods, entry.gone, entry.listed_at = fresh, {}, at
            return sorted((pod for _, pod in fresh.values()), key=lambda p: p["metadata"].get("name", ""))

    def runs_on(self, node: str) -> list[Key]:
        """The runs with a pod on `node`, as the pod watch saw them."""
        with self._guard:
            return sorted(key for key, entry in self._runs.items()
                          if any((pod.get("spec") or {}).get("nodeName") == node for _, pod in entry.pods.values()))

    def forget(self, namespace: str, run: str) -> None:
        """The run is gone; its pods' DELETED events follow and find nothing to keep."""
        with self._guard:
            self._runs.pop((namespace, run), None)

    def size(self) -> int:
        with self._guard:
            return sum(len(e.pods) for e in self._runs.values())
