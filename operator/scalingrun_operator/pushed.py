"""The newest document each run's pods pushed (progress, heartbeat), kept in memory for the reconcile.

A push is a full state document, so only the newest counts. With the status endpoint on, observe answers decide's
progress and heartbeat asks from here alone (the operator reads no storage); storage stays the trainer's durable
record for resume and reports. Without the endpoint nothing is pushed, and observe reads storage.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Optional

from scalingrun_api.heartbeat import Heartbeat
from scalingrun_api.progress import Progress
from scalingrun_api.status_push import PROGRESS, PUSHED_DOCUMENTS


# Documents kept, the least recently pushed dropped first: a bound on what pods of runs the operator has forgotten
# (or never had) can make it hold. A dropped run's status waits for its next push, or reads storage.
DOCUMENTS_KEPT = 8192


class PushedDocuments:
    def __init__(self, kept: int = DOCUMENTS_KEPT) -> None:
        self._documents: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
        self._kept = kept
        self._guard = threading.Lock()

    def record(self, namespace: str, run: str, what: str, document: Any) -> None:
        with self._guard:
            self._documents[(namespace, run, what)] = document
            self._documents.move_to_end((namespace, run, what))
            while len(self._documents) > self._kept:
                self._documents.popitem(last=False)

    def get(self, namespace: str, run: str, what: str) -> Optional[Any]:
        with self._guard:
            return self._documents.get((namespace, run, what))

    def forget(self, namespace: str, run: str) -> None:
        with self._guard:
            for what in PUSHED_DOCUMENTS:
                self._documents.pop((namespace, run, what), None)


def parse_pushed(what: str, document: Any) -> Optional[Any]:
    """The model of a pushed document (read as leniently as storage's: scalingrun_api), None when it is no object."""
    if not isinstance(document, dict):
        return None
    return Progress.read(document) if what == PROGRESS else Heartbeat.read(document)
