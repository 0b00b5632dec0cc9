"""The SDK for `spec.training.command`: your own training script on every rank, with our ladder around it.

    from scalingrun_trainer import sdk

    ctx = sdk.context()                  # rank, size, local_rank, spec, the prepared data, scaled batch and LR
    data = sdk.tf_dataset("train")       # or sdk.torch_batches("train"): this rank's shard, uint8 NHWC batches
    ...                                  # train: Keras + Horovod, plain PyTorch DDP or Lightning
    sdk.heartbeat(step)                  # in your loop, every step or so (cheap: written at most every 30 s)
    sdk.report_epoch(epoch, {"loss": .., "val_loss": .., "val_accuracy": ..}, images_per_second)
    sdk.finish(model_uri)                # rank 0: progress.json succeeded, with the model's URI

Rank 0 writes the same `<runLocation>/progress.json` as our trainers (other ranks return at once), so status,
`kubectl get srun`, the report, MLflow, sweeps and InputBound work. An exception that escapes the script is
written there as the run's error. `sdk.KerasCallback()` and `sdk.LightningCallback()` call report_epoch for you;
`sdk.lightning_mpi_environment()` is the cluster environment our Lightning trainer gives DDP under mpirun, and
`pl.Trainer(**sdk.lightning_trainer_kwargs(), ...)` sets accelerator, devices, num_nodes and strategy from the MPI
world.
Importing this module needs neither TensorFlow, torch, MPI nor kopf; the readers and callbacks import their
framework when first used. Reference: docs/your-own-model.md.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from ..core.config import parse_config
from .context import CONFIG_VARIABLE, DEFAULT_CONFIG, Context, ContextError, build_context, ranks
from .session import Session, install_excepthook

__all__ = ["Context", "ContextError", "context", "heartbeat", "report_epoch", "finish", "tf_dataset", "torch_batches",
           "KerasCallback", "LightningCallback", "lightning_mpi_environment", "lightning_trainer_kwargs", "ranks"]

_session: Optional[Session] = None  # this process's run, made by the first context() (like hvd.init())


def context(config_path: Optional[str] = None) -> Context:
    """This rank's Context (see context.py); the first call also starts rank 0's progress document.

    The trainer config is read from `config_path`, else $SCALINGRUN_CONFIG, else /etc/scalingrun/config.json
    (where the operator mounts it in the MPIJob's pods)."""
    global _session
    if _session is None:
        path = config_path or os.environ.get(CONFIG_VARIABLE) or DEFAULT_CONFIG
        try:
            with open(path) as f:
                document = json.load(f)
        except OSError as exc:
            raise ContextError(f"cannot read the run's trainer config {path} ({exc.strerror}): run the script through "
                               f"a ScalingRun's training.command, or set {CONFIG_VARIABLE}") from None
        _session = Session(build_context(document), parse_config(document), log=lambda line: print(line, flush=True))
        install_excepthook(_session)
    return _session.context


def heartbeat(step: int, epoch: Optional[int] = None, phase: str = "training") -> None:
    """The training loop is alive at `step` (steps since the start; `epoch`: 0-based, the one under way). Call it
    from the loop itself, every step or so, never from a thread of your own: a thread would keep beating while the
    loop is stuck. Rank 0 writes `<runLocation>/heartbeat.json` at most every 30 s (other ranks return at once);
    the operator restarts or fails a run whose heartbeat stops for spec.training.stallTimeout. Phases: "training",
    "validation", "saving", "restore" (any phase of scalingrun_api.heartbeat.HeartbeatPhase)."""
    context()
    _session.beat(step, epoch, phase)


def report_epoch(epoch: int, metrics: dict[str, float], images_per_second: float,
                 input_wait_fraction: Optional[float] = None) -> None:
    """Rank 0: one finished epoch (1-based) into progress.json; other ranks return at once.

    `metrics` as Keras names them ({"loss", "accuracy", "val_loss", "val_accuracy"}; any others are kept too),
    averaged over the ranks (Horovod's MetricAverageCallback, Lightning's sync_dist); images_per_second: training
    throughput of all ranks together; input_wait_fraction: the share of step time spent waiting for data (0-1),
    which drives the InputBound condition."""
    context()
    _session.report_epoch(epoch, metrics, images_per_second, input_wait_fraction)


def finish(model_uri: Optional[str] = None) -> None:
    """Rank 0: the run succeeded (progress.json state succeeded, the model's URI in status.modelUri). Stops the
    SDK's readers on every rank."""
    context()
    _session.finish(model_uri)


def tf_dataset(split: str, batch_size: Optional[int] = None):
    """This rank's shard of a split as a tf.data.Dataset of (uint8 images (N, S, S, 3), int32 labels).

    "train" repeats forever (fit with steps_per_epoch=ctx.steps_per_epoch); "validation" is read once per
    iteration, unshuffled. Row groups are shuffled with the run's seed, then split between the ranks."""
    from ..keras.data import make_dataset

    ctx = context()
    data, reader = make_dataset(ctx.dataset, split, rank=ctx.rank, size=ctx.size,
                                batch_size=batch_size or ctx.batch_size_per_worker, seed=ctx.seed,
                                **_reading(ctx))
    _session.readers.append(reader)
    return data


def torch_batches(split: str, batch_size: Optional[int] = None):
    """This rank's shard of a split as an iterable of (uint8 tensor (N, S, S, 3), int64 tensor): "train" yields
    ctx.steps_per_epoch batches per iteration from an endless reader, "validation" the whole shard once."""
    from ..lightning.data import TrainBatches, ValidationBatches

    ctx = context()
    size = batch_size or ctx.batch_size_per_worker
    if split == "train":
        batches = TrainBatches(ctx.dataset, rank=ctx.rank, size=ctx.size, batch_size=size,
                               steps=ctx.steps_per_epoch, seed=ctx.seed)
        _session.readers.append(batches)
        return batches
    if split == "validation":
        return ValidationBatches(ctx.dataset, rank=ctx.rank, size=ctx.size, batch_size=size, seed=ctx.seed)
    raise ValueError(f"split must be train or validation, got {split!r}")


def _reading(ctx: Context) -> dict[str, int]:
    reader = ctx.config.training.input
    return {"reader_threads": reader.reader_workers, "row_group_cache": reader.row_group_cache}


def __getattr__(name: str) -> Any:
    """The callbacks import their framework only when asked for."""
    if name == "KerasCallback":
        from .keras import KerasCallback

        return KerasCallback
    if name == "LightningCallback":
        from ..lightning.sdk import LightningCallback

        return LightningCallback
    if name == "lightning_mpi_environment":
        from ..lightning.sdk import mpi_environment

        return mpi_environment
    if name == "lightning_trainer_kwargs":
        from ..lightning.world import trainer_kwargs

        return trainer_kwargs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
