"""PassLoop: the thread under the operator's two schedulers (coalesce.py's Coalescer, reconcile_scheduler.py's
ReconcileScheduler). It calls their `run_due()` pass after pass, sleeping until the next thing is due or until
`wake()`; a pass that raises is logged and the loop goes on; stop() ends it and drops the work its pools had not
started."""

from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

log = logging.getLogger(__name__)


class PassLoop:
    """`run_due()` returns the seconds until the next thing is due; the loop sleeps at most `longest_sleep` (it beats
    at least that often) and `after_error()` seconds after a pass that raised."""

    def __init__(self, name: str, run_due: Callable[[], float], after_error: Callable[[], float],
                 pools: tuple[ThreadPoolExecutor, ...], longest_sleep: float = math.inf):
        self.name, self._run_due, self._after_error = name, run_due, after_error
        self._pools, self._longest_sleep = pools, longest_sleep
        self._wake = threading.Event()
        self.stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def wake(self) -> None:
        """Something new may be due sooner than the loop sleeps: it passes now."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout)
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)

    def ended(self) -> Optional[str]:
        """What is wrong when the loop's thread ended without a stop(); else None."""
        if self._thread is not None and not self._thread.is_alive() and not self.stopping.is_set():
            return f"the {self._thread.name} thread has ended"
        return None

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                wait = self._run_due()
            except Exception:  # the loop must outlive any one bad pass
                log.exception("%s pass failed", self.name)
                wait = self._after_error()
            self._wake.wait(timeout=min(wait, self._longest_sleep))
            self._wake.clear()
