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
