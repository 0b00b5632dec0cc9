"""One reconcile per run at a time, and pod events folded into at most one reconcile per run per interval.

A run of a thousand workers makes thousands of pod events at start-up; each would start a reconcile that
lists every pod of the run, and each would wait for the one before on the run's lock, parking kopf's handler
threads. Here a trigger for a run that is being reconciled only marks it for once more after (the handler
thread returns at once), and a pod event within `min_interval` of the run's last reconcile is deferred to
the end of that interval, where all the events that came meanwhile make one reconcile; with `settle`, a pod event
waits that long even when the interval is over, so that a burst of them (a run's pods created, or moved, one after
the other) makes one reconcile, not one for its first event and one for the rest. Other triggers
(creation, a spec change, a child's event, storage) are urgent: they wait for no interval, only for the
reconcile in flight. A pushed document is neither: it comes alone, so it waits for no settle, and the status
server's event loop hands it off (`soon`). Level-triggered reconciles make this safe: the one that runs reads the
world as it is.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Hashable, Optional

from .pass_loop import PassLoop


@dataclass
class _Slot:
    running: bool = False
    again: bool = False  # a trigger came while running: once more afterwards
    again_urgent: bool = False
    due: Optional[float] = None  # a deferred reconcile is scheduled then
    last_start: float = -math.inf
    why: str = ""  # what asked for the deferred reconcile (the last trigger folded in)


class Coalescer:
    """Calls `act(key, why)`: in the triggering thread when it may run now, else once, later, in a small pool."""

    def __init__(self, act: Callable[[Hashable, str], object], min_interval: float = 1.0, workers: int = 4,
                 clock: Callable[[], float] = time.monotonic, settle: float = 0.0):
        self._act, self.min_interval, self._clock, self.settle = act, min_interval, clock, settle
        self._guard = threading.Lock()
        self._slots: dict[Hashable, _Slot] = {}
        self._queue: list[tuple[float, int, Hashable]] = []  # (due, tie, key); stale entries are skipped
        self._tie = itertools.count()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="coalesced-reconcile")
        self._passes = PassLoop("coalescer", self.run_due, lambda: 1.0, (self._pool,))

    def trigger(self, key: Hashable, why: str = "", urgent: bool = True) -> bool:
        """Reconciles `key` now in this thread, or folds the trigger into one in flight or scheduled and returns
        at once (a trigger that is not urgent always, with `settle`). Returns whether it ran here; an error of a
        run here propagates to the caller."""
        with self._guard:
            slot = self._slots.setdefault(key, _Slot())
            now = self._clock()
            slot.why = why
            if slot.running:
                slot.again = True
                slot.again_urgent = slot.again_urgent or urgent
                return False
            if not urgent and (self.settle > 0 or now - slot.last_start < self.min_interval):
                self._schedule(key, slot, max(now + self.settle, slot.last_start + self.min_interval))
                return False
            slot.running, slot.due, slot.last_start = True, None, now
        try:
            self._act(key, why)
        finally:
            self._finished(key)
        return True

    def soon(self, key: Hashable, why: str = "") -> None:
        """Reconciles `key` in the pool as soon as its interval allows, without `settle` (a fact that comes alone,
        such as a pushed progress document); never in this thread, which may be an event loop's."""
        with self._guard:
            slot = self._slots.setdefault(key, _Slot())
            slot.why = why
            if slot.running:
                slot.again = True
                return
            self._schedule(key, slot, max(self._clock(), slot.last_start + self.min_interval))

    def forget(self, key: Hashable) -> None:
        """The object is gone: nothing scheduled for it runs (one in flight finishes)."""
        with self._guard:
            slot = self._slots.get(key)
            if slot is not None and not slot.running:
                del self._slots[key]

    def pending(self) -> dict[Hashable, float]:
        """Keys with a deferred reconcile, and when it is due (clock seconds)."""
        with self._guard:
            return {k: s.due for k, s in self._slots.items() if s.due is not None}

    def _schedule(self, key: Hashable, slot: _Slot, due: float) -> None:
        if slot.due is not None and slot.due <= due:
            return
        slot.due = due
        heapq.heappush(self._queue, (due, next(self._tie), key))
        self._passes.wake()

    def _finished(self, key: Hashable) -> None:
        with self._guard:
            slot = self._slots.get(key)
            if slot is None:
                return
            slot.running = False
            if slot.again:
                due = self._clock() if slot.again_urgent else slot.last_start + self.min_interval
                slot.again = slot.again_urgent = False
                self._schedule(key, slot, due)

    # --- the deferred ones ------------------------------------------------------------------------------

    def start(self) -> None:
        self._passes.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._passes.stop(timeout)

    def run_due(self) -> float:
        """Hands the due reconciles to the pool; returns seconds until the next one is due."""
        now = self._clock()
        with self._guard:
            due = []
            while self._queue and self._queue[0][0] <= now:
                when, _, key = heapq.heappop(self._queue)
                slot = self._slots.get(key)
                if slot is not None and slot.due == when:
                    due.append(key)
            upcoming = self._queue[0][0] - now if self._queue else 1.0
        for key in due:
            try:
                self._pool.submit(self._deferred, key)
            except RuntimeError:  # shutting down
                return 1.0
        return max(0.01, min(upcoming, 1.0))

    def _deferred(self, key: Hashable) -> None:
        with self._guard:
            slot = self._slots.get(key)
            if slot is None or slot.due is None:
                return  # forgotten, or run by a trigger meanwhile
            if slot.running:
                slot.due, slot.again = None, True
                return
            slot.running, slot.due, slot.last_start = True, None, self._clock()
            why = slot.why
        try:
            self._act(key, why)
        except Exception:  # the act logs and schedules its own retry; nothing waits for this thread
            pass
        finally:
            self._finished(key)
