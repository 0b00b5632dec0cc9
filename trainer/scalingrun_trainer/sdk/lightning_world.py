"""sdk.lightning_trainer_kwargs(): a Lightning Trainer's accelerator, devices, num_nodes and strategy from the MPI
world that mpirun (an MPIJob's launcher, or `scalingrun run --local`) started.

Lightning counts `devices` per host and starts no processes of its own under an MPI cluster environment: with
`devices=1` per process (Horovod's habit) and two ranks on one host, rank 1 looks for the second device of a list
of one and fails with an IndexError. Here devices is mpirun's local size, num_nodes the world over it.

ddp_world(): torch.distributed's process group over the same world, for a shipped function
(`scalingrun.LightningRunner`, sdk/function.py --ddp-world).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

from .context import ContextError, ranks


def trainer_kwargs(**strategy_options: Any) -> dict[str, Any]:
    """{"accelerator", "devices", "num_nodes", "strategy"} for pl.Trainer(**kwargs, ...): GPUs when torch sees
    them (NCCL), else CPU (gloo); DDP over our MPI environment when there is more than one process.
    `strategy_options` go to DDPStrategy (e.g. timeout=datetime.timedelta(minutes=5) for its collectives)."""
    import torch

    _, size, _, local_size = ranks()
    if size % local_size:
        raise ContextError(f"{size} processes do not split evenly into hosts of {local_size}: give every worker the "
                           "same number of slots")
    gpu = torch.cuda.is_available()
    if gpu and torch.cuda.device_count() < local_size:
        raise ContextError(f"{local_size} processes on this host but torch sees {torch.cuda.device_count()} GPU(s): "
                           "one process per GPU (workers.gpusPerWorker), or fewer processes per worker")
    kwargs: dict[str, Any] = {"accelerator": "gpu" if gpu else "cpu", "devices": local_size,
                              "num_nodes": size // local_size, "strategy": "auto"}
    if size > 1:
        from pytorch_lightning.strategies import DDPStrategy

        from ..frameworks.lightning.cluster import no_forward_buffer_sync
        from .lightning import mpi_environment

        # No buffer sync in forward (a collective per step; ranks' validation shards differ in length), as our
        # trainer does.
        options = {"process_group_backend": "nccl" if gpu else "gloo", **no_forward_buffer_sync(),
                   **strategy_options}
        kwargs["strategy"] = DDPStrategy(cluster_environment=mpi_environment(), **options)
    return kwargs


@contextmanager
def ddp_world() -> Iterator[None]:
    """torch.distributed's default process group over the MPI world, set up as our trainer's DDP sets it up (the
    ranks and rank 0's address from MPIEnvironment, frameworks.lightning.cluster; a free port of rank 0's): NCCL on
    GPUs, else gloo. The torchrun variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, NODE_RANK) are exported for code that reads them. A Lightning Trainer built inside
    (strategy="ddp" or trainer_kwargs()) finds the group set up and uses it. Destroyed once the function returned."""
    import torch
    import torch.distributed as dist

    from ..frameworks.lightning.cluster import mpi_environment

    environment = mpi_environment()
    rank, size, local_rank, local_size = (environment.global_rank(), environment.world_size(),
                                          environment.local_rank(), ranks()[3])
    os.environ.update({"MASTER_ADDR": environment.main_address, "MASTER_PORT": str(environment.main_port),
                       "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local_rank),
                       "LOCAL_WORLD_SIZE": str(local_size), "NODE_RANK": str(environment.node_rank())})
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if gpu else "gloo", init_method="env://", rank=rank, world_size=size)
    # Not on an exception: the rank writes its error before its connections close, so that it is the first
    # written, before the errors of the peers its exit fails.
    yield
    if dist.is_initialized():  # the function may have destroyed it itself
        dist.destroy_process_group()
