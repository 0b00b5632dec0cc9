"""Every process a local run started, found and stopped as one tree.

Open MPI puts each rank in a process group of its own, and an mpirun that dies (SIGTERM, a crash) leaves its ranks
running under init: neither a kill of mpirun nor of its process group reaches them. So the tree below each process
the runner started is noted while it runs (psutil, with each process's start time so that a reused pid is never
hit), and stopping sends SIGTERM to all of it at once, then SIGKILL to whatever is left after a short grace.
psutil comes with the trainer's stack, which a local run needs anyway.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any

# How long the processes get to end on SIGTERM (a rank saving nothing, mpirun passing the signal on) before SIGKILL.
STOP_GRACE_SECONDS = 10.0


@dataclass
class ProcessTree:
    """The processes below `roots`, as far as they have been seen: note() adds the living descendants."""

    roots: list[subprocess.Popen]
    seen: dict[tuple[int, float], Any] = field(default_factory=dict)  # (pid, create_time) -> psutil.Process

    def note(self) -> None:
        import psutil

        for root in self.roots:
            try:
                top = psutil.Process(root.pid)
                found = [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for process in found:
                try:
                    self.seen.setdefault((process.pid, process.create_time()), process)
                except psutil.NoSuchProcess:
                    pass

    def alive(self) -> list[Any]:
        """The noted processes still running (a zombie has ended: it only waits for its parent to reap it)."""
        import psutil

        living = []
        for process in self.seen.values():
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    living.append(process)
            except psutil.NoSuchProcess:
                pass
        return living

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> int:
        """SIGTERM to every noted process still running, SIGKILL to those left after `grace`; the roots reaped.
        Returns how many were running."""
        import psutil

        self.note()
        living = self.alive()
        for process in living:
            _signal(process, signal.SIGTERM)
        _, left = psutil.wait_procs(living, timeout=grace)
        for process in left:
            _signal(process, signal.SIGKILL)
        psutil.wait_procs(left, timeout=5)
        for root in self.roots:
            try:
                root.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILLed above
                pass
        return len(living)


def _signal(process: Any, signum: int) -> None:
    import psutil

    try:
        process.send_signal(signum)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
