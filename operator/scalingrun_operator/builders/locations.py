"""Where a run's documents live in storage: the dataset manifest and shard manifests the preprocessing
writes, and the progress document and the logs the trainer writes in the run location."""

from __future__ import annotations

from scalingrun_api.heartbeat import HEARTBEAT_FILE
from scalingrun_api.manifest import MANIFEST_FILE, SHARDS_FOLDER
from scalingrun_api.logs import LOGS_FOLDER
from scalingrun_api.models import ScalingRun
from scalingrun_api.progress import PROGRESS_FILE
from .config import run_location


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def manifest_uri(run: ScalingRun) -> str:
    return join(run.spec.dataset.output, MANIFEST_FILE)


def shards_uri(run: ScalingRun) -> str:
    return join(run.spec.dataset.output, SHARDS_FOLDER)


def progress_uri(run: ScalingRun) -> str:
    return join(run_location(run), PROGRESS_FILE)


def heartbeat_uri(run: ScalingRun) -> str:
    return join(run_location(run), HEARTBEAT_FILE)


def logs_uri(run: ScalingRun) -> str:
    """Where the launcher archives each attempt's log (scalingrun_api.logs): status.logs."""
    return join(run_location(run), LOGS_FOLDER)
