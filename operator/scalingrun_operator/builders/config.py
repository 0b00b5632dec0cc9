"""The trainer's config: the parts of the spec the containers need, with derived values resolved."""

from __future__ import annotations

import json
from typing import Any

from scalingrun_api.models import ScalingRun
from .common import config_map_name, metadata, trainer_image

CONFIG_KEY = "config.json"


def slots_per_worker(run: ScalingRun) -> int:
    return max(run.spec.workers.gpus_per_worker, 1)


def total_processes(run: ScalingRun) -> int:
    return run.spec.workers.replicas * slots_per_worker(run)


def dataset_readers(run: ScalingRun) -> int:
    """Processes the dataset is laid out for: this run's, or more (a sweep's largest point) to share it."""
    return max(total_processes(run), run.spec.dataset.preprocessing.readers or 0)


def run_location(run: ScalingRun) -> str:
    """Checkpoints, progress and model of this run."""
    explicit = run.spec.training.checkpoint.location
    return explicit or f"{run.spec.dataset.output.rstrip('/')}/runs/{run.metadata.name}"


def build_trainer_config(run: ScalingRun) -> dict[str, Any]:
    spec = run.spec.model_dump(mode="json", by_alias=True, exclude={"workers", "run_policy"})
    spec["storage"] = {k: spec["storage"][k] for k in ("endpoint", "region")}  # no Secret names
    if spec.get("tracking"):
        spec["tracking"] = {k: v for k, v in spec["tracking"].items() if k != "credentialsSecret"}
    return {
        "run": run.metadata.name,
        "processes": total_processes(run),
        "runLocation": run_location(run),
        "image": trainer_image(run),  # named in errors about what the image lacks (a model.builder's package)
        **spec,
    }


def build_config_map(run: ScalingRun, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(run, config_map_name(run), namespace, "config"),
        "data": {CONFIG_KEY: json.dumps(build_trainer_config(run), indent=2, sort_keys=True)},
    }
