"""Failing fast on a silent peer: a rank that stops answering (a frozen process, a hung GPU, a lost node) keeps every
other rank inside its collective, and no engine notices by itself under mpirun (Horovod's stall check sits behind
the same blocked MPI call; gloo's and TensorFlow's timeouts do not say which rank was silent).

The watch: from the first training step to the end of training, a thread on every rank reads when its loop last
beat (core.heartbeat: the loop beats, the thread only reads). After `timeout` seconds without a beat the rank
answers a roll call in the run's storage (`<runLocation>/stalls/<attempt>/rank-N`), waits up to the roll call's
window for the others, names the ranks that did not answer, and exits with STALL_EXIT_CODE: mpirun then stops
every rank and exits non-zero, and the run restarts from its checkpoint. Only the ranks whose loop is alive can
answer; the silent ones are the stalled ranks.

Each engine's own collective timeout (DDP's process-group timeout, MultiWorkerMirroredStrategy's
CommunicationOptions, Horovod's stall shutdown) is set later than the watch, as a bound where the watch is not
running (start-up, the probe, building the feature cache, the final save); the operator's stall timeout
(heartbeat.json) bounds those phases too.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from typing import Callable, Optional

from pyarrow import fs as pafs
from scalingrun_api.heartbeat import (COLLECTIVE_TIMEOUT_VARIABLE, DEFAULT_COLLECTIVE_TIMEOUT_SECONDS, STALL_EXIT_CODE,
                                      engine_timeout_after, roll_call_window)

from ..storage import Location
from .heartbeat import HeartbeatWriter

# Set by the MPIJob from spec.training.stallTimeout when GPUs are asked for (scalingrun_api.heartbeat).
TIMEOUT_VARIABLE = COLLECTIVE_TIMEOUT_VARIABLE
DEFAULT_TIMEOUT_SECONDS = DEFAULT_COLLECTIVE_TIMEOUT_SECONDS

# TensorFlow's coordination service (MultiWorkerMirroredStrategy) names the worker whose heartbeat stopped; the
# worker's task index is its rank (engines/keras_mirrored/tf_config.py).
_TENSORFLOW_SILENT_TASK = re.compile(r"Task /job:worker/replica:\d+/task:(\d+) heartbeat timeout")


def silent_peer(error: BaseException) -> Optional[int]:
    """The rank an engine's own error names as the one that stopped answering, if it names one."""
    found = _TENSORFLOW_SILENT_TASK.search(str(error))
    return int(found.group(1)) if found else None


class StallWatchError(ValueError):
    """A bad SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS."""


def collective_timeout() -> float:
    """Seconds a training loop may go without a step before its rank gives up (SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS,
    default 300; 0 turns the watch off and leaves the engines' timeouts at their defaults)."""
    raw = os.environ.get(TIMEOUT_VARIABLE, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_SECONDS
    except ValueError:
        raise StallWatchError(f"{TIMEOUT_VARIABLE}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise StallWatchError(f"{TIMEOUT_VARIABLE}={raw!r} must be 0 (off) or more seconds")
    return value


def engine_timeout(timeout: Optional[float] = None) -> Optional[float]:
    """The engines' own collective timeout: after the watch and its roll call; None when the watch is off."""
    return engine_timeout_after(collective_timeout() if timeout is None else timeout)


class StallWatch:
    """One rank's watch over its own training loop. `folder`: this attempt's roll call (the same on every rank)."""

    def __init__(self, heartbeat: HeartbeatWriter, folder: Location, *, rank: int, size: int, timeout: float,
                 window: Optional[float] = None, exit: Callable[[int], None] = os._exit,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
                 monotonic: Callable[[], float] = time.monotonic):
        self.heartbeat, self.folder, self.rank, self.size = heartbeat, folder, rank, size
        self.timeout = timeout
        self.window = roll_call_window(timeout) if window is None else window
        self.exit, self.log, self.monotonic = exit, log, monotonic
        self._armed = threading.Event()
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def arm(self) -> None:
        """From the first training step: the loop beats at every step from here on. Idempotent."""
        if self._armed.is_set() or not self.timeout:
            return
        self._armed.set()
        self._thread = threading.Thread(target=self._watch, name="scalingrun-stall-watch", daemon=True)
        self._thread.start()

    def disarm(self) -> None:
        """Training ended (or failed): the phases after it are not watched."""
        self._stopped.set()

    def _watch(self) -> None:
        period = max(0.5, min(5.0, self.timeout / 10))
        woke = self.monotonic()
        while not self._stopped.wait(period):
            now, last = self.monotonic(), self.heartbeat.last_beat
            slept, woke = now - woke, now
            silent = now - last if last is not None else 0.0
            if silent < self.timeout or self._stopped.is_set():
                continue
            if slept >= max(3 * period, self.timeout / 2):
                # This thread itself did not run: the whole process was stopped (SIGSTOP, a paused container), and
                # is the rank the others waited for; mpirun wakes it only to stop it.
                self.log(f"scalingrun-trainer (rank {self.rank}/{self.size}): this process was stopped for "
                         f"{slept:.0f} s (frozen: SIGSTOP, a paused container): it is the rank that stopped answering")
            else:
                self.log(self.roll_call(silent))
            self.exit(STALL_EXIT_CODE)
            return

    def roll_call(self, silent: float) -> str:
        """Answers, waits for the other ranks' answers (at most the window) and says who did not answer."""
        document = self.heartbeat.document
        where = f"phase {document.phase}, epoch {document.epoch}, step {document.step}"
        try:
            self.folder.join(f"rank-{self.rank}").write_bytes_atomic(
                json.dumps({"rank": self.rank, "host": socket.gethostname(), "silentSeconds": round(silent, 1)})
                .encode(), deadline=5.0)
        except Exception as exc:  # noqa: BLE001 - without the roll call the rank still stops, less precisely
            return (f"scalingrun-trainer (rank {self.rank}/{self.size}): no training step for {silent:.0f} s "
                    f"({where}), and the roll call in {self.folder.uri} failed ({type(exc).__name__}): stopping")
        deadline = self.monotonic() + self.window
        answered = self._answered()
        while len(answered) < self.size and self.monotonic() < deadline:
            time.sleep(0.5)
            answered = self._answered()
        missing = [rank for rank in range(self.size) if rank not in answered]
        head = (f"scalingrun-trainer (rank {self.rank}/{self.size}): no training step for {silent:.0f} s ({where}, "
                f"{TIMEOUT_VARIABLE}={self.timeout:g}): ")
        if not missing:
            return head + ("every rank answered the roll call, so none is frozen: all were stuck (storage, the input "
                           "pipeline?); stopping so that the run restarts from its checkpoint")
        names = ", ".join(str(rank) for rank in missing)
        return head + (f"rank{'s' if len(missing) > 1 else ''} {names} stopped answering (no answer to the roll call "
                       f"in {self.window:.0f} s: a frozen process, a hung GPU or a lost node); stopping so that the "
                       "run restarts from its checkpoint")

    def _answered(self) -> set[int]:
        try:
            infos = self.folder.fs.get_file_info(pafs.FileSelector(self.folder.path, allow_not_found=True))
        except OSError:
            return {self.rank}
        return {int(info.base_name[len("rank-"):]) for info in infos
                if info.base_name.startswith("rank-") and info.base_name[len("rank-"):].isdigit()}
