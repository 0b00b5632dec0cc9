"""The trainer's config: the parts of the spec the containers need, with derived values resolved."""

from __future__ import annotations

import json
from typing import Any, Optional

from scalingrun_api.config import CONFIG_FILE_NAME, TrainerConfig
from scalingrun_api.engines import engine
from scalingrun_api.models import ScalingRun
from .common import config_map_name, metadata, trainer_image

CONFIG_KEY = CONFIG_FILE_NAME


def slots_per_worker(run: ScalingRun) -> int:
    """MPI slots, = training processes, per worker pod: one per GPU; multi-worker-mirrored runs one process per pod
    that drives all of the pod's GPUs."""
    training = run.spec.training
    return engine(training.framework, training.strategy).slots_per_worker(run.spec.workers.gpus_per_worker)


def total_processes(run: ScalingRun, workers: Optional[int] = None) -> int:
    """Training processes of `run` at `workers` workers (None: spec.workers.replicas, the most)."""
    return (run.spec.workers.replicas if workers is None else workers) * slots_per_worker(run)


def dataset_readers(run: ScalingRun) -> int:
    """Processes the dataset is laid out for: this run's, or more (a sweep's largest point) to share it."""
    return max(total_processes(run), run.spec.dataset.preprocessing.readers or 0)


def run_location(run: ScalingRun) -> str:
    """Checkpoints, progress and model of this run."""
    explicit = run.spec.training.checkpoint.location
    return explicit or f"{run.spec.dataset.output.rstrip('/')}/runs/{run.metadata.name}"


def build_trainer_config(run: ScalingRun) -> dict[str, Any]:
    """config.json (scalingrun_api.config.TrainerConfig): no Secret names, only what the containers use."""
    spec = run.spec
    return TrainerConfig(run=run.metadata.name, processes=total_processes(run), run_location=run_location(run),
                         image=trainer_image(run), storage=spec.storage, dataset=spec.dataset, model=spec.model, training=spec.training,
                         tracking=spec.tracking).document()


def build_config_map(run: ScalingRun, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(run, config_map_name(run), namespace, "config"),
        "data": {CONFIG_KEY: json.dumps(build_trainer_config(run), indent=2, sort_keys=True)},
    }
