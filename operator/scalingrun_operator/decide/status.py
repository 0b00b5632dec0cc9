"""Phases, conditions and the Events that go with them: pure helpers, no API calls, no clock.

A reconcile builds a `StatusUpdate` from the run's or the sweep's current status, sets conditions and
the phase on it, and hands the resulting merge patch and events to the caller, which writes them. The
one status machine serves both kinds; a `PhaseTable` says what differs (their phases, and what a
phase sets). Conditions keep their lastTransitionTime while their status does not change, as
Kubernetes conventions ask.
"""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

from scalingrun_api.models import Phase, SweepPhase

TERMINAL = frozenset({Phase.succeeded.value, Phase.failed.value})

# Condition types.
PREPROCESSED = "Preprocessed"
TRAINED = "Trained"
SUSPENDED = "Suspended"
QUEUED = "Queued"  # True while Kueue holds the MPIJob (suspended, waiting for quota or preempted)
FAILED = "Failed"
# kstatus (Flux, kubectl wait) conventions: Ready says whether the run is done and good, Stalled that
# it will not get there by itself.
READY = "Ready"
STALLED = "Stalled"
SPEC_CHANGE_IGNORED = "SpecChangeIgnored"
STORAGE_READABLE = "StorageReadable"
PODS_HEALTHY = "PodsHealthy"  # False while a pod of the run cannot run (image pull, scheduling, OOM, ...)
CHILD_DELETED = "ChildDeleted"  # True once the Job or MPIJob was deleted mid-run (and recreated)
INPUT_BOUND = "InputBound"  # True while training mostly waits for its input (decide.progress.input_bound)
GPUS_UNUSED = "GPUsUnused"  # True while a run that asked for GPUs trains on CPU (decide.progress.gpus_unused)
CHILD_CONFLICT = "ChildConflict"  # True while an object the run did not make holds a child's name
NODE_TERMINATING = "NodeTerminating"  # the Warning Event of pods deleted on a node's termination notice
NODE_LOST = "NodeLost"  # True once training pods were lost with their node (force-deleted), until all run again
MPIJOB_SERVED = "MPIJobServed"  # False while nothing has reconciled the MPIJob past Settings.mpijob_unserved_seconds

# Reasons a user sees (and tests assert).
INVALID_SPEC = "InvalidSpec"
DATASET_REUSED = "DatasetReused"
PREPROCESSING_FAILED = "PreprocessingFailed"
TABLE_INVALID = "ParquetTableInvalid"  # dataset.format parquet: the table does not fit the run
MPIJOB_FAILED = "MPIJobFailed"
NO_MPIJOB_CONTROLLER = "NoMPIJobController"
BUILDER_FAILED = "ModelBuilderFailed"  # spec.model.builder broke the contract before any training step
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"  # failures of the code past spec.training.backoffLimit
MAX_INTERRUPTIONS_EXCEEDED = "MaxInterruptionsExceeded"  # the infrastructure's, past spec.training.maxInterruptions



@dataclass(frozen=True)
class PhaseTable:
    """A kind's phases as the status machine treats them."""

    events: Mapping[str, tuple[str, str]]  # phase -> (Event type, reason) of the move into it
    pending: str  # the phase before anything started: no startTime yet
    succeeded: str  # Ready is True in it
    failed: str
    stalled_on_failure: bool  # Failed also sets Stalled True (kstatus: it will not get there by itself)
    ready_every_look: bool  # Ready's message follows every look, not only a change of phase

    @property
    def terminal(self) -> frozenset[str]:
        return frozenset({self.succeeded, self.failed})


def _events(phases) -> Mapping[str, tuple[str, str]]:
    """Every phase's Event: its own name as the reason, a Warning for Failed."""
    return MappingProxyType({p.value: ("Warning" if p.value == Phase.failed.value else "Normal", p.value)
                             for p in phases})


RUN_PHASES = PhaseTable(_events(Phase), Phase.pending.value, Phase.succeeded.value, Phase.failed.value,
                        stalled_on_failure=True, ready_every_look=False)
# A sweep's Ready says which points run now; its Failed condition names the failed point (decide.sweep).
SWEEP_PHASES = PhaseTable(_events(SweepPhase), SweepPhase.pending.value, SweepPhase.succeeded.value,
                          SweepPhase.failed.value, stalled_on_failure=False, ready_every_look=True)


def rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Optional[str]) -> Optional[dt.datetime]:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  generation: Optional[int], moment: dt.datetime) -> list[dict[str, Any]]:
    """A new list with condition `type_` set; its transition time moves only when its status changes."""
    old = next((c for c in conditions if c.get("type") == type_), None)
    transition = old.get("lastTransitionTime") if old and old.get("status") == status else None
    new = {"type": type_, "status": status, "reason": reason, "message": message[:MAX_MESSAGE_CHARS],
           "lastTransitionTime": transition or rfc3339(moment)}
    if generation is not None:
        new["observedGeneration"] = generation
    if old is None:
        return [*conditions, new]
    return [new if c.get("type") == type_ else c for c in conditions]  # keep the order: no spurious patches


def get_condition(conditions: list[dict[str, Any]], type_: str) -> Optional[dict[str, Any]]:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


MAX_MESSAGE_CHARS = 2000  # a condition's or an Event's message: the end of what a document or a log said is cut


@dataclass
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str

    def __post_init__(self) -> None:
        if len(self.message) > MAX_MESSAGE_CHARS:
            self.message = self.message[:MAX_MESSAGE_CHARS - 1] + "…"


@dataclass
class StatusUpdate:
    """The status a reconcile wants, starting from what the object has now."""

    current: dict[str, Any]
    generation: Optional[int]
    moment: dt.datetime  # the time of this look (an input: decide reads no clock)
    desired: dict[str, Any] = field(init=False)
    events: list[Event] = field(default_factory=list)
    phases: PhaseTable = RUN_PHASES

    def __post_init__(self) -> None:
        self.desired = copy.deepcopy(self.current or {})
        self.desired.setdefault("conditions", [])
        if self.generation is not None:
            self.desired["observedGeneration"] = self.generation

    @property
    def phase(self) -> Optional[str]:
        return self.desired.get("phase")

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.desired["conditions"] = set_condition(self.desired["conditions"], type_, status, reason, message,
                                                   self.generation, self.moment)

    def set_phase(self, phase: str, message: str = "") -> None:
        """Moves to `phase`; an Event records every change of phase."""
        table = self.phases
        if table.ready_every_look:
            self._ready(phase, message)
        if self.desired.get("phase") == phase:
            return
        previous = self.desired.get("phase")
        self.desired["phase"] = phase
        if phase in table.terminal:
            self.desired.setdefault("completionTime", rfc3339(self.moment))
        if phase != table.pending:
            self.desired.setdefault("startTime", rfc3339(self.moment))
        self._ready(phase, message)
        if phase == table.failed and table.stalled_on_failure:
            self.condition(STALLED, "True", phase, message or "the run failed")
        kind, reason = table.events[phase]
        text = f"{previous or 'New'} -> {phase}" + (f": {message}" if message else "")
        self.events.append(Event(kind, reason, text))

    def _ready(self, phase: str, message: str) -> None:
        self.condition(READY, "True" if phase == self.phases.succeeded else "False", phase,
                       message or f"phase {phase}")

    def fail(self, reason: str, message: str) -> None:
        """Failed is terminal: a Failed condition says why, a Warning Event says it too."""
        self.condition(FAILED, "True", reason, message)
        self.set_phase(Phase.failed.value, f"{reason}: {message}")

    def warn(self, reason: str, message: str) -> None:
        self.events.append(Event("Warning", reason, message))

    def patch(self) -> Optional[dict[str, Any]]:
        """The merge patch for the status subresource, or None when nothing changed.

        Objects are diffed key by key at every depth, and a key the operator dropped becomes None at its own depth
        (left out of a nested object, it would stay on the server); lists are replaced whole.
        """
        if _normalised(self.desired) == _normalised(self.current or {}):
            return None
        return merge_patch(self.current or {}, self.desired) or None


def merge_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `current` into `desired`."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        old = current.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            nested = merge_patch(old, value)
            if nested:
                patch[key] = nested
        elif old != value:
            patch[key] = value
    for key in current:
        if key not in desired:
            patch[key] = None
    return patch


def _normalised(status: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in status.items() if v not in (None, [], {})}
    return out


def is_terminal(status: Optional[dict[str, Any]]) -> bool:
    return (status or {}).get("phase") in TERMINAL


def may_revalidate(status: Optional[dict[str, Any]], generation: Optional[int]) -> bool:
    """A run that failed only because of its spec gets another look once the spec is edited."""
    status = status or {}
    failed = get_condition(status.get("conditions") or [], FAILED)
    return (
        status.get("phase") == Phase.failed.value
        and failed is not None
        and failed.get("reason") == INVALID_SPEC
        and generation is not None
        and (status.get("observedGeneration") or 0) < generation
    )
