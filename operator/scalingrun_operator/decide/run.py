"""A ScalingRun's state machine, pure: from its spec, its last status and a snapshot, the decision.

Pending -> Preprocessing -> Training (<-> Suspended) -> Succeeded, or Failed from any of them. Every
look runs the whole machine on the run as it is now (level-triggered), so a look that comes late,
twice, or after a restart of the operator decides the same. The phases live in preprocessing.py and
training.py; this module checks the spec, pins it, and hands over to the phase the conditions call
for.
"""

from __future__ import annotations

from typing import Any, Optional

from scalingrun_api.engines import engine
from scalingrun_api.models import API_VERSION, KIND, Phase, ScalingRun
from ..schema.endpoints import endpoint_refusal, local_path_refusal
from ..schema.validation import InvalidScalingRun, SpecWarning, parse_scalingrun, spec_warnings
from ..builders.locations import logs_uri
from . import elastic, pinning
from .draft import Draft
from .preprocessing import decide_preprocessing
from .progress import MAX_URI_CHARS
from .snapshot import Decision, Settings, Snapshot
from .status import (
    FAILED, INVALID_SPEC, PREPROCESSED, SPEC_CHANGE_IGNORED, StatusUpdate, get_condition, is_terminal, may_revalidate,
)
from .training import decide_training


PARSED_METADATA = ("name", "namespace")  # all that is read of the parsed run's metadata (builders: the name)


def derived_signature(body: dict[str, Any]) -> tuple[Any, ...]:
    """What the values decide derives from a run (`Snapshot.derive`: its parsed spec, the children it renders, the
    changes it ignores) depend on: the same signature, the same values, so a look may start from the last one's."""
    meta = body["metadata"]
    return meta.get("uid"), meta.get("generation"), pinning.pinned_of(body)  # a spec edit moves the generation


def decide_run(snapshot: Snapshot, settings: Settings = Settings()) -> Decision:
    """What to do about the run in `snapshot.obj`. Raises NeedMore for a fact the snapshot lacks."""
    body = snapshot.obj
    meta, status = body["metadata"], body.get("status") or {}
    if is_terminal(status) and not may_revalidate(status, meta.get("generation")):
        return Decision(phase=status.get("phase"), desired=status)  # finished: nothing changes it any more
    draft = Draft(snapshot, settings)
    if is_terminal(status):
        _restart_after_invalid_spec(draft.update)
    pinned = pinning.pinned_of(body)
    run, invalid, warnings = snapshot.derive("run", lambda: _parse(body, pinning.effective_spec(body["spec"], pinned),
                                                                   settings))
    refusal = run and _refusal(run, settings)
    if refusal:  # the operator's own rule: refused before any child is made or storage asked
        run, invalid = None, f"{refusal} (the run is retried on edit)."
    if run is None:
        draft.update.fail(INVALID_SPEC, invalid)
    else:
        if draft.update.phase is None:
            draft.update.set_phase(Phase.pending.value, "accepted")
        if pinned is None:  # the run starts: the spec it keeps, and what validate would have warned about
            draft.pin = pinning.pin(body["spec"])
            draft.update.desired[pinning.PINNED_FIELD] = draft.pin
            for warning in warnings:
                draft.update.warn(warning.reason, str(warning))
        else:
            _record_ignored_changes(snapshot, draft.update, body["spec"], pinned)
        logs = logs_uri(run)
        if len(logs) <= MAX_URI_CHARS:  # a cut URI would name another folder
            draft.update.desired["logs"] = logs
        if not draft.condition_true(PREPROCESSED):
            decide_preprocessing(draft, run)
        if (draft.condition_true(PREPROCESSED) and settings.train and not draft.blocked
                and not is_terminal(draft.update.desired)):
            decide_training(draft, run)
    annotation = pinning.annotation_of(body)
    if annotation is not None:
        draft.drop_pin_annotation = True
        draft.update.warn("PinnedSpecAnnotationIgnored", pinning.annotation_ignored_message(body["spec"], annotation))
    if is_terminal(draft.update.desired):
        if run is not None and run.spec.workers.min_replicas is not None:
            elastic.drop_probes(draft)  # this is the last look: a finished run holds no room, whatever its MPIJob
        draft.follow, draft.recheck_in, draft.again = None, None, False  # nothing left to wait for
    return draft.decision()


def _refusal(run: ScalingRun, settings: Settings) -> Optional[str]:
    """Why the operator may not read this run's store or documents (its own rules, not the API's); None if it may."""
    policy = settings.endpoint_policy
    return (endpoint_refusal(run.spec.storage.endpoint, settings.allowed_storage_endpoints, policy)
            or local_path_refusal("spec.dataset.output", run.spec.dataset.output, policy)
            or local_path_refusal("spec.training.checkpoint.location", run.spec.training.checkpoint.location, policy))


def _parse(body: dict[str, Any], spec: dict[str, Any],
           settings: Settings) -> tuple[Optional[ScalingRun], str, list[SpecWarning]]:
    """(the run, '', the spec's warnings) or (None, what is wrong with its spec, []). The warnings are the spec's as
    written (before the default image is filled in). Not the server's metadata (managedFields grows with every
    status write, and the model keeps what it does not know): nothing derived from the run reads it."""
    meta = {k: v for k, v in body["metadata"].items() if k in PARSED_METADATA}
    document = {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}
    try:
        run = parse_scalingrun(document, settings.allow_host_path)
    except InvalidScalingRun as exc:
        return None, "; ".join(str(e) for e in exc.errors[:10]) + ". Fix the spec (the run is retried on edit).", []
    warnings = spec_warnings(run)
    return with_default_image(run, settings.trainer_images, settings.gpu_images,
                              dict(settings.trainer_image_digests)), "", warnings


def with_default_image(run: ScalingRun, trainer_images: str, gpu_images: bool = True,
                       digests: Optional[dict[str, str]] = None) -> ScalingRun:
    """The run with spec.workers.image filled, when it names none, with its engine's image for its devices (the
    GPU flavour with gpusPerWorker above 0, unless `gpu_images` is False: a machine without GPUs) under the
    operator's trainerImages ("<repository>:<tag>"; a team sets its registry once, not in every run), else ours,
    pinned by the flavour's digest where the operator's trainerImageDigests has one."""
    if not run.spec.workers.image:
        training, gpus = run.spec.training, run.spec.workers.gpus_per_worker if gpu_images else 0
        run.spec.workers.image = engine(training.framework, training.strategy).default_image(gpus, trainer_images,
                                                                                              digests)
    return run


def _restart_after_invalid_spec(update: StatusUpdate) -> None:
    desired = update.desired
    desired["conditions"] = [c for c in desired["conditions"] if c.get("type") != FAILED]
    desired.pop("completionTime", None)
    update.set_phase(Phase.pending.value, "spec edited after InvalidSpec; validating again")


def _record_ignored_changes(snapshot: Snapshot, update: StatusUpdate, spec: dict[str, Any], pinned: str) -> None:
    changed = snapshot.derive("ignored", lambda: pinning.ignored_changes(spec, pinned))
    existing = get_condition(update.desired["conditions"], SPEC_CHANGE_IGNORED)
    if changed:
        message = pinning.ignored_message(changed)
        if not existing or existing.get("status") != "True" or existing.get("message") != message:
            update.warn("SpecChangeIgnored", message)
        update.condition(SPEC_CHANGE_IGNORED, "True", "ImmutableFieldChanged", message)
    elif existing and existing.get("status") == "True":
        update.condition(SPEC_CHANGE_IGNORED, "False", "SpecMatches", "the spec matches the one the run started with")
