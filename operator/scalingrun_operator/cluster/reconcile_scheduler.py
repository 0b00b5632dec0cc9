"""The reconciles that no Kubernetes event triggers, scheduled by one operator-wide thread instead of a timer per
run: on a change of a watched document in object storage, and once after a delay when asked (a recheck). The
operator runs two: one for runs (progress documents and rechecks) and one for sweeps (rechecks only).

kopf puts a finalizer on every object that has a timer or daemon, so a run could not be deleted
while the operator was down; and a timer re-read each run's children every interval. Children and
pods are watched already; what remains is object storage. This thread:

- checks the progress document of each run in Training with a conditional read (S3: If-None-Match
  with the last ETag, 304 when unchanged; files: mtime and size) and reconciles a run only when its
  document changed. A check costs about 2 ms of CPU in botocore, so the checks are spread to at most
  `max_checks_per_second`: with many runs each is checked less often than every `interval`. The
  reconcile registers the run with the version it read, so nothing written in between is missed;
- reconciles a run once after a delay when asked (`schedule_recheck`): a Job done but its manifest
  not yet written, storage unreadable, an MPIJob done but its final progress not yet written, a pod
  still Pending.

A tenant's store must not stop the others' checks: the loop only hands checks to a small pool
(`check_workers`), at most `per_endpoint` of them to one endpoint at a time, and skips an endpoint whose
circuit breaker is open (pull/store_slots.py: Guard: a store that keeps failing is asked again after a backoff),
so 60 runs on a dead store cost one check per backoff, not 60 timeouts a round. Each check's call ends
within its budget (2 s). The loop beats at least every `HEARTBEAT_SECONDS`; `health()` tells the
operator's liveness probe when it has stopped or a check has outlived any budget.

Runs are known from reconciles (every run is reconciled on start-up by kopf's resume handler), not
from API reads: at rest this makes no Kubernetes API request.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional

from ..document_source import Followed
from .pass_loop import PassLoop

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
HEARTBEAT_SECONDS = 5.0  # the loop passes at least this often, with nothing due too
STUCK_SECONDS = 60.0  # a check (budget 2 s) in flight this long is stuck: the liveness probe fails


@dataclass
class _Watched:
    document: Followed
    version: Optional[str]  # None: the document did not exist when last read
    due: float
    failing: bool = False  # the last check could not read storage (reported once, by a reconcile)


class ReconcileScheduler:
    """Calls `reconcile(namespace, name)` when a watched document changed (checked every `interval` seconds) and
    when a recheck asked for falls due."""

    def __init__(self, reconcile: Callable[[str, str], object], interval: float, max_checks_per_second: float = 5.0,
                 workers: int = 4, clock: Callable[[], float] = time.monotonic, check_workers: int = 4,
                 per_endpoint: int = 2):
        self._reconcile = reconcile
        self.interval = interval
        self.max_checks_per_second = max_checks_per_second
        self.per_endpoint = per_endpoint
        self._clock = clock
        self.beat = clock()  # when the loop last passed
        self._checking: dict[Key, tuple[str, float]] = {}  # checks in flight: (endpoint, started)
        self._guard = threading.Lock()
        self._watched: dict[Key, _Watched] = {}
        self._rechecks: dict[Key, float] = {}  # the earliest one asked for wins
        self._queue: list[tuple[float, Key]] = []  # (due, key) for rechecks; stale entries are skipped
        self._busy: set[Key] = set()  # reconciles submitted and not finished
        self._paused = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="progress-reconcile")
        self._checks = ThreadPoolExecutor(max_workers=check_workers, thread_name_prefix="progress-check")
        self._passes = PassLoop("progress-watch", self.run_due, lambda: self.interval, (self._pool, self._checks),
                                longest_sleep=HEARTBEAT_SECONDS)

    # --- what the reconcile and the event handlers tell it ---------------------------------------

    def watch(self, namespace: str, name: str, document: Followed, version: Optional[str]) -> None:
        """Follow a run's document (pull mode's: pull/store_source.py) from `version` (what its reconcile read) on."""
        key = (namespace, name)
        with self._guard:
            known = self._watched.get(key)
            if known and known.document == document:
                known.version, known.failing = version, False
                return
            # Spread the first checks of many runs over one interval.
            self._watched[key] = _Watched(document, version, self._clock() + random.uniform(0, self._period()))

    def unwatch(self, namespace: str, name: str) -> None:
        with self._guard:
            self._watched.pop((namespace, name), None)

    def forget(self, namespace: str, name: str) -> None:
        """The run is gone: no check and no recheck."""
        with self._guard:
            self._watched.pop((namespace, name), None)
            self._rechecks.pop((namespace, name), None)

    def schedule_recheck(self, namespace: str, name: str, delay_s: float) -> None:
        """Reconcile the run once, `delay_s` seconds from now (an earlier request already pending wins)."""
        key, due = (namespace, name), self._clock() + max(0.0, delay_s)
        with self._guard:
            if key in self._rechecks and self._rechecks[key] <= due:
                return
            self._rechecks[key] = due
            heapq.heappush(self._queue, (due, key))
        self._passes.wake()

    def _period(self) -> float:
        """Seconds between two checks of one run: `interval`, or longer when that would exceed the check rate."""
        return max(self.interval, len(self._watched) / self.max_checks_per_second)

    def watched(self) -> dict[Key, str]:
        with self._guard:
            return {k: w.document.uri for k, w in self._watched.items()}

    def pending_rechecks(self) -> dict[Key, float]:
        with self._guard:
            return dict(self._rechecks)

    # --- the loop ---------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop acting (this replica is no longer the one that acts); what is watched and due is kept."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()
        self._passes.wake()

    def start(self) -> None:
        self._passes.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._passes.stop(timeout)

    def health(self) -> Optional[str]:
        """None while the loop passes and no check is stuck; else what is wrong (for the liveness probe)."""
        now = self._clock()
        ended = self._passes.ended()
        if ended:
            return ended
        if now - self.beat > max(60.0, 3 * HEARTBEAT_SECONDS):
            return f"the progress watcher has not passed for {now - self.beat:.0f} s"
        with self._guard:
            stuck = [(k, e, now - t) for k, (e, t) in self._checking.items() if now - t > STUCK_SECONDS]
        if stuck:
            (namespace, name), endpoint, seconds = max(stuck, key=lambda s: s[2])
            return (f"{len(stuck)} progress checks stuck, the oldest for {seconds:.0f} s "
                    f"({namespace}/{name} at {endpoint})")
        return None

    def run_due(self) -> float:
        """One pass: due rechecks, then due document checks handed to the check pool. Returns seconds until the
        next thing is due."""
        self.beat = self._clock()
        if self._paused.is_set():
            return self.interval
        now = self._clock()
        for key in self._due_rechecks(now):
            self._submit(key, "recheck")
        with self._guard:
            due = [(k, w) for k, w in self._watched.items() if w.due <= now]
        for key, watched in due:
            if self._passes.stopping.is_set():
                break
            self._start_check(key, watched, now)
        with self._guard:
            upcoming = [w.due for w in self._watched.values()] + [d for d, _ in self._queue[:1]]
        return max(0.05, min(upcoming, default=now + self.interval) - self._clock())

    def _due_rechecks(self, now: float) -> list[Key]:
        out = []
        with self._guard:
            while self._queue and self._queue[0][0] <= now:
                due, key = heapq.heappop(self._queue)
                if self._rechecks.get(key) == due:
                    del self._rechecks[key]
                    out.append(key)
        return out

    def _start_check(self, key: Key, watched: _Watched, now: float) -> None:
        """Hands the check to the pool, unless its endpoint is open (failing: after its backoff) or has its share
        of checks in flight (in a moment)."""
        shared, endpoint = watched.document.shares_endpoint(), watched.document.endpoint()
        closed_in = watched.document.closed_for()
        with self._guard:
            if key in self._checking:
                watched.due = now + self._period()
                return
            if closed_in:
                watched.due = now + max(self._period(), closed_in)
                return
            if shared and sum(1 for e, _ in self._checking.values() if e == endpoint) >= self.per_endpoint:
                watched.due = now + min(1.0, self._period())
                return
            watched.due = now + self._period()
            self._checking[key] = (endpoint, self._clock())
        try:
            self._checks.submit(self._check, key, watched)
        except RuntimeError:  # shutting down
            with self._guard:
                self._checking.pop(key, None)

    def _check(self, key: Key, watched: _Watched) -> None:
        try:
            check = watched.document.check(watched.version)
        except Exception:  # a pool thread's exception is lost unless said: the next round checks again
            log.exception("%s/%s: progress check failed", *key)
            return
        finally:
            with self._guard:
                self._checking.pop(key, None)
        if check.busy:
            return  # the endpoint's calls are taken by reconciles: the next round checks
        with self._guard:
            if self._watched.get(key) is not watched:
                return  # unwatched (or followed anew) while its check waited for a thread: not this check's to act on
        if check.error:
            # The reconcile turns it into StorageReadable=False and a recheck; one reconcile, not one a check.
            if not watched.failing:
                watched.failing = True
                log.info("%s/%s: %s", *key, check.error)
                self._submit(key, "storage error")
            return
        watched.failing = False
        if check.changed:
            watched.version = check.version
            self._submit(key, "progress changed")

    def _submit(self, key: Key, why: str) -> None:
        with self._guard:
            if key in self._busy:
                # One in flight reads the world as it is when it runs; a second right after it would not.
                self._rechecks.setdefault(key, self._clock() + 1.0)
                heapq.heappush(self._queue, (self._rechecks[key], key))
                return
            self._busy.add(key)
        log.debug("%s/%s: reconcile (%s)", *key, why)
        try:
            self._pool.submit(self._reconcile_one, key)
        except RuntimeError:  # shutting down
            with self._guard:
                self._busy.discard(key)

    def _reconcile_one(self, key: Key) -> None:
        try:
            self._reconcile(*key)
        except Exception as exc:
            delay = getattr(exc, "delay", None) or self.interval
            log.warning("%s/%s: reconcile failed (%s: %s); again in %g s", *key, type(exc).__name__, exc, delay)
            self.schedule_recheck(*key, delay)
        finally:
            with self._guard:
                self._busy.discard(key)
