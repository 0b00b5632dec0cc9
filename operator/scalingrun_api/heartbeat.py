"""The heartbeat document, `<runLocation>/heartbeat.json`: rank 0 of every engine (and the SDK's `heartbeat(step)`)
writes it from the training loop itself, at most every HEARTBEAT_INTERVAL_SECONDS, never from a thread of its own
(a thread would keep beating while the loop is stuck). Every long phase beats: the batch-size probe, a checkpoint
restore, the feature cache's pass, training steps. The operator and the local runner read it to tell a slow run
from a stalled one (spec.training.stallTimeout).

A separate small document, not a field of progress.json: a beat every 30 s must not make every reader of the
progress document (status, sweeps, the report) reconcile, and its reads stay small and bounded.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from .models.common import AUTO, duration_seconds
from .progress import lenient

HEARTBEAT_FILE = "heartbeat.json"
HEARTBEAT_INTERVAL_SECONDS = 30.0
# What a rank (and so mpirun, and the launcher) exits with when the trainer's stall watch found a peer that stopped
# answering (scalingrun_trainer.core.stall). EX_TEMPFAIL: an interruption to resume from, counted as stalled by the
# operator, not as the code's failure (the trainer's own errors exit 1 or 2, `scalingrun-trainer launch` 3).
STALL_EXIT_CODE = 75
# What a rank exits with after a preemption notice (SIGTERM, or its node's termination taint seen by the operator,
# which deletes the worker pod so that its kubelet sends it): the ranks agreed on a step, rank 0 wrote a checkpoint at
# it, and the next attempt resumes from that step. An interruption by the infrastructure, counted as evicted, not as
# the code's failure (scalingrun_trainer.core.preemption).
PREEMPTED_EXIT_CODE = 76
# stallTimeout auto: the larger of this floor and STALL_GAP_FACTOR x the longest gap seen in the attempt.
STALL_TIMEOUT_FLOOR_SECONDS = 600.0
STALL_GAP_FACTOR = 3.0
# The trainer's own watch (scalingrun_trainer.core.stall): a rank whose loop makes no step for this many seconds
# names the silent ranks and exits; each engine's collective timeout (NCCL's among them) follows from it.
COLLECTIVE_TIMEOUT_VARIABLE = "SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS"
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 300.0
MIN_COLLECTIVE_TIMEOUT_SECONDS = 10
# Added to the watch's time before an engine's own collective timeout fires: the watch, which names the silent
# ranks, speaks first.
ENGINE_TIMEOUT_MARGIN_SECONDS = 30.0


class HeartbeatPhase(str, Enum):
    starting = "starting"
    restore = "restore"
    probe = "probe"
    feature_cache = "feature-cache"
    training = "training"
    validation = "validation"
    saving = "saving"
    preprocessing = "preprocessing"


class Heartbeat(BaseModel):
    """heartbeat.json. `time` is the writer's clock (Unix seconds); `attemptStarted` tells one attempt's beats from
    the next one's; `longestGapSeconds` is the longest time between two beats of this attempt so far."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore",
                              use_enum_values=True)

    phase: HeartbeatPhase = HeartbeatPhase.training
    epoch: Optional[int] = None
    step: int = Field(0, ge=0)
    time: float = 0.0
    attempt_started: Optional[float] = None
    longest_gap_seconds: float = Field(0.0, ge=0)
    rank: int = 0

    @classmethod
    def read(cls, document: Any) -> "Heartbeat":
        return lenient(cls, document) or cls()

    def document(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


def stall_timeout_seconds(setting: int | str, longest_gap_seconds: float) -> Optional[float]:
    """The stall timeout in force: None when off (0), the floor or 3x the longest gap for auto."""
    if setting == AUTO:
        return max(STALL_TIMEOUT_FLOOR_SECONDS, STALL_GAP_FACTOR * longest_gap_seconds)
    seconds = duration_seconds(setting)
    return float(seconds) if seconds > 0 else None


def collective_timeout_seconds(stall_timeout: int | str) -> int:
    """The trainer's collective timeout for a run's spec.training.stallTimeout: auto keeps the trainer's default
    (the operator's auto judges at 600 s or later); 0 (stall detection off) turns the watch off too, leaving the
    engines' own defaults; N seconds gives half of it (at least 10 s, at most the default), so that the ranks name
    the silent one and give up before the operator judges the run Stalled."""
    if stall_timeout == AUTO:
        return int(DEFAULT_COLLECTIVE_TIMEOUT_SECONDS)
    seconds = duration_seconds(stall_timeout)
    if not seconds:
        return 0
    return int(min(DEFAULT_COLLECTIVE_TIMEOUT_SECONDS, max(MIN_COLLECTIVE_TIMEOUT_SECONDS, seconds // 2)))


def roll_call_window(timeout: float) -> float:
    """How long a rank that gave up waits for the others' answers: the ranks give up at times apart by a step or a
    validation pass (ranks with fewer validation batches wait longer in the epoch's last collective)."""
    return max(10.0, min(60.0, timeout / 4))


def engine_timeout_after(timeout: float) -> Optional[float]:
    """The engines' own collective timeout behind a watch of `timeout` seconds: after the watch and its roll call;
    None when the watch is off (0)."""
    if not timeout:
        return None
    return timeout + roll_call_window(timeout) + ENGINE_TIMEOUT_MARGIN_SECONDS
