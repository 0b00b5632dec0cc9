"""The trainer's progress document, read into status, pure: status.training, the InputBound condition, and the
messages that quote the epoch reached.

Contract with the trainers: rank 0 writes `<runLocation>/progress.json`, whose schema is
scalingrun_api.progress.Progress (read leniently: a junk value is left out, the rest kept). A resumed attempt
starts its document at the epoch it resumed from. It is read and parsed in one place (documents.read_progress);
everything here works on the model that returns (None: no document yet).
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Optional

from scalingrun_api.models import DeviceKind, Devices, InputEpoch, ScalingRun, TrainingStatus
from scalingrun_api.models.run import DEFAULT_GPU_RESOURCE
from scalingrun_api.progress import INPUT_HISTORY_EPOCHS, Progress, lenient
from scalingrun_api.shipped import shipped_in
from ..builders.config import total_processes
from .status import rfc3339

# What status.training mirrors from progress.json: the fields the two models share, by name.
MIRRORED = frozenset(Progress.model_fields) & frozenset(TrainingStatus.model_fields)
# What describes the last finished epoch: kept together, from one attempt.
_EPOCH_FIELDS = ("epoch", "metrics", "best_epoch", "best_metrics", "images_per_second", "input_wait_fraction",
                 "gpu_utilization", "input_history")
_EPOCH_KEYS = tuple(TrainingStatus.model_fields[name].alias for name in _EPOCH_FIELDS)
# Bounds on what status mirrors from a document the run's own code writes: a status over etcd's request limit
# (about 1.5 MiB) is refused for ever, and every look would try again. Whatever the document holds, the mirrored
# part of status.training stays under about 16 KiB.
MAX_METRICS = 32  # entries of metrics and bestMetrics (the usual ones first)
MAX_METRIC_NAME_CHARS = 64
MAX_PROBE_ROWS = 32  # batchSizeProbe.table
MAX_TEXT_CHARS = 256  # free text (batchSizeProbe.stoppedBy, featureCache.reason): cut
MAX_ID_CHARS = 128  # mlflowRunId: a longer one is no id, left out
MAX_URI_CHARS = 2048  # modelUri: a longer one is left out (a cut URI would name another object)
_USUAL_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")
# InputBound: the share of step time spent waiting for input, over this many epochs in a row.
INPUT_WAIT_THRESHOLD = 0.30
INPUT_BOUND_EPOCHS = 2


def _number(value: Any, kind: type) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return kind(value)


def base_training_status(run: ScalingRun, mpijob_name: str, workers: int) -> dict[str, Any]:
    """What is known before the trainer reports anything, of an MPIJob of `workers` workers."""
    known = {"mpiJobName": mpijob_name, "processes": total_processes(run, workers),
             "maxEpochs": run.spec.training.max_epochs}
    shipped = shipped_in(run.spec.training.command)
    if shipped:
        known["function"] = {"location": shipped[0], "digest": shipped[1]}
    return known


def _or_empty(progress: Optional[Progress]) -> Progress:
    return progress if progress is not None else Progress()


def training_status(progress: Optional[Progress]) -> dict[str, Any]:
    """status.training fields mirrored from a progress document; junk values are left out, not guessed."""
    if progress is None:
        return {}
    present = MIRRORED & progress.model_fields_set
    # Nested fields are the status models (status.training's schema): every set value, defaults included.
    mirrored = progress.model_dump(by_alias=True, include=present, exclude_none=True)
    if "inputHistory" in mirrored:
        mirrored["inputHistory"].sort(key=lambda entry: entry["epoch"])
    out = _bounded(mirrored)
    hours = progress.process_hours()
    if hours is not None:
        out["processHours"] = hours
        if progress.devices is not None and progress.devices.kind == DeviceKind.gpu.value and progress.devices.count:
            out["gpuHours"] = round(hours * progress.devices.count, 4)
    return out


def _metrics(values: dict[str, float]) -> dict[str, float]:
    names = sorted((k for k in values if len(k) <= MAX_METRIC_NAME_CHARS),
                   key=lambda k: (k not in _USUAL_METRICS, _USUAL_METRICS.index(k) if k in _USUAL_METRICS else 0, k))
    return {k: values[k] for k in names[:MAX_METRICS]}


def _text(value: str) -> str:
    return value if len(value) <= MAX_TEXT_CHARS else value[:MAX_TEXT_CHARS - 1] + "…"


def _bounded(mirrored: dict[str, Any]) -> dict[str, Any]:
    """`mirrored` with every list, dict and string cut to its bound (see MAX_*)."""
    out = dict(mirrored)
    for key in ("metrics", "bestMetrics"):
        if key in out:
            out[key] = _metrics(out[key])
    if "inputHistory" in out:
        out["inputHistory"] = out["inputHistory"][-INPUT_HISTORY_EPOCHS:]
    if len(out.get("mlflowRunId") or "") > MAX_ID_CHARS:
        del out["mlflowRunId"]
    probe = out.get("batchSizeProbe")
    if probe:
        out["batchSizeProbe"] = {**probe, "table": probe.get("table", [])[:MAX_PROBE_ROWS]}
        if isinstance(probe.get("stoppedBy"), str):
            out["batchSizeProbe"]["stoppedBy"] = _text(probe["stoppedBy"])
    cache = out.get("featureCache")
    if cache and isinstance(cache.get("reason"), str):
        out["featureCache"] = {**cache, "reason": _text(cache["reason"])}
    return out


def input_history(value: Any) -> list[dict[str, Any]]:
    """progress.json's inputHistory, numbers only, in epoch order."""
    entries = [lenient(InputEpoch, item) for item in value] if isinstance(value, list) else []
    return [entry.model_dump(by_alias=True, exclude_none=True)
            for entry in sorted((e for e in entries if e is not None), key=lambda e: e.epoch)]


def input_bound(run: ScalingRun, history: Any) -> Optional[tuple[str, str, str]]:
    """The InputBound condition (status, reason, message) from the input history; None before any epoch
    was measured. True when the input wait exceeded INPUT_WAIT_THRESHOLD of step time in each of the
    last INPUT_BOUND_EPOCHS consecutive epochs; False again as soon as an epoch stays below it."""
    measured = [row for row in input_history(history) if "inputWaitFraction" in row]
    if not measured:
        return None
    last = measured[-INPUT_BOUND_EPOCHS:]
    shares = " and ".join(f"{row['inputWaitFraction']:.0%}" for row in last)
    epochs = " and ".join(str(row["epoch"]) for row in last)
    gpu = [row["gpuUtilization"] for row in last if "gpuUtilization" in row]
    gpu_text = f"; GPU {gpu[-1]:.0f}% busy" if gpu else ""
    consecutive = [row["epoch"] for row in last] == list(range(last[0]["epoch"], last[0]["epoch"] + len(last)))
    if (len(last) == INPUT_BOUND_EPOCHS and consecutive
            and all(row["inputWaitFraction"] > INPUT_WAIT_THRESHOLD for row in last)):
        reading = run.spec.training.input
        return ("True", "InputWaitHigh",
                f"training waited for input batches {shares} of its step time in epochs {epochs} (over "
                f"{INPUT_WAIT_THRESHOLD:.0%} {INPUT_BOUND_EPOCHS} epochs in a row{gpu_text}): the reader does not "
                f"keep up with the model. Try more reader threads (spec.training.input.readerWorkers, now "
                f"{reading.reader_workers}), a larger row-group read-ahead (spec.training.input.rowGroupCache, now "
                f"{reading.row_group_cache}), or fewer, larger shards (a lower "
                f"spec.dataset.preprocessing.parallelism, now {run.spec.dataset.preprocessing.parallelism}, "
                "writes fewer, larger files)")
    return ("False", "InputKeepsUp",
            f"input wait {last[-1]['inputWaitFraction']:.0%} of step time in epoch {last[-1]['epoch']}{gpu_text} "
            f"(InputBound above {INPUT_WAIT_THRESHOLD:.0%} for {INPUT_BOUND_EPOCHS} epochs in a row)")


def gpus_unused(run: ScalingRun, place: str, devices: Any) -> Optional[tuple[str, str, str]]:
    """The GPUsUnused condition (status, reason, message) for a run that asked for GPUs, from what rank 0 trains on
    (status.training.devices; `place`: where rank 0 runs, "in image ..."); None when no GPU was asked for or the
    trainer has not said yet."""
    asked = run.spec.workers.gpus_per_worker
    found = lenient(Devices, devices)
    if not asked or found is None:
        return None
    if found.kind == DeviceKind.gpu.value:
        name = f" ({found.name})" if found.name else ""
        return ("False", "GPUsInUse", f"rank 0 trains on {found.count} GPU(s){name}")
    return ("True", "NoGPUVisible",
            f"spec.workers.gpusPerWorker is {asked}, but rank 0 trains on CPU: its process sees no GPU "
            f"{place}. Use a CUDA build of the image (spec.workers.image), check that the GPU nodes run the NVIDIA "
            f"device plugin (kubectl describe node: {run.spec.workers.gpu_resource or DEFAULT_GPU_RESOURCE} "
            "allocatable) and that "
            "spec.workers.nodeSelector picks them; or set gpusPerWorker: 0 to train on CPU on purpose")


def merge_training_status(previous: dict[str, Any], base: dict[str, Any], mirrored: dict[str, Any],
                          same_mpijob: bool) -> dict[str, Any]:
    """status.training for this pass: the epoch never goes back while the MPIJob is the same one.

    A restarted launcher (a worker lost, say) starts a new attempt whose progress document may report an
    earlier epoch, or none yet, until it passes the one already shown; until then the figures of the last
    epoch shown are kept. A new MPIJob (deleted and recreated) starts from what its trainer reports.
    """
    out = {**(previous if same_mpijob else {}), **base}
    shown = _number(out.get("epoch"), int)
    reported = _number(mirrored.get("epoch"), int)
    if same_mpijob and shown is not None and (reported is None or reported < shown):
        mirrored = {k: v for k, v in mirrored.items() if k not in _EPOCH_KEYS}
    out.update(mirrored)
    return out


def estimated_completion(previous: dict[str, Any], shown: dict[str, Any], progress: Optional[Progress],
                         moment: dt.datetime) -> Optional[str]:
    """When the training would reach maxEpochs at this attempt's mean epoch time. Computed when a new epoch is shown
    and kept until the next one: a look that brings no news must not change status."""
    epoch, max_epochs = _number(shown.get("epoch"), int), _number(shown.get("maxEpochs"), int)
    if previous.get("estimatedCompletion") and _number(previous.get("epoch"), int) == epoch:
        return previous["estimatedCompletion"]
    read = _or_empty(progress)
    epochs_timed = (read.epoch or 0) - (read.resumed_from_epoch or 0)
    if not epoch or not max_epochs or read.epoch != epoch or epochs_timed <= 0 or not read.elapsed_seconds:
        return None
    left = read.elapsed_seconds / epochs_timed * max(max_epochs - epoch, 0)
    return rfc3339(moment + dt.timedelta(seconds=round(left)))


def model_uri(progress: Optional[Progress]) -> Optional[str]:
    uri = _or_empty(progress).model_uri
    return uri if uri and len(uri) <= MAX_URI_CHARS else None


def epochs_text(progress: Optional[Progress]) -> str:
    read = _or_empty(progress)
    if read.epoch is None:
        return "no epoch finished"
    return f"epoch {read.epoch}" + (f" of {read.max_epochs}" if read.max_epochs else "")


def running_message(name: str, progress: Optional[Progress]) -> str:
    text = f"MPIJob {name}: {epochs_text(progress)}"
    metrics = _or_empty(progress).metrics
    if "val_accuracy" in metrics:
        text += f", val_accuracy {metrics['val_accuracy']:.4f}"
    return text


def succeeded_message(name: str, progress: Optional[Progress]) -> str:
    """Names each figure it quotes: the kept model is the best epoch's, and its training accuracy is not its
    validation accuracy."""
    text = f"MPIJob {name} succeeded after {epochs_text(progress)}"
    read = _or_empty(progress)
    best = _metrics(read.best_metrics)
    if best:
        validation = sorted(k for k in best if k.startswith("val_"))
        training = sorted(k for k in best if not k.startswith("val_"))
        text += f"; the model is epoch {read.best_epoch}'s" if read.best_epoch else "; the model's"
        text += ": " + ", ".join(f"{k} {best[k]:.4f}" for k in validation)
        if training:
            text += (", " if validation else "") + "training " + ", ".join(f"{k} {best[k]:.4f}" for k in training)
    uri = model_uri(progress)
    return text + (f"; model at {uri}" if uri else "")
