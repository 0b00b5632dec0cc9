"""bench/chaos.py's plan and figures, as pure functions: the seeded fault schedule, what each fault should add to
a run's status.training.interruptions, and the figures from what the driver saw (no cluster here: unit tested in
tests/unit/bench).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from typing import Optional

# Every fault the soak injects. Aimed at one run: a worker pod deleted, a worker's containers paused (frozen, as a hung
# GPU's process: alive and silent), a push flood from its pod, the node's capacity dropped under an elastic run (its
# extra workers deleted with it). Aimed at the cluster: the kubelet stopped then started, the operator's leader pod
# killed, the object store's pod killed, the operator's TCP connections to the API server reset (its watches broken).
RUN_FAULTS = ("worker_deleted", "worker_frozen", "push_flood", "capacity_drop")
CLUSTER_FAULTS = ("kubelet_restart", "operator_killed", "store_killed", "watch_broken")
KINDS = RUN_FAULTS + CLUSTER_FAULTS
DEFAULT_MIX = {"worker_deleted": 3, "worker_frozen": 1, "push_flood": 1, "capacity_drop": 1, "kubelet_restart": 1,
               "operator_killed": 2, "store_killed": 1, "watch_broken": 1}
# The interruption cause (status.training.interruptions) a fault that takes effect is counted under; None: a fault
# the run must ride out uncounted (the kubelet is back before the node's 40 s grace: the node never goes NotReady).
COUNTED_AS = {"worker_deleted": "podDeleted", "worker_frozen": "stalled", "capacity_drop": "podDeleted",
              "push_flood": None, "kubelet_restart": None, "operator_killed": None, "store_killed": None,
              "watch_broken": None}
# Faults after which the run starts a new attempt (new launcher): its time back and the work it redid are measured.
RESTARTING = ("worker_deleted", "worker_frozen", "capacity_drop")
# How long a fault holds (s): the kubelet stays stopped under the node's 40 s NotReady grace; a frozen worker stays
# paused until the stall timeout has passed (set by the driver); the capacity and the flood come back.
HOLD_RANGES = {"kubelet_restart": (10.0, 30.0), "capacity_drop": (30.0, 60.0), "push_flood": (10.0, 20.0)}


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the soak's start
    kind: str
    target: Optional[int]  # the run slot a run fault is aimed at; None for the cluster's
    hold: float = 0.0  # seconds it lasts (0: instant)

    def line(self) -> str:
        aim = f" slot {self.target}" if self.target is not None else ""
        return f"t+{self.at:6.1f}s {self.kind}{aim}" + (f" for {self.hold:.0f}s" if self.hold else "")


def parse_mix(text: str) -> dict[str, int]:
    """'worker_deleted=3,operator_killed=1' -> weights; unknown kinds or bad weights are an error."""
    mix: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, weight = part.partition("=")
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}: one of {', '.join(KINDS)}")
        try:
            mix[kind] = int(weight or "1")
        except ValueError:
            raise ValueError(f"weight of {kind} must be an integer, not {weight!r}") from None
        if mix[kind] < 0:
            raise ValueError(f"weight of {kind} must be >= 0, not {mix[kind]}")
    if not any(mix.values()):
        raise ValueError(f"no fault with a weight above 0 in {text!r}")
    return mix


def mix_text(mix: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in mix.items())


def schedule(seed: int, minutes: float, faults: int, slots: list[str], mix: dict[str, int],
             start: float = 60.0, freeze_hold: float = 90.0) -> list[Fault]:
    """`faults` faults between `start` s and the end of `minutes`, kinds drawn by `mix`'s weights, run faults aimed at
    a slot drawn among those they fit (capacity_drop: only 'elastic' slots); the same arguments give the same list.
    One fault of a kind at a time: a later one of that kind waits until the earlier has ended (or is left out, when
    that is past the end)."""
    if faults < 0 or minutes <= 0:
        raise ValueError("faults must be >= 0 and minutes > 0")
    end = minutes * 60.0
    if start >= end:
        raise ValueError(f"the soak ({end:.0f} s) must outlast the warm-up ({start:.0f} s)")
    rng = random.Random(seed)
    elastic = [i for i, kind in enumerate(slots) if kind == "elastic"]
    kinds = [k for k in KINDS if mix.get(k, 0) > 0 and (k != "capacity_drop" or elastic) and
             (k not in RUN_FAULTS or slots)]
    if faults and not kinds:
        raise ValueError("no fault kind in the mix fits these runs")
    weights = [mix[k] for k in kinds]
    times = sorted(rng.uniform(start, end) for _ in range(faults))
    busy_until: dict[str, float] = {}
    plan: list[Fault] = []
    for at in times:
        kind = rng.choices(kinds, weights)[0]
        low, high = HOLD_RANGES.get(kind, (0.0, 0.0))
        hold = freeze_hold if kind == "worker_frozen" else round(rng.uniform(low, high), 1)
        target = None
        if kind == "capacity_drop":
            target = rng.choice(elastic)
        elif kind in RUN_FAULTS:
            target = rng.randrange(len(slots))
        at = round(max(at, busy_until.get(kind, 0.0)), 1)
        if at >= end:  # pushed past the end by the one before it of its kind: not in this soak
            continue
        busy_until[kind] = at + hold + 1.0
        plan.append(Fault(at, kind, target, hold))
    return sorted(plan, key=lambda f: f.at)


# --- figures ----------------------------------------------------------------------------------------------------


@dataclass
class Applied:
    """A fault as the driver applied it: to which run (None: the cluster), whether it took hold (a worker was there to
    delete or freeze), and what the run showed then and after."""
    fault: Fault
    run: Optional[str]
    took: bool
    at_wall: float  # time.time() when applied
    why_not: str = ""
    counted: int = 1  # units the run should count (capacity_drop: the workers deleted)
    launcher_before: Optional[str] = None  # heartbeat launcherUid then
    epoch_before: Optional[int] = None
    back_after: Optional[float] = None  # s from the fault to the run training again
    resumed_from: Optional[int] = None  # the new attempt's resumedFromEpoch
    outage_s: Optional[float] = None  # store_killed: s until the store's new pod was Ready
    notes: list[str] = field(default_factory=list)

    @property
    def redone(self) -> Optional[int]:
        """Epochs trained again: finished when the fault came, and not in the checkpoint the new attempt resumed."""
        if self.epoch_before is None or self.resumed_from is None:
            return None
        return max(0, self.epoch_before - self.resumed_from)


def percentile(values: list[float], share: float) -> Optional[float]:
    """Nearest-rank percentile (share 0.5, 0.95); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-share * len(ordered) // 1))))
    return ordered[rank - 1]


def figures(applied: list[Applied]) -> dict[str, dict]:
    """Per kind: scheduled, took hold, recovered (training again measured), p50/p95 of the time back, the work
    redone."""
    out: dict[str, dict] = {}
    for kind in KINDS:
        mine = [a for a in applied if a.fault.kind == kind]
        if not mine:
            continue
        took = [a for a in mine if a.took]
        back = [a.back_after for a in took if a.back_after is not None]
        redone = [a.redone for a in took if a.redone is not None]
        out[kind] = {"scheduled": len(mine), "took": len(took), "recovered": len(back),
                     "back_p50_s": percentile(back, 0.5), "back_p95_s": percentile(back, 0.95),
                     "redone_epochs_mean": round(statistics.mean(redone), 2) if redone else None,
                     "redone_epochs_max": max(redone) if redone else None}
    return out
