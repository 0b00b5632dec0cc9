"""The trainer's progress document, read into status, pure: status.training, the InputBound condition, and the
messages that quote the epoch reached.

Contract with the trainer (scalingrun_trainer.progress): rank 0 writes `<runLocation>/progress.json`
{"state", "epoch", "maxEpochs", "metrics", "bestEpoch", "bestMetrics", "imagesPerSecond",
"elapsedSeconds", "learningRate", "effectiveBatchSize", "processes", "modelUri", "error", "mlflowRunId",
"resumedFromEpoch", "batchSizePerWorker", "batchSizeProbe", "inputWaitFraction", "gpuUtilization",
"inputHistory"}. A resumed attempt starts its document at the epoch it resumed from. It is read in one
place (documents.read_progress); everything here works on what that returns.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from scalingrun_api.models import ScalingRun
from ..builders.config import total_processes

# progress.json key -> status.training key, with the type the status schema wants.
_MIRRORED = {
    "epoch": ("epoch", int),
    "maxEpochs": ("maxEpochs", int),
    "bestEpoch": ("bestEpoch", int),
    "imagesPerSecond": ("imagesPerSecond", float),
    "learningRate": ("learningRate", float),
    "effectiveBatchSize": ("effectiveBatchSize", int),
    "processes": ("processes", int),
    "resumedFromEpoch": ("resumedFromEpoch", int),
    "batchSizePerWorker": ("batchSizePerWorker", int),
    "inputWaitFraction": ("inputWaitFraction", float),
    "gpuUtilization": ("gpuUtilization", float),
}
# What describes the last finished epoch: kept together, from one attempt.
_EPOCH_KEYS = ("epoch", "metrics", "bestEpoch", "bestMetrics", "imagesPerSecond", "inputWaitFraction",
               "gpuUtilization", "inputHistory")
# InputBound: the share of step time spent waiting for input, over this many epochs in a row.
INPUT_WAIT_THRESHOLD = 0.30
INPUT_BOUND_EPOCHS = 2


def _number(value: Any, kind: type) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return kind(value)


def _metrics(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    out = {}
    for key, number in value.items():
        number = _number(number, float)
        if number is not None:
            out[str(key)] = number
    return out


def base_training_status(run: ScalingRun, mpijob_name: str) -> dict[str, Any]:
    """What is known before the trainer reports anything."""
    return {"mpiJobName": mpijob_name, "processes": total_processes(run),
            "maxEpochs": run.spec.training.max_epochs}


def training_status(progress: Optional[dict[str, Any]]) -> dict[str, Any]:
    """status.training fields mirrored from a progress document; junk values are left out, not guessed."""
    if not progress:
        return {}
    out: dict[str, Any] = {}
    for source, (target, kind) in _MIRRORED.items():
        value = _number(progress.get(source), kind)
        if value is not None:
            out[target] = value
    for source in ("metrics", "bestMetrics"):
        if isinstance(progress.get(source), dict):
            out[source] = _metrics(progress[source])
    run_id = progress.get("mlflowRunId")
    if isinstance(run_id, str) and run_id:
        out["mlflowRunId"] = run_id
    probe = _probe(progress.get("batchSizeProbe"))
    if probe:
        out["batchSizeProbe"] = probe
    if isinstance(progress.get("inputHistory"), list):
        out["inputHistory"] = input_history(progress["inputHistory"])
    return out


def _probe(value: Any) -> Optional[dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    out: dict[str, Any] = {}
    for key, kind in (("chosen", int), ("seconds", float)):
        number = _number(value.get(key), kind)
        if number is not None:
            out[key] = number
    if isinstance(value.get("stoppedBy"), str):
        out["stoppedBy"] = value["stoppedBy"]
    table = []
    for row in value.get("table") or []:
        size = _number((row or {}).get("batchSize"), int) if isinstance(row, dict) else None
        if size is None:
            continue
        entry: dict[str, Any] = {"batchSize": size, "outOfMemory": row.get("outOfMemory") is True}
        rate = _number(row.get("imagesPerSecond"), float)
        if rate is not None:
            entry["imagesPerSecond"] = rate
        table.append(entry)
    out["table"] = table
    return out


def input_history(value: Any) -> list[dict[str, Any]]:
    """progress.json's inputHistory, numbers only, in epoch order."""
    out = []
    for entry in value if isinstance(value, list) else []:
        epoch = _number((entry or {}).get("epoch"), int) if isinstance(entry, dict) else None
        if epoch is None:
            continue
        row: dict[str, Any] = {"epoch": epoch}
        for key in ("inputWaitFraction", "gpuUtilization"):
            number = _number(entry.get(key), float)
            if number is not None:
                row[key] = number
        out.append(row)
    return sorted(out, key=lambda row: row["epoch"])


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


def model_uri(progress: Optional[dict[str, Any]]) -> Optional[str]:
    value = (progress or {}).get("modelUri")
    return value if isinstance(value, str) and value else None


def epochs_text(progress: Optional[dict[str, Any]]) -> str:
    if not progress or _number(progress.get("epoch"), int) is None:
        return "no epoch finished"
    text = f"epoch {int(progress['epoch'])}"
    if _number(progress.get("maxEpochs"), int):
        text += f" of {int(progress['maxEpochs'])}"
    return text


def running_message(name: str, progress: Optional[dict[str, Any]]) -> str:
    text = f"MPIJob {name}: {epochs_text(progress)}"
    metrics = _metrics((progress or {}).get("metrics"))
    if "val_accuracy" in metrics:
        text += f", val_accuracy {metrics['val_accuracy']:.4f}"
    return text


def succeeded_message(name: str, progress: Optional[dict[str, Any]]) -> str:
    text = f"MPIJob {name} succeeded after {epochs_text(progress)}"
    best = _metrics((progress or {}).get("bestMetrics"))
    if best:
        text += "; best " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(best.items()))
    uri = model_uri(progress)
    return text + (f"; model at {uri}" if uri else "")
