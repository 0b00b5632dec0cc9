"""What a rank of `spec.training.command` knows about its run: ranks, the prepared data, where to write, the scaled
batch size and learning rate. Built from the trainer config the operator renders (and the local runner writes)
plus the dataset manifest; no TensorFlow, torch, MPI or kopf needed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from scalingrun_api.config import TrainerConfig
from scalingrun_api.models import AUTO
from scalingrun_api.models.training import CONFIG_PATH as DEFAULT_CONFIG, CONFIG_VARIABLE

from ..core.config import parse_config
from ..core.dataset import Dataset, open_dataset
from ..core.scaling import scale_run
from ..storage import s3fs_options

# The launcher's variables of each rank: Open MPI (mpirun, the MPIJob), Horovod's gloo (horovodrun), torchrun.
_RANK_VARIABLES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
)
# Keys of the trainer config that are not the spec.
_NOT_SPEC = ("run", "processes", "runLocation", "image")


class ContextError(RuntimeError):
    """The run's context cannot be built; the message says what is missing."""


def ranks(environ: Optional[dict[str, str]] = None) -> tuple[int, int, int, int]:
    """(rank, size, local_rank, local_size) from the launcher's environment; (0, 1, 0, 1) without one."""
    env = os.environ if environ is None else environ
    for rank, size, local_rank, local_size in _RANK_VARIABLES:
        if rank in env and size in env:
            world = int(env[size])
            return int(env[rank]), world, int(env.get(local_rank, env[rank])), int(env.get(local_size, world))
    return 0, 1, 0, 1


@dataclass(frozen=True)
class Context:
    """One rank's view of its ScalingRun (see docs/your-own-model.md, "The SDK")."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    run_name: str
    config: TrainerConfig  # the run's trainer config, typed (defaults resolved): what the SDK itself reads
    spec: dict[str, Any]  # the same spec as a dict for scripts (dataset, model, training, ...), camelCase as in YAML
    dataset: Dataset  # the prepared data (manifest): classes, rows, files, row groups
    run_location: str  # progress.json, checkpoints/ and model/ of this run
    storage_options: dict[str, Any]  # fsspec options: fsspec.filesystem("s3", **storage_options) reads s3:// URIs
    batch_size_per_worker: int
    effective_batch_size: int
    learning_rate: float  # baseLearningRate scaled by learningRateScaling for `size` processes
    steps_per_epoch: int  # train rows // effective batch: one epoch sees every training row about once
    max_epochs: int
    seed: int
    params: dict[str, Any] = field(default_factory=dict)  # spec.model.params

    @property
    def train_location(self) -> str:
        """URI of the folder holding the training split's *.parquet files."""
        return self._split_folder("train")

    @property
    def validation_location(self) -> str:
        return self._split_folder("validation")

    @property
    def train_files(self) -> list[str]:
        """The training split's files, exactly (a folder may hold others being written): URIs."""
        return self.dataset.urls("train")

    @property
    def validation_files(self) -> list[str]:
        return self.dataset.urls("validation")

    @property
    def checkpoint_location(self) -> str:
        """A folder of this run for the script's own checkpoints (kept across restarts of the run)."""
        return f"{self.run_location.rstrip('/')}/checkpoints"

    @property
    def model_location(self) -> str:
        """Where the final model goes by convention (pass its URI to sdk.finish)."""
        return f"{self.run_location.rstrip('/')}/model"

    @property
    def classes(self) -> list[str]:
        return list(self.dataset.classes)

    @property
    def num_classes(self) -> int:
        return len(self.dataset.classes)

    @property
    def image_size(self) -> int:
        return self.dataset.image_size

    @property
    def image_column(self) -> str:
        return self.dataset.columns["image"]

    @property
    def label_column(self) -> str:
        return self.dataset.columns["label"]

    @property
    def is_chief(self) -> bool:
        """Rank 0: the one that writes progress, checkpoints and the model."""
        return self.rank == 0

    def _split_folder(self, split: str) -> str:
        return f"{self.dataset.uri.rstrip('/')}/{split}"


def build_context(document: dict[str, Any], environ: Optional[dict[str, str]] = None) -> Context:
    """The Context of this rank from a trainer config document (builders/config.py renders it) and its dataset."""
    rank, size, local_rank, local_size = ranks(environ)
    try:
        config = parse_config(document)
    except ValueError as exc:
        raise ContextError(f"the trainer config is not the one the operator renders: {exc}") from None
    training, storage = config.training, config.storage
    dataset = open_dataset(config.dataset.output, storage.endpoint, storage.region)
    if training.batch_size_per_worker == AUTO:
        raise ContextError("spec.training.batchSizePerWorker is auto: give a number with training.command")
    scaled = scale_run(dataset.rows["train"], training.batch_size_per_worker, training.base_learning_rate,
                       training.learning_rate_scaling, size)
    options = s3fs_options(storage.endpoint) if dataset.uri.startswith("s3://") else {}
    return Context(
        rank=rank, size=size, local_rank=local_rank, local_size=local_size, run_name=config.run, config=config,
        spec={k: v for k, v in document.items() if k not in _NOT_SPEC}, dataset=dataset,
        run_location=config.run_location, storage_options=options, batch_size_per_worker=scaled.batch_size_per_worker,
        effective_batch_size=scaled.effective_batch_size, learning_rate=scaled.learning_rate,
        steps_per_epoch=scaled.steps_per_epoch, max_epochs=training.max_epochs, seed=config.dataset.seed,
        params=dict(config.model.params or {}),
    )
