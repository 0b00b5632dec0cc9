"""The SDK for `spec.training.command`: your own training script on every rank, with our ladder around it.

    from scalingrun_trainer import sdk

    ctx = sdk.context()                  # rank, size, local_rank, spec, the prepared data, scaled batch and LR
    data = sdk.tf_dataset("train")       # or sdk.torch_batches("train"): this rank's shard, uint8 NHWC batches
    ...                                  # train: Keras + Horovod, plain PyTorch DDP or Lightning
    sdk.heartbeat(step)                  # in your loop, every step or so (cheap: written at most every 30 s)
    sdk.report_epoch(epoch, {"loss": .., "val_loss": .., "val_accuracy": ..}, images_per_second)
    sdk.step_boundary(epoch, step, save) # every rank, after each step: on SIGTERM, save() on rank 0, then exit 76
    sdk.finish(model_uri)                # rank 0: progress.json succeeded, with the model's URI

Rank 0 writes the same `<runLocation>/progress.json` as our trainers (other ranks return at once), so status,
`kubectl get srun`, the report, MLflow, sweeps and InputBound work. An exception that escapes the script is
written there as the run's error. `sdk.KerasCallback()` and `sdk.LightningCallback()` call report_epoch for you;
with `save=` (the script's checkpoint at a step) they also call step_boundary after every step (sdk/preemption.py);
`sdk.lightning_mpi_environment()` is the cluster environment our Lightning trainer gives DDP under mpirun, and
`pl.Trainer(**sdk.lightning_trainer_kwargs(), ...)` sets accelerator, devices, num_nodes and strategy from the MPI
world.
Importing this module needs neither TensorFlow, torch, MPI nor kopf; the readers and callbacks import their
framework when first used. Reference: docs/your-own-model.md.
"""

from __future__ import annotations

from typing import Any

from .context import Context, ContextError, ranks
from .preemption import step_boundary
from .run import context, finish, heartbeat, report_epoch, tf_dataset, torch_batches

__all__ = ["Context", "ContextError", "context", "heartbeat", "report_epoch", "finish", "tf_dataset", "torch_batches",
           "step_boundary", "KerasCallback", "LightningCallback", "lightning_mpi_environment",
           "lightning_trainer_kwargs", "ranks"]


def __getattr__(name: str) -> Any:
    """The callbacks import their framework only when asked for."""
    if name == "KerasCallback":
        from .keras import KerasCallback

        return KerasCallback
    if name == "LightningCallback":
        from .lightning import LightningCallback

        return LightningCallback
    if name == "lightning_mpi_environment":
        from .lightning import mpi_environment

        return mpi_environment
    if name == "lightning_trainer_kwargs":
        from .lightning_world import trainer_kwargs

        return trainer_kwargs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
