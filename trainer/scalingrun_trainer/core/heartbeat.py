"""The heartbeat (schema and rules: scalingrun_api.heartbeat): `beat(phase, step, epoch)` from the training loop
itself, on every rank; rank 0 writes `<runLocation>/heartbeat.json` at most every HEARTBEAT_INTERVAL_SECONDS.

Never from a thread: a loop stuck in a collective must stop beating, so that the operator (and the local runner)
can tell a stalled run from a slow one. A beat costs a clock read and a few comparisons; the write, when one is
due, one small atomic object (a single short try, no long retries: a late beat is better than a held step). A
write that fails never fails training: it is logged once and the next due beat tries again.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Callable, Optional

from scalingrun_api.heartbeat import HEARTBEAT_INTERVAL_SECONDS, Heartbeat, HeartbeatPhase
from scalingrun_api.status_push import HEARTBEAT
from ..storage import Location
from .status_push import status_pusher

# A phase change (training -> validation -> saving) is written sooner than the interval, but not more often than
# this: short phases in a row must not turn the heartbeat into a write per step.
PHASE_CHANGE_FLOOR_SECONDS = 5.0
# How long one write may retry transient storage errors before the beat gives up (the next due beat tries again).
WRITE_DEADLINE_SECONDS = 5.0


class HeartbeatWriter:
    """One attempt's heartbeat on one rank. `location` None: this rank writes nothing (not rank 0), but its beats
    still count the longest gap. `clock`: wall time written in the document; `monotonic`: what gaps are measured
    with. `pushed`: the run's own heartbeat, also pushed to the operator (status_push.py); a preprocessing
    shard's beat is not (the run's status would take it for the training's)."""

    def __init__(self, location: Optional[Location], *, rank: int = 0,
                 interval: float = HEARTBEAT_INTERVAL_SECONDS, phase_floor: float = PHASE_CHANGE_FLOOR_SECONDS,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
                 pushed: bool = False):
        self.location, self.rank, self.pushed = location, rank, pushed
        self.interval, self.phase_floor = interval, phase_floor
        self.clock, self.monotonic, self.log = clock, monotonic, log
        self.document = Heartbeat(phase=HeartbeatPhase.starting, time=clock(), attempt_started=clock(), rank=rank)
        self.longest_gap = 0.0
        self.writes = 0
        self._last_beat: Optional[float] = None
        self._last_write: Optional[float] = None
        self._written_phase: Optional[str] = None
        self._failed = False

    @property
    def last_beat(self) -> Optional[float]:
        """When the loop last beat (the monotonic clock); None before the first beat."""
        return self._last_beat

    def beat(self, phase: HeartbeatPhase | str, step: Optional[int] = None, epoch: Optional[int] = None) -> bool:
        """The loop is alive in `phase` at `step` (None keeps the last one) of `epoch`; True when this beat was
        written."""
        now = self.monotonic()
        if self._last_beat is not None:
            self.longest_gap = max(self.longest_gap, now - self._last_beat)
        self._last_beat = now
        phase = HeartbeatPhase(phase).value
        document = self.document
        document.phase = phase
        if step is not None:
            document.step = max(int(step), 0)
        if epoch is not None:
            document.epoch = int(epoch)
        if self.location is None or not self._due(now, phase):
            return False
        document.time, document.longest_gap_seconds = self.clock(), round(self.longest_gap, 3)
        self._last_write, self._written_phase = now, phase
        return self._write()

    def _due(self, now: float, phase: str) -> bool:
        if self._last_write is None:
            return True
        since = now - self._last_write
        return since >= self.interval or (phase != self._written_phase and since >= self.phase_floor)

    def _write(self) -> bool:
        pusher = status_pusher() if self.pushed else None
        if pusher is not None:
            pusher.push(HEARTBEAT, self.document.document())  # sent by its thread: the beat never waits
        data = json.dumps(self.document.document()).encode()
        try:
            self.location.write_bytes_atomic(data, deadline=WRITE_DEADLINE_SECONDS)
        except Exception as exc:  # noqa: BLE001 - a heartbeat must never fail the training it reports on
            if not self._failed:
                self._failed = True
                self.log(f"scalingrun-trainer: cannot write the heartbeat {self.location.uri} "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); training goes "
                         "on, and later beats try again (this is said once)")
            return False
        self.writes += 1
        return True
