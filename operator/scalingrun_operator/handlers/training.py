"""Training decisions, pure: the MPIJob's state, status.training from the trainer's progress document.

Contract with the trainers: rank 0 writes `<runLocation>/progress.json`, whose schema is
scalingrun_api.progress.Progress (read leniently: a junk value is left out, the rest kept). A resumed attempt
starts its document at the epoch it resumed from.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any, Optional

from scalingrun_api.models import InputEpoch, ScalingRun, TrainingStatus
from scalingrun_api.progress import PROGRESS_FILE, Progress, lenient
from ..builders.config import run_location, total_processes
from ..status import parse_time
from ..storage import join

# What status.training mirrors from progress.json: the fields the two models share, by name.
MIRRORED = sorted(set(Progress.model_fields) & set(TrainingStatus.model_fields))
# What describes the last finished epoch: kept together, from one attempt.
_EPOCH_FIELDS = ("epoch", "metrics", "best_epoch", "best_metrics", "images_per_second", "input_wait_fraction",
                 "gpu_utilization", "input_history")
_EPOCH_KEYS = tuple(TrainingStatus.model_fields[name].alias for name in _EPOCH_FIELDS)
# InputBound: the share of step time spent waiting for input, over this many epochs in a row.
INPUT_WAIT_THRESHOLD = 0.30
INPUT_BOUND_EPOCHS = 2


def progress_uri(run: ScalingRun) -> str:
    return join(run_location(run), PROGRESS_FILE)


def _number(value: Any, kind: type) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return kind(value)


def base_training_status(run: ScalingRun, mpijob_name: str) -> dict[str, Any]:
    """What is known before the trainer reports anything."""
    return {"mpiJobName": mpijob_name, "processes": total_processes(run),
            "maxEpochs": run.spec.training.max_epochs}


def training_status(progress: Optional[dict[str, Any]]) -> dict[str, Any]:
    """status.training fields mirrored from a progress document; junk values are left out, not guessed."""
    if not progress:
        return {}
    read = Progress.read(progress)
    read.input_history.sort(key=lambda entry: entry.epoch)
    present = {name for name in MIRRORED if name in read.model_fields_set}
    # Nested fields are the status models (status.training's schema): every set value, defaults included.
    return read.model_dump(by_alias=True, include=present, exclude_none=True)


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
    return Progress.read(progress).model_uri or None


@dataclass(frozen=True)
class MPIJobState:
    state: str  # Pending, Created, Running, Restarting, Suspended, Succeeded or Failed
    reason: str = ""
    message: str = ""
    suspended: bool = False  # spec.runPolicy.suspend as the MPIJob has it
    finished_at: Optional[dt.datetime] = None

    @property
    def finished(self) -> bool:
        return self.state in ("Succeeded", "Failed")


_ORDER = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")


def mpijob_state(mpijob: dict[str, Any]) -> MPIJobState:
    """The MPIJob's state from its conditions (set by the mpi-operator); a finished state wins."""
    status = mpijob.get("status") or {}
    suspended = bool(((mpijob.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
    true = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    for kind in _ORDER:
        if kind in true:
            condition = true[kind]
            finished = None
            if kind in ("Failed", "Succeeded"):
                finished = parse_time(status.get("completionTime")) or parse_time(condition.get("lastTransitionTime"))
            return MPIJobState(kind, condition.get("reason") or "", condition.get("message") or "", suspended,
                               finished)
    return MPIJobState("Pending", suspended=suspended)


def suspend_patch(desired: bool, state: MPIJobState) -> Optional[dict[str, Any]]:
    """The patch that makes the MPIJob's suspend match the run's, if one is needed."""
    if state.finished or state.suspended == desired:
        return None
    return {"spec": {"runPolicy": {"suspend": desired}}}


def _epochs(progress: Optional[dict[str, Any]]) -> str:
    read = Progress.read(progress)
    if read.epoch is None:
        return "no epoch finished"
    return f"epoch {read.epoch}" + (f" of {read.max_epochs}" if read.max_epochs else "")


def running_message(name: str, progress: Optional[dict[str, Any]]) -> str:
    text = f"MPIJob {name}: {_epochs(progress)}"
    metrics = Progress.read(progress).metrics
    if "val_accuracy" in metrics:
        text += f", val_accuracy {metrics['val_accuracy']:.4f}"
    return text


def succeeded_message(name: str, progress: Optional[dict[str, Any]]) -> str:
    text = f"MPIJob {name} succeeded after {_epochs(progress)}"
    best = Progress.read(progress).best_metrics
    if best:
        text += "; best " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(best.items()))
    uri = model_uri(progress)
    return text + (f"; model at {uri}" if uri else "")


# Conditions keep 2000 characters (status.set_condition) and status.message adds the reason: the log's end
# must fit in what is left, or the lines that matter most are the ones cut.
_FAILURE_MESSAGE_CHARS = 1900


def _launcher_log_text(log: Any, room: int) -> str:
    """The launcher's log as the Failed message says it, in about `room` characters (whole lines from the
    end); `log` is a pods.LauncherLog."""
    if log.error:
        where = f"launcher pod {log.pod} container {log.container}" if log.pod else "the launcher"
        return f"the log of {where} could not be read ({log.error})"
    if not log.pod:
        return "no launcher pod is left to read its log from"
    if not log.tail:
        return f"launcher pod {log.pod} container {log.container} logged nothing"
    header = f" of launcher pod {log.pod} container {log.container}:\n"
    lines = log.tail.split("\n")
    while len(lines) > 1 and len(header) + 20 + len("\n".join(lines)) > room:
        lines.pop(0)
    tail = "\n".join(lines)[-max(0, room - len(header) - 20):]
    return f"last {len(lines)} line{'s' if len(lines) > 1 else ''}{header}{tail}"


def mpijob_failure_message(namespace: str, name: str, state: MPIJobState, progress: Optional[dict[str, Any]],
                           launcher_log: Any = None, pod_cause: str = "") -> str:
    """Why the MPIJob failed: its condition, the epoch reached, the trainer's error, what a pod says (e.g. a
    worker OOMKilled) and, with `launcher_log` (a pods.LauncherLog), the end of the launcher's log, cut
    from the front to fit."""
    cause = ": ".join(p for p in (state.reason, state.message) if p)[:500] or "no reason given"
    parts = [f"MPIJob {name} failed ({cause})", f"{_epochs(progress)}"]
    error = Progress.read(progress).error
    if error:
        parts.append(f"trainer reported: {error[:500]}")
    parts.append(f"see the launcher's log (kubectl logs -n {namespace} -l training.kubeflow.org/job-name={name},"
                 "training.kubeflow.org/job-role=launcher --tail=50); recreating the run under the same name "
                 "resumes from its last checkpoint when spec.training.resume is true")
    if pod_cause:
        parts.append(pod_cause[:700])
    if launcher_log is not None:
        head = "; ".join(parts)
        parts.append(_launcher_log_text(launcher_log, _FAILURE_MESSAGE_CHARS - len(head) - 2))
    return "; ".join(parts)
