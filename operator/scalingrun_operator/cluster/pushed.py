"""The newest document each run's pods pushed (progress, heartbeat), kept in memory for the reconcile.

A push is a full state document, so only the newest counts. observe serves the newer of what was pushed and what
storage holds (`newer`): storage stays the durable record (for resume, reports and an operator that restarted),
the push is how status follows it without waiting for a poll.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Optional

from scalingrun_api.heartbeat import Heartbeat
from scalingrun_api.progress import Progress, ProgressState
from scalingrun_api.status_push import HEARTBEAT, PROGRESS


def _progress_rank(progress: Progress) -> tuple[int, int, float]:
    """How far a progress document got: the epoch, then whether it ended, then this attempt's training time."""
    return (progress.epoch if progress.epoch is not None else -1, progress.state != ProgressState.running.value,
            progress.elapsed_seconds or 0.0)


def newer(what: str, read: Any, pushed: Any) -> Any:
    """The newer of a document read from storage and one pushed (either may be None); the pushed one on a tie."""
    if pushed is None:
        return read
    if read is None:
        return pushed
    if what == HEARTBEAT:
        return pushed if pushed.time >= read.time else read
    if what == PROGRESS:
        return pushed if _progress_rank(pushed) >= _progress_rank(read) else read
    return read


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
            for what in (PROGRESS, HEARTBEAT):
                self._documents.pop((namespace, run, what), None)


def parse_pushed(what: str, document: Any) -> Optional[Any]:
    """The model of a pushed document (read as leniently as storage's: scalingrun_api), None when it is no object."""
    if not isinstance(document, dict):
        return None
    return Progress.read(document) if what == PROGRESS else Heartbeat.read(document)
