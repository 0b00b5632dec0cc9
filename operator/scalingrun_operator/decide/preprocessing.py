"""Preprocessing decisions, pure: is the dataset already there, what did the Job do, what to tell the user.

The contract with the trainer's preprocessing: it writes `<dataset.output>/_manifest.json` with the
source URI and the parameters that determine the content (`Params.dataset_parameters()` in
scalingrun_trainer.preprocess, mirrored by `dataset_parameters` here without importing pyarrow).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Optional

from scalingrun_api.models import ScalingRun
from ..builders.config import dataset_readers
from ..status import parse_time
from ..storage import join

FORMAT_VERSION = 1  # scalingrun_trainer.preprocess.FORMAT_VERSION


def dataset_parameters(run: ScalingRun) -> dict[str, Any]:
    """The parameters the preprocessing records for this run's dataset (must equal the trainer's)."""
    d = run.spec.dataset
    return {
        "formatVersion": FORMAT_VERSION,
        "imageSize": d.image_size,
        "validationFraction": d.validation_fraction,
        "sampleFraction": d.sample_fraction,
        "seed": d.seed,
        # Each split has >= 2 row groups per Horovod process (petastorm shards by row group).
        "minRowGroupsPerSplit": 2 * dataset_readers(run),
    }


def manifest_uri(run: ScalingRun) -> str:
    return join(run.spec.dataset.output, "_manifest.json")


def shards_uri(run: ScalingRun) -> str:
    return join(run.spec.dataset.output, "_shards")


def dataset_present(run: ScalingRun, manifest: Optional[dict[str, Any]]) -> bool:
    """A manifest for the same source with the same parameters: the dataset can be reused as is."""
    return (
        manifest is not None
        and manifest.get("source") == run.spec.dataset.source
        and manifest.get("parameters") == dataset_parameters(run)
    )


def mismatch(run: ScalingRun, manifest: Optional[dict[str, Any]]) -> str:
    """Why an existing manifest cannot be reused ('' when there is none or it matches)."""
    if manifest is None or dataset_present(run, manifest):
        return ""
    if manifest.get("source") != run.spec.dataset.source:
        return f"the dataset there was made from {manifest.get('source')!r}"
    found = manifest.get("parameters") or {}
    wanted = dataset_parameters(run)
    diffs = [f"{k} {found.get(k)!r} -> {v!r}" for k, v in wanted.items() if found.get(k) != v]
    return "the dataset there has other parameters (" + ", ".join(diffs) + ")"


def _images(manifest: dict[str, Any]) -> tuple[int, int, int]:
    written = manifest.get("written") or {}
    return int(written.get("train", 0)), int(written.get("validation", 0)), int(manifest.get("skipped", 0))


def preprocessing_status(manifest: dict[str, Any], job_name: Optional[str], reused: bool) -> dict[str, Any]:
    """status.preprocessing from a dataset manifest."""
    train, validation, skipped = _images(manifest)
    out: dict[str, Any] = {
        "reused": reused,
        "fingerprint": manifest.get("fingerprint"),
        "imagesWritten": train + validation,
        "imagesSkipped": skipped,
        "shards": manifest.get("shards"),
        "classes": len(manifest.get("classes") or []),
    }
    if job_name:
        out["jobName"] = job_name
    return {k: v for k, v in out.items() if v is not None}


def preprocessed_message(run: ScalingRun, manifest: dict[str, Any], reused: bool) -> str:
    train, validation, skipped = _images(manifest)
    text = (f"{train + validation} images ({train} train, {validation} validation) in "
            f"{len(manifest.get('classes') or [])} classes, {skipped} undecodable files skipped; "
            f"fingerprint {manifest.get('fingerprint')}")
    if reused:
        return (f"dataset at {run.spec.dataset.output} already made from the same source with the same "
                f"parameters, no preprocessing Job: {text}")
    return text


@dataclass(frozen=True)
class JobState:
    state: str  # Running, Complete or Failed
    reason: str = ""
    message: str = ""
    succeeded: int = 0
    failed: int = 0
    completions: int = 1
    finished_at: Optional[dt.datetime] = None


def job_state(job: dict[str, Any]) -> JobState:
    """The state of a batch/v1 Job from its conditions and counters."""
    status = job.get("status") or {}
    completions = int((job.get("spec") or {}).get("completions") or 1)
    counts = {"succeeded": int(status.get("succeeded") or 0), "failed": int(status.get("failed") or 0),
              "completions": completions}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True" or condition.get("type") not in ("Complete", "Failed"):
            continue
        state = condition["type"]
        finished = parse_time(status.get("completionTime")) if state == "Complete" else None
        finished = finished or parse_time(condition.get("lastTransitionTime")) or parse_time(
            condition.get("lastProbeTime"))
        return JobState(state, condition.get("reason") or "", condition.get("message") or "",
                        finished_at=finished, **counts)
    return JobState("Running", **counts)


def job_progress_message(name: str, state: JobState, shards: Optional[int] = None) -> str:
    if shards and shards > 1 and state.completions == 1:
        text = f"Job {name}: one pod runs the {shards} shards in turn"
    else:
        text = f"Job {name}: {state.succeeded} of {state.completions} shards done"
    return text + (f", {state.failed} pod failures so far" if state.failed else "")


def runs_shards_in_turn(job: dict[str, Any], shards: int) -> bool:
    """The Job was built for a server without Indexed Jobs: one completion does every shard."""
    spec = job.get("spec") or {}
    return shards > 1 and int(spec.get("completions") or 1) == 1


def lacks_completion_index(job: dict[str, Any], shards: int) -> bool:
    """Several completions but no Indexed mode: the server dropped completionMode (Kubernetes < 1.22 or the
    IndexedJob feature off), so every pod would process shard 0 and the others never."""
    spec = job.get("spec") or {}
    return shards > 1 and int(spec.get("completions") or 1) > 1 and spec.get("completionMode") != "Indexed"


def in_turn_note(shards: int, server_version: str) -> str:
    return (f"this server ({server_version or 'version unknown'}) has no Indexed Jobs (they need Kubernetes "
            f"1.22+), so the {shards} shards of spec.dataset.preprocessing.parallelism run one after another "
            "in one pod")


def no_completion_index_message(name: str, shards: int, server_version: str) -> str:
    return (f"Job {name} has {shards} completions but no completion index: this server "
            f"({server_version or 'version unknown'}) dropped completionMode: Indexed, so every pod would "
            "process shard 0 and the dataset would never be complete; recreate the run: on a server without "
            "Indexed Jobs this operator renders one pod that runs every shard in turn")


def shard_progress(shard_names: Optional[list[str]], shards: int) -> Optional[int]:
    """How many shards of a `shards`-shard run left a shard manifest (None when not listable)."""
    if shard_names is None:
        return None
    suffix = f"-of-{shards:05d}.json"
    return sum(1 for n in shard_names if n.startswith("shard-") and n.endswith(suffix))


def preprocessing_failure_message(run: ScalingRun, namespace: str, job_name: str, state: JobState,
                                  shards_done: Optional[int], manifest_note: str = "") -> str:
    """What failed, in numbers, and where to look next."""
    shards = run.spec.dataset.preprocessing.parallelism
    cause = ": ".join(p for p in (state.reason, state.message) if p) or "no reason given"
    parts = [f"Job {job_name} failed ({cause})"]
    if shards > 1 and state.completions == 1:
        parts.append(f"its one pod ran the {shards} shards in turn (this server has no Indexed Jobs), "
                     f"{state.failed} pod failures")
    else:
        parts.append(f"{state.succeeded} of {state.completions} shards succeeded, {state.failed} pod failures")
    if shards_done is not None:
        parts.append(f"{shards_done} of {shards} shard manifests written under {shards_uri(run)}")
    if manifest_note:
        parts.append(manifest_note)
    parts.append(
        f"see the failed pods' logs (kubectl logs -n {namespace} -l job-name={job_name} --tail=50); "
        "undecodable files count against spec.dataset.preprocessing.maxBadFraction, and finished shards "
        "are reused when the run is recreated")
    return "; ".join(parts)
