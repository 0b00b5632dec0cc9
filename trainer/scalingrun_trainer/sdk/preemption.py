"""The preemption notice for a script of the user's own (the rules of ../core/preemption.py): on SIGTERM (the
kubelet's, the pod deleted, or the operator's on a node's termination taint) every rank stops at the same step
boundary, rank 0 writes the script's own checkpoint there, and every rank exits with PREEMPTED_EXIT_CODE, which the
operator counts as an interruption and resumes from.

    def save(epoch, step):               # rank 0 only: the script's checkpoint after `step` steps of `epoch`
        ...
    sdk.step_boundary(epoch, step, save)  # every rank, after each training step (a collective over MPI)

KerasCallback(save=...) and LightningCallback(save=...) call it after every step. The SIGTERM handler is installed
by context() (and by the first step_boundary): a SIGTERM before the first step has nothing to save, and the rank
leaves at once with the same code.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

from scalingrun_api.heartbeat import PREEMPTED_EXIT_CODE
from ..core.collective import Collective
from ..core.preemption import Preempted, PreemptionNotice
from ..core.session import leave_now
from .context import ranks

_notice: Optional[PreemptionNotice] = None
_world: Optional[Collective] = None


class _Alone:
    """The world of a script run without a launcher: no one to agree with."""

    rank, size = 0, 1

    def allreduce(self, values: list[float], op: str, name: str) -> list[float]:
        return list(values)


def install() -> PreemptionNotice:
    """This process's notice: the SIGTERM handler and the pid file the image's entrypoint passes SIGTERM on by."""
    global _notice
    if _notice is None:
        _notice = PreemptionNotice(leave_now)
        _notice.install()
    return _notice


def _mpi() -> Collective:
    """COMM_WORLD (mpi4py, imported at the first step) under a launcher; a world of one without."""
    global _world
    if _world is None:
        size = ranks()[1]
        if size > 1:
            from ..core.mpi import MpiWorld

            world = MpiWorld()
            if world.size != size:  # e.g. horovodrun --gloo: no MPI world to agree in
                raise RuntimeError(f"sdk.step_boundary agrees over MPI, but MPI sees {world.size} process(es) of the "
                                   f"launcher's {size}: start the script with mpirun (as a ScalingRun's MPIJob does)")
            _world = world
        else:
            _world = _Alone()
    return _world


def step_boundary(epoch: int, step: int, save: Optional[Callable[[int, int], None]] = None) -> None:
    """Every rank, after each training step, with the same `epoch` (0-based) and `step` (steps of it done): returns
    at once unless a rank has had SIGTERM; then rank 0 calls `save(epoch, step)`, every rank waits for it, and every
    rank exits with PREEMPTED_EXIT_CODE (its next attempt resumes from what `save` wrote: the script's own
    checkpoint, read back by the script)."""
    notice, world = install(), _mpi()
    notice.armed = True
    notice.done = (epoch, step)
    if not notice.agreed(world):
        return
    if world.rank == 0 and save is not None:
        save(epoch, step)
    notice.committed(world)
    print(f"scalingrun sdk (rank {world.rank}/{world.size}): {Preempted(epoch, step, notice.noticed_at)}",
          file=sys.stderr, flush=True)
    leave_now(PREEMPTED_EXIT_CODE)
