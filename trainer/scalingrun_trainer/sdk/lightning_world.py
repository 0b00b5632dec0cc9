"""sdk.lightning_trainer_kwargs(): a Lightning Trainer's accelerator, devices, num_nodes and strategy from the MPI
world that mpirun (an MPIJob's launcher, or `scalingrun run --local`) started.

Lightning counts `devices` per host and starts no processes of its own under an MPI cluster environment: with
`devices=1` per process (Horovod's habit) and two ranks on one host, rank 1 looks for the second device of a list
of one and fails with an IndexError. Here devices is mpirun's local size, num_nodes the world over it.
"""

from __future__ import annotations

from typing import Any

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
