"""bench/chaos.py's pacing, as pure functions over the samples it recorded: the seconds per epoch each run showed,
how long a whole run of a slot's kind takes (so that no new run starts that the soak's end would cut: --min-left),
and how long to wait after the soak for the runs still going to end (--drain). Unit tested in tests/unit/bench.
"""

from __future__ import annotations

from typing import Optional

from bench.chaos_invariants import RunRecord

SLOT_KINDS = ("keras", "lightning", "elastic", "sweep")
DEFAULT_CYCLE = ("keras", "lightning", "elastic")
SWEEP_FROM_RUNS = 5  # with this many slots or more the fifth is a sweep
SWEEP_POINTS = (1, 2)  # a sweep slot's worker counts: its child runs, one after another
# Before any run has trained two epochs: the soak's fallbacks (s).
UNMEASURED_MIN_LEFT = 120.0
UNMEASURED_EPOCH_S = 30.0


def parse_slots(text: str) -> list[str]:
    """'keras,lightning,elastic,keras,sweep' -> the slot kinds in order; an unknown kind is an error."""
    slots = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in slots if s not in SLOT_KINDS]
    if unknown or not slots:
        raise ValueError(f"slots are a comma-separated list of {', '.join(SLOT_KINDS)}, not {text!r}")
    return slots


def slot_cycle(runs: int) -> list[str]:
    """K slots cycling keras, lightning, elastic; from SWEEP_FROM_RUNS slots on, the fifth is a sweep."""
    slots = [DEFAULT_CYCLE[i % len(DEFAULT_CYCLE)] for i in range(runs)]
    if runs >= SWEEP_FROM_RUNS:
        slots[SWEEP_FROM_RUNS - 1] = "sweep"
    return slots


def epochs_of(slot_kind: str, epochs: int) -> int:
    """Epochs a slot's run (a sweep: all its points, one after another) trains from its start."""
    return epochs * (len(SWEEP_POINTS) if slot_kind == "sweep" else 1)


def seconds_per_epoch(run: RunRecord) -> Optional[float]:
    """The run's pace from its samples: time from the first epoch it showed to when it first showed its last, over the
    epochs between (restarts included: a soak's pace); None before it has shown two different epochs."""
    seen = [(s.at, s.epoch) for s in run.samples if s.epoch is not None]
    if not seen:
        return None
    first = seen[0]
    last = next(s for s in seen if s[1] == seen[-1][1])
    advanced = last[1] - first[1]
    return (last[0] - first[0]) / advanced if advanced > 0 else None


def slowest_pace(runs: list[RunRecord], slot_kind: str) -> Optional[float]:
    """The slowest seconds per epoch among runs of `slot_kind` (any kind's when none of it has a pace yet)."""
    mine = [p for r in runs if r.slot_kind == slot_kind and (p := seconds_per_epoch(r)) is not None]
    every = [p for r in runs if (p := seconds_per_epoch(r)) is not None]
    return max(mine or every, default=None)


def start_up_seconds(runs: list[RunRecord]) -> float:
    """The slowest time from a run's first sample to its first epoch shown (preprocessing, pods, restore)."""
    starts = [next(s.at for s in r.samples if s.epoch is not None) - r.samples[0].at
              for r in runs if any(s.epoch is not None for s in r.samples)]
    return max(starts, default=0.0)


def run_seconds(runs: list[RunRecord], slot_kind: str, epochs: int) -> Optional[float]:
    """How long a new run of `slot_kind` should take: the longest a finished one of its kind took, or else its start-up
    plus `epochs` at the slowest pace seen; None when nothing was measured yet."""
    done = [r.ended_at - r.samples[0].at for r in runs if r.slot_kind == slot_kind and r.ended_at and r.samples
            and r.phase == "Succeeded"]
    if done:  # a sweep's records are its points: it takes all of them
        return max(done) * (len(SWEEP_POINTS) if slot_kind == "sweep" else 1)
    pace = slowest_pace(runs, slot_kind)
    return None if pace is None else start_up_seconds(runs) + pace * epochs_of(slot_kind, epochs)


def min_left(runs: list[RunRecord], slot_kind: str, epochs: int, fixed: Optional[float]) -> float:
    """Seconds of the soak that must remain for a new run of `slot_kind` to start: `fixed` when given, else as long
    as such a run takes (so it ends about when the soak does)."""
    if fixed is not None:
        return fixed
    measured = run_seconds(runs, slot_kind, epochs)
    return UNMEASURED_MIN_LEFT if measured is None else measured


def drain_seconds(running: list[RunRecord], every: list[RunRecord], epochs: int, margin: float) -> float:
    """How long after the soak the runs still going may take to end: the longest of their epochs left (a sweep point's
    run: its later points' too) at the slowest pace of their kind, plus a start-up for a run with no epoch yet, plus `margin` (a
    restart: stallTimeout + grace)."""
    longest = 0.0
    for run in running:
        pace = slowest_pace(every, run.slot_kind) or UNMEASURED_EPOCH_S
        done = next((s.epoch for s in reversed(run.samples) if s.epoch is not None), None)
        left = (max(0, epochs - (done or 0)) + run.points_after * epochs) * pace
        longest = max(longest, left + (start_up_seconds(every) if done is None else 0.0))
    return round(longest + margin, 1)
