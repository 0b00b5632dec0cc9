"""Lightning's cluster environment under mpirun (an MPIJob's, or `scalingrun run --local`'s): rank and world size
from MPI, the main address rank 0's."""

from __future__ import annotations

import os

from ...core.mpi import host_address


def mpi_environment():
    """Lightning's MPIEnvironment, with rank 0's IP address as the main address instead of its hostname (see
    core.mpi.host_address)."""
    from lightning_fabric.plugins.environments import MPIEnvironment

    class PodMPIEnvironment(MPIEnvironment):
        def _get_main_address(self) -> str:
            return self._comm_world.bcast(os.environ.get("MASTER_ADDR") or host_address(), root=0)

    return PodMPIEnvironment()


def no_forward_buffer_sync(ddp_init=None) -> dict:
    """DDP's option that drops the buffer sync from every forward (a collective per step; ranks' validation shards
    differ in length): forward_sync_buffers from torch 2.13, broadcast_buffers before it (that one also skips the
    sync at the start, where buffers are equal anyway: every rank builds the model from the same weights).
    ddp_init: the DistributedDataParallel.__init__ to read (the installed one by default)."""
    import inspect

    if ddp_init is None:
        from torch.nn.parallel import DistributedDataParallel

        ddp_init = DistributedDataParallel.__init__
    if "forward_sync_buffers" in inspect.signature(ddp_init).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}
