"""This process's run as the SDK's functions see it (the package re-exports them): the Session that the first
context() makes, and the readers it hands out."""

from __future__ import annotations

import json
import os
from typing import Optional

from ..core.config import parse_config
from .context import CONFIG_VARIABLE, DEFAULT_CONFIG, Context, ContextError, build_context
from .preemption import install as install_preemption_notice
from .session import Session, install_excepthook

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
        install_preemption_notice()
    return _session.context


def started_session() -> Optional[Session]:
    """The Session a context() call made in this process, if any: the shipped-function runner ends it."""
    return _session


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
    from ..frameworks.keras.data import make_dataset

    ctx = context()
    data, reader = make_dataset(ctx.dataset, split, rank=ctx.rank, size=ctx.size,
                                batch_size=batch_size or ctx.batch_size_per_worker, seed=ctx.seed,
                                **_reading(ctx))
    _session.readers.append(reader)
    return data


def torch_batches(split: str, batch_size: Optional[int] = None):
    """This rank's shard of a split as an iterable of (uint8 tensor (N, S, S, 3), int64 tensor): "train" yields
    ctx.steps_per_epoch batches per iteration from an endless reader, "validation" the whole shard once."""
    from ..frameworks.lightning.data import TrainBatches, ValidationBatches

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
