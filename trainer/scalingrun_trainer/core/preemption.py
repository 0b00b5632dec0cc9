"""A preemption notice: SIGTERM (the kubelet's, at the start of the pod's termination grace period; the operator
deletes a worker whose node carries a cloud's termination taint, so that notice arrives the same way) ends the
training at the next step boundary with a checkpoint at that step, not at the next epoch.

SIGTERM reaches the ranks at different times, or only some of them (one worker pod deleted), so the ranks agree:
after every training step each rank all-reduces (max) whether it has seen one. Every rank takes the same steps, so
every rank makes the same all-reduce at the same step and learns the same answer there: no rank waits in a
collective the others never enter. The one that commits checkpoints writes the step's checkpoint, every rank waits
for that (a second all-reduce: a rank that left earlier would make mpirun stop rank 0 mid-write), and every rank
exits with PREEMPTED_EXIT_CODE.

A SIGTERM before the training steps start (the dataset, the feature cache, the restore) has no step to save: the
rank leaves at once with the same code. On a worker, sshd is the container's first process and the ranks are
started by mpirun through it: the image's entrypoint (scripts/trainer-entrypoint.sh) passes the kubelet's SIGTERM
on to the ranks whose pids this module writes into RANK_PIDS_DIR, and waits for them before it stops sshd.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable, Optional

from scalingrun_api.heartbeat import PREEMPTED_EXIT_CODE
from .collective import Collective

# Where each rank notes its pid for the entrypoint (a worker's writable /tmp); the same path in the entrypoint.
RANK_PIDS_DIR_ENV = "SCALINGRUN_RANK_PIDS_DIR"
DEFAULT_RANK_PIDS_DIR = "/tmp/scalingrun-ranks"


class Preempted(Exception):
    """Every rank agreed to stop at this step; the checkpoint at it is committed."""

    def __init__(self, epoch: int, step: int, noticed_at: Optional[tuple[int, int]] = None):
        seen = (f"; SIGTERM arrived here after step {noticed_at[1]} of epoch {noticed_at[0] + 1}"
                if noticed_at is not None else "")
        super().__init__(f"preempted: every rank stopped after step {step} of epoch {epoch + 1} with a checkpoint "
                         f"there{seen}; exiting with {PREEMPTED_EXIT_CODE} so that the next attempt resumes at that "
                         "step")
        self.epoch, self.step, self.noticed_at = epoch, step, noticed_at


class PreemptionNotice:
    """This rank's SIGTERM: noted while training steps run (`armed`), acted on at once (`leave(code)`) before."""

    def __init__(self, leave: Callable[[int], None]):
        self.leave = leave
        self.requested = False
        self.armed = False
        self.done: tuple[int, int] = (0, 0)  # (epoch, steps of it) trained so far, as the training reports
        self.noticed_at: Optional[tuple[int, int]] = None  # `done` when SIGTERM arrived
        self._pid_file: Optional[str] = None

    def install(self) -> None:
        """The SIGTERM handler, and this rank's pid file. Python takes signals on its main thread only: an attempt
        run from another thread (a notebook's) keeps the default."""
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._on_sigterm)
        folder = os.environ.get(RANK_PIDS_DIR_ENV) or DEFAULT_RANK_PIDS_DIR
        try:
            os.makedirs(folder, exist_ok=True)
            self._pid_file = os.path.join(folder, str(os.getpid()))
            with open(self._pid_file, "w") as f:
                f.write(str(os.getpid()))
        except OSError:  # no writable folder (a local run's read-only tmp): a signal to the process still works
            self._pid_file = None

    def reclaim(self) -> None:
        """The handler again, in place of one a framework put over it: Lightning's (2.x) registers its own at each
        fit, which, for a SIGTERM on any rank but 0, stops that rank alone (and makes a collective inside the
        handler); the ranks agree through `agreed` instead."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def uninstall(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self._pid_file:
            try:
                os.remove(self._pid_file)
            except OSError:
                pass

    def _on_sigterm(self, _number: int, _frame: object) -> None:
        if not self.requested:
            self.requested, self.noticed_at = True, self.done
        if not self.armed:
            self.leave(PREEMPTED_EXIT_CODE)

    def agreed(self, world: Collective) -> bool:
        """Every rank, after the same step: whether any rank has seen SIGTERM (a collective)."""
        return world.allreduce([1.0 if self.requested else 0.0], "max", "preemption_notice")[0] > 0

    @staticmethod
    def committed(world: Collective) -> None:
        """Every rank, after the committing one wrote the step's checkpoint: no rank leaves before it is written."""
        world.allreduce([0.0], "max", "preemption_committed")
