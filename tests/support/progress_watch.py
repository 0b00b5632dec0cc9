"""A settable clock and a recorder of the progress watcher's reconciles."""

from __future__ import annotations

import threading
import time


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """The reconcile the watcher calls: records which runs, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, namespace: str, name: str) -> None:
        with self._lock:
            self.calls.append((namespace, name))

    def settled(self, count: int) -> list[tuple[str, str]]:
        deadline = time.monotonic() + 5
        while len(self.calls) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # and nothing more arrives
        return list(self.calls)
