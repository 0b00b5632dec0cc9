"""TF_CONFIG from the MPI world: MultiWorkerMirroredStrategy's cluster is the ranks mpirun started.

Every rank offers its host's address and a free port; an allgather gives every rank the same list, in rank order.
Task index = rank, and worker 0 (rank 0) is the chief: it alone writes progress, checkpoints and the model.

TensorFlow's coordination service declares a worker lost after 10 s without its heartbeat, which a busy node can
starve for that long: its timeout is set to the engine's own collective timeout instead (core/stall.py), after the
stall watch, which names a silent rank first; a rank that exits is seen at once by mpirun anyway.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from ...core.mpi import MpiWorld, host_address

TF_CONFIG = "TF_CONFIG"
JOB = "worker"  # the cluster's one job: every rank is a worker, rank 0 its chief and the coordination leader


def free_port() -> int:
    """A port free now on this host (the TensorFlow server binds it moments later)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def cluster_config(addresses: list[str], rank: int) -> dict[str, Any]:
    """TF_CONFIG's value for the rank-th of `addresses` ("host:port", in rank order)."""
    return {"cluster": {JOB: list(addresses)}, "task": {"type": JOB, "index": rank}}


def coordinate(world_size: int, heartbeat_timeout_seconds: float) -> None:
    """The coordination service MultiWorkerMirroredStrategy would configure (one job of `world_size` workers, led
    by worker 0), with this heartbeat timeout; before the strategy, which then keeps it."""
    from tensorflow.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context

    context.context().configure_coordination_service(
        service_type="standalone", service_leader=f"/job:{JOB}/replica:0/task:0",
        heartbeat_timeout_in_ms=int(heartbeat_timeout_seconds * 1000),
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name=JOB, num_tasks=world_size)])


def tf_config(world: MpiWorld) -> str:
    """This rank's TF_CONFIG (a collective: every rank calls it once)."""
    addresses = world.allgather(f"{host_address()}:{free_port()}")
    return json.dumps(cluster_config(addresses, world.rank))
