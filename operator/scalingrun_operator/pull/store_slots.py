"""Per store (endpoint): how many storage calls are in flight, and a circuit breaker. One operator serves every
tenant: a store that holds its calls cannot hold all of the operator's threads, and a store that keeps failing is
not asked again until its backoff has passed."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from ..document_source import Busy  # raised through observe: the reconcile looks again after its delay


class Guard:
    """Per endpoint: calls in flight (at most `per_endpoint`, half the operator's handler threads: a store that
    holds its calls cannot hold them all; a call waits up to `wait` seconds for a slot, far longer than a healthy
    store's answers take) and a circuit breaker.

    After `threshold` failures in a row (the store misbehaved, could not be reached or timed out) the
    endpoint is open: calls fail at once with the last failure, for `base` seconds, doubling with each
    failure after that up to `longest`. One success closes it. A failure is kept as (reason, summary), the
    summary naming no URI: tenants may share a store, and one's conditions must not show another's paths."""

    def __init__(self, per_endpoint: int = 4, threshold: int = 2, base: float = 5.0, longest: float = 300.0,
                 wait: float = 0.5):
        self.per_endpoint, self.threshold, self.base, self.longest, self.wait = (
            per_endpoint, threshold, base, longest, wait)
        self._lock = threading.Condition()
        self._in_flight: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self._open_until: dict[str, float] = {}
        self._last: dict[str, tuple[str, str]] = {}

    def open_for(self, endpoint: str) -> float:
        """Seconds until the endpoint may be asked again (0: it may be now)."""
        with self._lock:
            return max(0.0, self._open_until.get(endpoint, 0.0) - time.monotonic())

    def last_failure(self, endpoint: str) -> Optional[tuple[str, str]]:
        with self._lock:
            return self._last.get(endpoint)

    def enter(self, endpoint: str) -> None:
        """Takes a slot; Busy when none frees within `wait` seconds. The caller checks `open_for` first."""
        deadline = time.monotonic() + self.wait
        with self._lock:
            while self._in_flight.get(endpoint, 0) >= self.per_endpoint:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Busy(f"the operator has {self.per_endpoint} requests to {endpoint} in flight already",
                               delay=1.0)
                self._lock.wait(left)
            self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1

    @contextmanager
    def slot(self, endpoint: str, judge: Callable[[Exception], Optional[tuple[str, str]]],
             short: bool = False) -> Iterator[None]:
        """A slot for one call to `endpoint`; an exception that `judge` turns into (reason, summary) is a failure
        of the store, any other is not. `short`: a budget too short to call the store slow (a busy node can
        make a healthy store miss a 2 s check): running out of it is not a failure."""
        self.enter(endpoint)
        failure = None
        try:
            yield
        except Exception as exc:
            failure = judge(exc)
            if short and failure and failure[0] == "StorageTooSlow":
                failure = None
            raise
        finally:
            self.leave(endpoint, failure)

    def leave(self, endpoint: str, failure: Optional[tuple[str, str]]) -> None:
        with self._lock:
            self._in_flight[endpoint] -= 1
            if not self._in_flight[endpoint]:
                del self._in_flight[endpoint]
            if failure is None:
                for table in (self._failures, self._open_until, self._last):
                    table.pop(endpoint, None)
            else:
                count = self._failures[endpoint] = self._failures.get(endpoint, 0) + 1
                self._last[endpoint] = failure
                if count >= self.threshold:
                    backoff = min(self.longest, self.base * 2 ** (count - self.threshold))
                    self._open_until[endpoint] = time.monotonic() + backoff
            self._lock.notify_all()
