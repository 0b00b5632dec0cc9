"""The MPI world (mpi4py) of the engines that mpirun starts without Horovod: keras_mirrored and lightning_ddp."""

from __future__ import annotations

import os
import socket
from typing import Any


def host_address() -> str:
    """This host's address as the other ranks reach it: an MPIJob worker's hostname (<job>-worker-0) is not
    resolvable from the other pods (only its FQDN under the worker Service is), while its IP is reachable from all."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def local_rank_and_size(rank: int, size: int) -> tuple[int, int]:
    """This process's place among the processes on its host, as mpirun says (Open MPI, else MPICH's names)."""
    env = os.environ
    local = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", env.get("MPI_LOCALRANKID", rank)))
    return local, int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", env.get("MPI_LOCALNRANKS", size)))


class MpiWorld:
    """COMM_WORLD as a core.collective.Collective."""

    def __init__(self):
        from mpi4py import MPI

        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def broadcast(self, value: Any, name: str) -> Any:
        return self.comm.bcast(value, root=0)

    def allreduce(self, values: list[float], op: str, name: str) -> list[float]:
        import numpy as np
        from mpi4py import MPI

        sent, received = np.asarray(values, dtype=np.float64), np.empty(len(values), dtype=np.float64)
        self.comm.Allreduce(sent, received, op={"max": MPI.MAX, "sum": MPI.SUM}[op])
        return received.tolist()

    def allgather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank."""
        return self.comm.allgather(value)
