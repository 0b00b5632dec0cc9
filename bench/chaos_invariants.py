"""bench/chaos.py's invariants, as pure functions over what the driver recorded of each run: each returns the
runs that break it, one line each (an empty list: it holds). Unit tested in tests/unit/bench with a crafted bad
history and a good one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from bench.chaos_plan import COUNTED_AS, RESTARTING, Applied

NO_TORCH = "not loaded: no torch here"  # a Lightning run's model, where this Python has no torch: not a failure
# The one way a fault may fail a run: more of them than spec.training.maxInterruptions allows
# (scalingrun_operator.decide.status.MAX_INTERRUPTIONS_EXCEEDED).
FAULT_BEYOND_LIMIT = "MaxInterruptionsExceeded"
SAMPLE_SLACK_S = 10.0  # a sample up to this long before a fault still shows the run training into it


@dataclass(frozen=True)
class Sample:
    """One read of a run's status: when (time.time()), its phase, last finished epoch, its heartbeat (its time as
    seconds since the epoch, the launcher it came from, the phase it was in) and the checkpoint it resumed from."""
    at: float
    phase: Optional[str]
    epoch: Optional[int] = None
    heartbeat_at: Optional[float] = None
    launcher: Optional[str] = None
    beat_phase: Optional[str] = None  # training, restore, probe, ...
    resumed_from: Optional[int] = None  # status.training.resumedFromEpoch
    interruptions: Optional[dict] = None  # status.training.interruptions then


@dataclass
class RunRecord:
    name: str
    slot_kind: str
    phase: Optional[str] = None
    conditions: list[dict] = field(default_factory=list)
    interruptions: dict[str, int] = field(default_factory=dict)
    epoch: Optional[int] = None
    history: Optional[list[int]] = None  # epochs in progress.json's history, in order
    model_size: Optional[int] = None  # bytes of status.modelUri in the store (None: not found)
    checkpoints: Optional[int] = None  # files under <run>/checkpoints
    samples: list[Sample] = field(default_factory=list)
    left_behind: Optional[list[str]] = None  # objects still there after its deletion (None: not deleted)
    ended_at: Optional[float] = None
    points_after: int = 0  # a sweep point's run: the sweep's points still to come after it
    model_loaded: Optional[str] = None  # what loading the model showed (None: not loaded, or not tried)
    stall_events: list[str] = field(default_factory=list)  # the operator's Stalled Events: why it judged a stall
    model_note: str = ""  # no model found: whether status named one, what the store holds, the Trained condition
    model_error: str = ""  # why it did not load or predict (a broken invariant)


@dataclass
class SweepRecord:
    name: str
    points: list[str]  # its point runs' names, in order
    phase: Optional[str] = None
    message: str = ""
    recommended: Optional[str] = None  # status.recommendation.run
    left_behind: Optional[list[str]] = None


def ends_succeeded_or_failed_by_faults(runs: list[RunRecord]) -> list[str]:
    broken = []
    for run in runs:
        if run.phase == "Succeeded":
            continue
        failed = next((c for c in run.conditions if c.get("type") == "Failed" and c.get("status") == "True"), {})
        if run.phase == "Failed" and failed.get("reason") == FAULT_BEYOND_LIMIT:
            continue
        why = f"{failed.get('reason')}: {failed.get('message')}" if failed else "no Failed condition"
        broken.append(f"{run.name}: ended {run.phase} ({why})")
    return broken


def progress_key(sample: Sample) -> tuple:
    return sample.phase, sample.epoch, sample.heartbeat_at, sample.launcher


def never_silent_past(limit: float) -> Callable[[list[RunRecord]], list[str]]:
    """No run stays Training with nothing moving (epoch, heartbeat, attempt) longer than `limit` s (the stall timeout
    plus a grace for a restart on this node)."""
    def check(runs: list[RunRecord]) -> list[str]:
        broken = []
        for run in runs:
            since: Optional[Sample] = None
            longest, worst_at = 0.0, 0.0
            for sample in run.samples:
                if sample.phase != "Training" or since is None or progress_key(sample) != progress_key(since):
                    since = sample if sample.phase == "Training" else None
                    continue
                if sample.at - since.at > longest:
                    longest, worst_at = sample.at - since.at, since.at
            if longest > limit:
                broken.append(f"{run.name}: Training with no progress for {longest:.0f} s (limit {limit:.0f} s) "
                              f"from {worst_at:.0f}")
        return broken
    return check


def each_epoch_once(runs: list[RunRecord]) -> list[str]:
    """progress.json's history has epochs 1..n each once, and a Succeeded run's n is its last epoch in status."""
    broken = []
    for run in runs:
        if run.history is None:
            if run.phase == "Succeeded":
                broken.append(f"{run.name}: Succeeded with no progress.json history")
            continue
        if run.history != list(range(1, len(run.history) + 1)):
            broken.append(f"{run.name}: history epochs {run.history}")
        elif run.phase == "Succeeded" and len(run.history) != run.epoch:
            broken.append(f"{run.name}: history ends at epoch {len(run.history)}, status at {run.epoch}")
    return broken


def model_and_checkpoints_stored(runs: list[RunRecord]) -> list[str]:
    """A Succeeded run's model (at its status.modelUri) and checkpoints; a missing one says what status and the
    store showed instead (model_note)."""
    return [f"{run.name}: model {run.model_size} bytes, {run.checkpoints} checkpoint files"
            + (f"; {run.model_note}" if run.model_note else "")
            for run in runs if run.phase == "Succeeded" and not (run.model_size and run.checkpoints)]


def models_load(runs: list[RunRecord]) -> list[str]:
    """A Succeeded run's model loads and predicts (a Lightning one's may be left unloaded: no torch here)."""
    return [f"{run.name}: model did not load: {run.model_error or 'not tried'}" for run in runs
            if run.phase == "Succeeded" and run.model_loaded is None]


def models_loaded_line(runs: list[RunRecord]) -> str:
    succeeded = [r for r in runs if r.phase == "Succeeded"]
    loaded = [r for r in succeeded if r.model_loaded and r.model_loaded.startswith("loaded")]
    no_torch = sum(r.model_loaded == NO_TORCH for r in succeeded)
    return f"a Succeeded run's model loads and predicts ({len(loaded)} of {len(succeeded)} loaded" + \
        (f"; {no_torch} {NO_TORCH}" if no_torch else "") + ")"


def sweeps_recommend_or_fail_by_faults(sweeps: list[SweepRecord], runs: list[RunRecord]) -> list[str]:
    """A sweep ends Succeeded with a recommendation, or Failed because a point failed by faults beyond its
    maxInterruptions."""
    failed_by_faults = {r.name for r in runs if not ends_succeeded_or_failed_by_faults([r]) and r.phase == "Failed"}
    broken = []
    for sweep in sweeps:
        if sweep.phase == "Succeeded" and sweep.recommended in sweep.points:
            continue
        if sweep.phase == "Failed" and failed_by_faults & set(sweep.points):
            continue
        broken.append(f"{sweep.name}: ended {sweep.phase}, recommended {sweep.recommended} ({sweep.message[:200]})")
    return broken


def expected_counts(applied: list[Applied], run: str, stall_timeout: float, ended_at: Optional[float],
                    grace: float) -> dict[str, tuple[int, int]]:
    """(least, most) each cause should count for the faults that took hold on `run`. A frozen worker's stall is
    certain only when nothing else restarted the attempt and the run still trained `stall_timeout + grace` after it;
    a fault applied while another restart was under way may be taken for part of it (least 0)."""
    mine = sorted((a for a in applied if a.run == run and a.took and COUNTED_AS[a.fault.kind]),
                  key=lambda a: a.at_wall)
    counts: dict[str, list[int]] = {}
    for i, fault in enumerate(mine):
        cause = COUNTED_AS[fault.fault.kind]
        bounds = counts.setdefault(cause, [0, 0])
        bounds[1] += fault.counted
        window_end = fault.at_wall + (stall_timeout + grace if fault.fault.kind == "worker_frozen" else grace)
        crowded = any(abs(other.at_wall - fault.at_wall) < stall_timeout + grace for other in mine
                      if other is not fault)
        if not crowded and (ended_at is None or ended_at > window_end):
            bounds[0] += fault.counted
    return {cause: (low, high) for cause, (low, high) in counts.items()}


def rises(run: RunRecord, cause: str) -> list[float]:
    """When (the first sample showing it) each count of `cause` was added to the run's status."""
    times, before = [], 0
    for sample in run.samples:
        now = (sample.interruptions or {}).get(cause, before) if sample.interruptions is not None else before
        times += [sample.at] * max(0, now - before)
        before = max(before, now)
    return times


def after_which(applied: list[Applied], at: float) -> str:
    """The last fault applied before `at`, to say what a count that was not expected followed."""
    before = [a for a in applied if a.took and a.at_wall <= at]
    if not before:
        return "no fault before it"
    last = max(before, key=lambda a: a.at_wall)
    return f"{at - last.at_wall:.0f} s after {last.fault.kind} on {last.run or 'the cluster'}"


def outage_stalls(applied: list[Applied], run: RunRecord, stall_timeout: float) -> int:
    """Stalls a store outage longer than stallTimeout may add to a run that trained into it: its ranks wait on reads
    the store cannot answer, the heartbeat stops, and the operator restarts the attempt, once per stallTimeout
    of the outage at most (the product cannot tell a store down from a frozen rank; the new attempt waits too)."""
    most = 0
    for fault in applied:
        if fault.fault.kind != "store_killed" or not fault.took or not fault.outage_s \
                or fault.outage_s <= stall_timeout:
            continue
        end = fault.at_wall + fault.outage_s
        if any(fault.at_wall - SAMPLE_SLACK_S <= sample.at <= end and sample.phase == "Training"
               for sample in run.samples):
            most += 1 + int(fault.outage_s // stall_timeout)
    return most


def counted_once_under_cause(applied: list[Applied], stall_timeout: float, grace: float
                             ) -> Callable[[list[RunRecord]], list[str]]:
    def check(runs: list[RunRecord]) -> list[str]:
        broken = []
        for run in runs:
            expected = expected_counts(applied, run.name, stall_timeout, run.ended_at, grace)
            outage = outage_stalls(applied, run, stall_timeout)
            if outage:
                low, high = expected.get("stalled", (0, 0))
                expected["stalled"] = (low, high + outage)
            counted = {cause: n for cause, n in run.interruptions.items() if n}
            for cause in sorted(set(expected) | set(counted)):
                low, high = expected.get(cause, (0, 0))
                if not low <= counted.get(cause, 0) <= high:
                    seen = "; ".join(f"one seen {after_which(applied, at)}" for at in rises(run, cause))
                    said = "".join(f"; the operator: {event}" for event in run.stall_events) \
                        if cause == "stalled" else ""
                    broken.append(f"{run.name}: {cause} counted {counted.get(cause, 0)}, expected "
                                  f"{low if low == high else f'{low}..{high}'}" + (f" ({seen})" if seen else "")
                                  + said)
        return broken
    return check


def nothing_left_behind(runs: list) -> list[str]:
    """Runs and sweeps: what was still there after their deletion."""
    return [f"{run.name}: left {', '.join(run.left_behind)}" for run in runs if run.left_behind]


def rss_under(limit_bytes: int, samples: list[int]) -> list[str]:
    peak = max(samples, default=0)
    if not samples:
        return ["operator RSS never sampled"]
    return [f"operator RSS peaked at {peak / 2**20:.0f} MiB, limit {limit_bytes / 2**20:.0f} MiB"] \
        if peak >= limit_bytes else []


# Heartbeat phases of a training loop at work; the others (starting, restore, feature-cache) show an attempt starting.
TRAINING_BEATS = ("training", "validation")


def measure_recovery(applied: Applied, runs: list[RunRecord], sample_every: float) -> None:
    """Time from the fault to training again: a heartbeat of the training loop written after the fault ended, and
    for a fault that restarts the attempt, after the new attempt showed (another launcher, or a starting phase); the
    epoch that attempt resumed from. A cluster fault's is the slowest of the runs then training that trained again
    (a run that ended first has nothing to come back to)."""
    if not applied.took:
        return
    after = applied.at_wall + applied.fault.hold
    targets = [r for r in runs if r.name == applied.run] if applied.run else \
        [r for r in runs if any(abs(s.at - applied.at_wall) < sample_every * 2 and s.phase == "Training"
                                for s in r.samples)]
    backs = []
    for run in targets:
        restarted = applied.fault.kind not in RESTARTING
        later = [s for s in run.samples if s.at >= applied.at_wall]
        for i, sample in enumerate(later):
            if not restarted and (sample.launcher != applied.launcher_before or
                                  sample.beat_phase not in TRAINING_BEATS):
                restarted = True
                continue
            if restarted and sample.beat_phase in TRAINING_BEATS and (sample.heartbeat_at or 0) > after:
                backs.append(sample.heartbeat_at - applied.at_wall)
                if applied.run and applied.fault.kind in RESTARTING:
                    applied.resumed_from = next((s.resumed_from for s in later[i:] if s.resumed_from is not None),
                                                None)
                break
    if backs and (applied.run is None or len(backs) == len(targets)):
        applied.back_after = round(max(backs), 1)


def verdicts(runs: list[RunRecord], applied: list[Applied], stall_timeout: float, grace: float,
             rss_limit: int, rss_samples: list[int], sweeps: Optional[list[SweepRecord]] = None
             ) -> list[tuple[str, list[str]]]:
    """Every invariant, in the report's order: (its line, the runs that break it)."""
    return [
        ("every run ends Succeeded, or Failed by faults beyond maxInterruptions",
         ends_succeeded_or_failed_by_faults(runs)),
        (f"no run Training with no progress past stallTimeout + grace ({stall_timeout + grace:.0f} s)",
         never_silent_past(stall_timeout + grace)(runs)),
        ("each epoch in progress.json's history once, none missing", each_epoch_once(runs)),
        ("a Succeeded run's model and checkpoints are in the store", model_and_checkpoints_stored(runs)),
        (models_loaded_line(runs), models_load(runs)),
        ("status counts each fault once, under its cause",
         counted_once_under_cause(applied, stall_timeout, grace)(runs)),
        ("every sweep ends with a recommendation, or Failed by a point's faults beyond maxInterruptions "
         f"({len(sweeps or [])} sweeps)", sweeps_recommend_or_fail_by_faults(sweeps or [], runs)),
        ("nothing left behind after deletion (pods, MPIJob, Jobs, ConfigMaps, probes; sweeps' runs)",
         nothing_left_behind(runs + list(sweeps or []))),
        ("operator RSS under its memory limit", rss_under(rss_limit, rss_samples)),
    ]
