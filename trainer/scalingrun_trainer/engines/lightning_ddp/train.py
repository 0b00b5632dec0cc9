"""PyTorch Lightning + DDP transfer learning, started by mpirun (one process per GPU, or per worker on CPU).

Rank, world size and the master address come from MPI (Lightning's MPIEnvironment over mpi4py); the process
group is gloo on CPU and nccl on GPU. Only rank 0 logs, writes progress and checkpoints, and saves the model;
the training order is core/training.py's, the framework's part frameworks/lightning/training.py's.
"""

from __future__ import annotations

from datetime import timedelta

from scalingrun_api.config import TrainerConfig
from scalingrun_api.models import Devices
from ...core.mpi import MpiWorld, local_rank_and_size
from ...core.session import Attempt, TrainingError
from ...core.stall import engine_timeout
from ...core.training import run_training
from ...frameworks.lightning.cluster import mpi_environment, no_forward_buffer_sync
from ...frameworks.lightning.training import FRAMEWORK, LightningTraining


def train(config: TrainerConfig) -> int:
    attempt = Attempt(config, MpiWorld(), engine=FRAMEWORK, trained_on={"framework": FRAMEWORK})
    return attempt.run(lambda: _train(attempt))


def _devices(rank: int, size: int) -> tuple[str, int, int]:
    """(accelerator, devices, num_nodes): devices = processes on this host (mpirun's local size)."""
    import torch

    _, local = local_rank_and_size(rank, size)
    if size % local:
        raise TrainingError(f"{size} processes do not split evenly into hosts of {local}: give every worker "
                            "the same number of slots")
    return ("gpu" if torch.cuda.is_available() else "cpu"), local, size // local


def _train(attempt: Attempt) -> int:
    accelerator, local_size, nodes = _devices(attempt.rank, attempt.size)
    attempt.devices = _visible_devices(accelerator)
    return run_training(attempt, LightningTraining(attempt, accelerator, local_size, nodes,
                                                   lambda: _strategy(accelerator)))


def _visible_devices(accelerator: str) -> Devices:
    """DDP: one GPU per process."""
    if accelerator != "gpu":
        return Devices(kind="cpu", count=0)
    import torch

    return Devices(kind="gpu", count=1, name=torch.cuda.get_device_name(0))


def _strategy(accelerator: str):
    from pytorch_lightning.strategies import DDPStrategy

    # The process group's timeout bounds every collective where the stall watch is not running (core/stall.py).
    timeout = engine_timeout()
    return DDPStrategy(
        cluster_environment=mpi_environment(), process_group_backend="nccl" if accelerator == "gpu" else "gloo",
        **({"timeout": timedelta(seconds=timeout)} if timeout else {}),
        # No buffer sync in forward: it is a collective, and ranks hold different numbers of validation
        # batches. Buffers are synced once at the start; BatchNorm statistics of a trainable base then stay
        # per rank, as with Horovod, and rank 0's are saved.
        **no_forward_buffer_sync(),
    )
