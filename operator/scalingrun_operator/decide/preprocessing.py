"""The preprocessing phase, pure: is the dataset already there, which Job to make, what the Job did, what
to tell the user.

The contract with the trainer's preprocessing: it writes the dataset manifest (scalingrun_api.manifest) with the
source URI and the parameters that determine the content, both sides from scalingrun_api.manifest's
`image_dataset_parameters` / `table_dataset_parameters`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Optional

from scalingrun_api.manifest import (DatasetManifest, image_dataset_parameters, is_shard_manifest,
                                     table_dataset_parameters)
from scalingrun_api.models import Phase, ScalingRun
from ..builders import build_config_map, build_preprocess_job
from ..builders.common import preprocess_job_name
from ..builders.config import dataset_readers
from ..builders.preprocess import is_parquet_table, shard_count
from ..builders.locations import manifest_uri, shards_uri
from . import interruptions, pods
from .draft import Draft, store_of
from .pod_facts import PREPROCESS
from .snapshot import CLUSTER, Listing, Names, Where
from .status import (
    DATASET_REUSED, PREPROCESSED, PREPROCESSING_FAILED, QUEUED, TABLE_INVALID, Event, parse_time,
)


def dataset_parameters(run: ScalingRun) -> dict[str, Any]:
    """The parameters the preprocessing (or a Parquet table's check) records for this run's dataset."""
    d = run.spec.dataset
    if is_parquet_table(run):
        return table_dataset_parameters(image_size=d.image_size, image_column=d.columns.image,
                                        label_column=d.columns.label, readers=dataset_readers(run))
    return image_dataset_parameters(image_size=d.image_size, validation_fraction=d.validation_fraction,
                                    sample_fraction=d.sample_fraction, seed=d.seed, readers=dataset_readers(run))


def dataset_present(run: ScalingRun, manifest: Optional[DatasetManifest]) -> bool:
    """A manifest for the same source with the same parameters: the dataset can be reused as is."""
    return (
        manifest is not None
        and manifest.source == run.spec.dataset.source
        and manifest.parameters == dataset_parameters(run)
    )


def mismatch(run: ScalingRun, manifest: Optional[DatasetManifest]) -> str:
    """Why an existing manifest cannot be reused ('' when there is none or it matches)."""
    if manifest is None or dataset_present(run, manifest):
        return ""
    if manifest.source != run.spec.dataset.source:
        return f"the dataset there was made from {manifest.source!r}"
    found = manifest.parameters
    wanted = dataset_parameters(run)
    diffs = [f"{k} {found.get(k)!r} -> {v!r}" for k, v in wanted.items() if found.get(k) != v]
    return "the dataset there has other parameters (" + ", ".join(diffs) + ")"


def _images(manifest: DatasetManifest) -> tuple[int, int, int]:
    written = manifest.written
    return written.get("train", 0), written.get("validation", 0), manifest.skipped


def preprocessing_status(manifest: DatasetManifest, job_name: Optional[str], reused: bool) -> dict[str, Any]:
    """status.preprocessing from a dataset manifest."""
    train, validation, skipped = _images(manifest)
    fingerprint = manifest.fingerprint
    out: dict[str, Any] = {
        "reused": reused,
        # A fingerprint is a short hash: anything else is left out.
        "fingerprint": fingerprint if fingerprint is not None and len(fingerprint) <= 128 else None,
        "imagesWritten": train + validation,
        "imagesSkipped": skipped,
        "shards": manifest.shards,
        "shardsReused": manifest.shards_reused,
        "classes": manifest.number_of_classes(),
    }
    if job_name:
        out["jobName"] = job_name
    return {k: v for k, v in out.items() if v is not None}


def preprocessed_message(run: ScalingRun, manifest: DatasetManifest, reused: bool) -> str:
    train, validation, skipped = _images(manifest)
    if is_parquet_table(run):
        groups = manifest.row_groups or {}
        text = (f"Parquet table at {run.spec.dataset.source} checked: {train + validation} images ({train} train, "
                f"{validation} validation) in {manifest.number_of_classes()} classes, row groups "
                f"{groups.get('train')} train / {groups.get('validation')} validation; fingerprint "
                f"{manifest.fingerprint}")
        warnings = manifest.warnings or []
        return text + "".join(f"; warning: {w}" for w in warnings) + ("; manifest reused" if reused else "")
    text = (f"{train + validation} images ({train} train, {validation} validation) in "
            f"{manifest.number_of_classes()} classes, {skipped} undecodable files skipped; "
            f"fingerprint {manifest.fingerprint}")
    if manifest.shards_reused and not reused:
        text += (f"; {manifest.shards_reused} of {manifest.shards} shards kept from the earlier dataset (their files "
                 "did not change)")
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


def job_progress_message(name: str, state: JobState, shards: Optional[int] = None, table: str = "") -> str:
    if table:
        text = f"Job {name} checks the Parquet table at {table}"
    elif shards and shards > 1 and state.completions == 1:
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
    return sum(1 for n in shard_names if is_shard_manifest(n, shards))


def preprocessing_failure_message(run: ScalingRun, namespace: str, job_name: str, state: JobState,
                                  shards_done: Optional[int], manifest_note: str = "", where: Where = CLUSTER) -> str:
    """What failed, in numbers, and where to look next."""
    shards = run.spec.dataset.preprocessing.parallelism
    cause = ": ".join(p for p in (state.reason, state.message) if p) or "no reason given"
    parts = [f"Job {job_name} failed ({cause})"]
    deadline = run.spec.dataset.preprocessing.active_deadline_seconds
    if state.reason == "DeadlineExceeded" and deadline:
        parts.append(f"it ran past spec.dataset.preprocessing.activeDeadlineSeconds ({deadline} s); raise it (or "
                     "spec.dataset.preprocessing.parallelism) and recreate the run")
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
        f"{where.job_logs(namespace, job_name)}; "
        "undecodable files count against spec.dataset.preprocessing.maxBadFraction, and finished shards "
        "(and the parts of unfinished ones already written) are reused when the run is recreated")
    return "; ".join(parts)


# --- the phase ---------------------------------------------------------------------------------------


def decide_preprocessing(draft: Draft, run: ScalingRun) -> None:
    """Preprocessed from the dataset in storage and the preprocessing Job: reuse, create, wait, judge."""
    update, job_name = draft.update, preprocess_job_name(run)
    job = draft.child("Job", job_name)
    recorded = update.desired.get("preprocessing") or {}
    if job is None and recorded.get("jobName") == job_name and not recorded.get("reused"):
        # Status names the Job only once it existed: it was deleted. Counted and written first (the name
        # cleared), then the next look creates it: a crash in between neither loses nor repeats the count.
        update.desired["preprocessing"] = {**recorded, "jobName": None}
        interruptions.child_deleted(draft, run, "Job", job_name, "a new Job reuses the shards already written")
        return
    if job is not None and not draft.own(job, draft.built("Job", lambda: build_preprocess_job(run, draft.namespace))):
        return
    if job is None:
        readable, manifest = draft.read(manifest_uri(run), store_of(run))
        if not readable:
            return
        if dataset_present(run, manifest):
            update.desired["preprocessing"] = preprocessing_status(manifest, None, reused=True)
            update.condition(PREPROCESSED, "True", DATASET_REUSED, preprocessed_message(run, manifest, reused=True))
            return
        draft.ensure(draft.built("ConfigMap", lambda: build_config_map(run, draft.namespace)))
        if draft.blocked:
            return
        note = mismatch(run, manifest)
        # Posted with the Job's creation, not with the status: if the status patch conflicts, the next look finds
        # the Job there already and would never say why it was made.
        indexed = _indexed(draft, run)
        job = draft.built(("Job", indexed), lambda: build_preprocess_job(run, draft.namespace, indexed=indexed))
        draft.ensure(job, Event("Normal", "PreprocessingAgain", f"{manifest_uri(run)}: {note}") if note else None)
    state = job_state(job)
    shards = shard_count(run)
    update.desired["preprocessing"] = {**(update.desired.get("preprocessing") or {}), "jobName": job_name,
                                       "reused": False, "shards": shards}
    if state.state == "Running" and lacks_completion_index(job, shards):
        message = no_completion_index_message(job_name, shards, draft.server().git_version)
        update.condition(PREPROCESSED, "False", PREPROCESSING_FAILED, message)
        update.fail(PREPROCESSING_FAILED, message)
    elif state.state == "Running" and run.spec.run_policy.kueue_queue_name and job["spec"].get("suspend"):
        _queued(draft, run, job_name)
    elif state.state == "Running":
        if draft.condition_true(QUEUED):
            update.condition(QUEUED, "False", "Admitted", f"Kueue admitted Job {job_name}")
        table = run.spec.dataset.source if is_parquet_table(run) else ""
        progress, started = job_progress_message(job_name, state, shards, table), f"Job {job_name}"
        if runs_shards_in_turn(job, shards):
            # Said in the condition and in the phase's Event: the run is slower than its spec suggests.
            note = in_turn_note(shards, draft.server().git_version)
            progress, started = f"{progress}; {note}", f"{started}; {note}"
        holdup = pods.check_pods(draft, (PREPROCESS,))
        update.condition(PREPROCESSED, "Unknown", holdup[0] if holdup else "Running",
                         f"{progress}; {holdup[1]}" if holdup else progress)
        update.set_phase(Phase.preprocessing.value, started)
    elif state.state == "Failed" and is_parquet_table(run):
        _table_invalid(draft, run, job_name, state)
    elif state.state == "Failed":
        _failed(draft, run, job_name, state)
    else:
        _complete(draft, run, job, state)


def _queued(draft: Draft, run: ScalingRun, job_name: str) -> None:
    """Kueue holds the preprocessing Job (created suspended, as the MPIJob): it waits for quota; the operator never
    resumes it, Kueue does when it admits it."""
    message = (f"Job {job_name} is suspended by Kueue: LocalQueue {run.spec.run_policy.kueue_queue_name} waits for "
               "admission (quota)")
    draft.update.condition(QUEUED, "True", "WaitingForAdmission", message)
    draft.update.condition(PREPROCESSED, "Unknown", "Queued", message)
    draft.update.set_phase(Phase.queued.value, message)


def _indexed(draft: Draft, run: ScalingRun) -> bool:
    return run.spec.dataset.preprocessing.parallelism == 1 or draft.server().supports_indexed_jobs()


def _complete(draft: Draft, run: ScalingRun, job: dict[str, Any], state: JobState) -> None:
    update, job_name = draft.update, job["metadata"]["name"]
    readable, manifest = draft.read(manifest_uri(run), store_of(run), job_uid=job["metadata"].get("uid"))
    if not readable:
        return
    if dataset_present(run, manifest):
        update.desired["preprocessing"] = preprocessing_status(manifest, job_name, reused=False)
        update.condition(PREPROCESSED, "True", "Preprocessed",
                         f"Job {job_name}: " + preprocessed_message(run, manifest, reused=False))
        for warning in manifest.warnings or []:  # a Parquet table's row groups or row order: an Event once
            update.warn("TableWarning", f"Parquet table at {run.spec.dataset.source}: {warning}")
        return
    if draft.within_grace(state.finished_at):
        draft.recheck(draft.grace_left(state.finished_at))
        update.condition(PREPROCESSED, "Unknown", "WaitingForManifest",
                         f"Job {job_name} completed; waiting for {manifest_uri(run)}")
        update.set_phase(Phase.preprocessing.value)
        return
    found = mismatch(run, manifest) or "there is none"
    if draft.settings.reads_storage:
        message = (f"Job {job_name} completed but {manifest_uri(run)} does not describe this run's dataset "
                   f"({found}); check that nothing else writes to spec.dataset.output")
    else:
        message = (f"Job {job_name} completed but none of its pods left this run's dataset manifest in its "
                   f"termination message ({found}); a trainer image older than the operator leaves none, and "
                   f"something else writing to spec.dataset.output can replace {manifest_uri(run)}")
    update.condition(PREPROCESSED, "False", PREPROCESSING_FAILED, message)
    update.fail(PREPROCESSING_FAILED, message)


def _failed(draft: Draft, run: ScalingRun, job_name: str, state: JobState) -> None:
    listing: Names = draft.need(Listing(shards_uri(run), store_of(run)))
    done = shard_progress(list(listing.names) if listing.names is not None else None,
                          run.spec.dataset.preprocessing.parallelism)
    note = f"the shard manifests could not be listed ({listing.error})" if listing.error else ""
    message = preprocessing_failure_message(run, draft.namespace, job_name, state, done, note,
                                            where=draft.settings.where)
    cause = pods.pod_cause(draft, (PREPROCESS,))
    if cause:
        message = f"{message}; {cause}"
    draft.update.condition(PREPROCESSED, "False", PREPROCESSING_FAILED, message)
    draft.update.fail(PREPROCESSING_FAILED, message)


def _table_invalid(draft: Draft, run: ScalingRun, job_name: str, state: JobState) -> None:
    """The check of a Parquet table failed: its error names the column (or file), before any MPIJob exists."""
    said = pods.termination_message(draft.pods(), (PREPROCESS,)) or state.message or "no message"
    message = (f"the Parquet table at {run.spec.dataset.source} does not fit this run: {said}; fix the table or "
               f"spec.dataset (columns, imageSize), then recreate the run (Job {job_name}: "
               f"{draft.settings.where.job_logs(draft.namespace, job_name)})")
    draft.update.condition(PREPROCESSED, "False", TABLE_INVALID, message)
    draft.update.fail(TABLE_INVALID, message)
