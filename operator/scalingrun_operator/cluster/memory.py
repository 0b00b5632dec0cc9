"""What the operator remembers between reconciles: one object, made at start-up (tests make their own).

- a lock per run and per sweep: handlers, the progress watcher and child events overlap, and two
  reconciles of one object at once would each write a status computed from the same old one;
- what each watched pod and child looked like, so that a watch event (kubelets update pods often, and
  kopf re-lists every kind when a watch ends) starts a reconcile only when something a reconcile reads
  changed;
- how each recently deleted pod was when last seen, for the Event that reports it lost.
Everything else is read anew on every reconcile, but for the runs' pods, which the pod watch's index holds
(pod_index.py): losing this memory or that index (a restart) costs one reconcile and one pod list per run,
never a wrong status.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Hashable, Optional

from ..decide.children import child_signature
from ..decide.interruptions import last_words
from ..decide.pod_facts import signature as pod_signature


class Memory:
    def __init__(self, max_remembered: int = 5000):
        self.max_remembered = max_remembered
        self._guard = threading.Lock()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._pod_signatures: dict[str, tuple] = {}
        self._child_signatures: dict[str, tuple] = {}
        self._deleted_pods: "OrderedDict[str, str]" = OrderedDict()  # uid -> how the pod was when it was deleted

    def lock(self, key: Hashable) -> threading.Lock:
        """Serialises reconciles of one object (key: ("run" or "sweep", namespace, name)) inside this process."""
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def forget(self, key: Hashable) -> None:
        with self._guard:
            self._locks.pop(key, None)

    def pod_event_matters(self, event_type: Optional[str], pod: dict[str, Any]) -> bool:
        """Whether a pod's watch event changes anything a reconcile looks at. The initial listing only primes the
        memory: every run is reconciled on resume anyway."""
        uid = (pod.get("metadata") or {}).get("uid", "")
        with self._guard:
            if event_type == "DELETED":
                self._pod_signatures.pop(uid, None)
                self._deleted_pods[uid] = last_words(pod)
                while len(self._deleted_pods) > self.max_remembered:
                    self._deleted_pods.popitem(last=False)
                return True
            if len(self._pod_signatures) > self.max_remembered:  # DELETED events missed across watch gaps
                self._pod_signatures.clear()
            known = self._pod_signatures.get(uid)
            signature = pod_signature(pod)
            self._pod_signatures[uid] = signature
            if event_type is None:
                return known is not None and known != signature
            return known != signature

    def child_event_matters(self, event_type: Optional[str], child: dict[str, Any]) -> bool:
        """Whether a Job's or MPIJob's watch event changes what a reconcile reads of it, or deletes it. The
        operator's own creation of a child (no status yet) is no news either."""
        uid = (child.get("metadata") or {}).get("uid", "")
        signature = child_signature(child)
        with self._guard:
            if event_type == "DELETED":
                self._child_signatures.pop(uid, None)
                return True
            if len(self._child_signatures) > self.max_remembered:  # DELETED events missed across watch gaps
                self._child_signatures.clear()
            known = self._child_signatures.get(uid)
            self._child_signatures[uid] = signature
            if known is None:
                # First sight: the initial listing (every run is reconciled on resume anyway), or a creation,
                # which matters only with a status already (not one this operator just made).
                return event_type is not None and bool(child.get("status"))
            return known != signature

    def deleted_pods(self) -> dict[str, str]:
        with self._guard:
            return dict(self._deleted_pods)
