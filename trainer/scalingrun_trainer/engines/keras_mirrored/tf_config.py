"""TF_CONFIG from the MPI world: MultiWorkerMirroredStrategy's cluster is the ranks mpirun started.

Every rank offers its host's address and a free port; an allgather gives every rank the same list, in rank order.
Task index = rank, and worker 0 (rank 0) is the chief: it alone writes progress, checkpoints and the model.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from ...core.mpi import MpiWorld, host_address

TF_CONFIG = "TF_CONFIG"


def free_port() -> int:
    """A port free now on this host (the TensorFlow server binds it moments later)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def cluster_config(addresses: list[str], rank: int) -> dict[str, Any]:
    """TF_CONFIG's value for the rank-th of `addresses` ("host:port", in rank order)."""
    return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": rank}}


def tf_config(world: MpiWorld) -> str:
    """This rank's TF_CONFIG (a collective: every rank calls it once)."""
    addresses = world.allgather(f"{host_address()}:{free_port()}")
    return json.dumps(cluster_config(addresses, world.rank))
