"""Prometheus metrics of the operator, served on their own port (`/metrics`).

Runs by phase come from the ScalingRun watch stream (every event carries the current phase, and
deletions remove the run), so the gauge is right whoever wrote the status.
"""

from __future__ import annotations

import threading
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from scalingrun_api.models import Phase

REGISTRY = CollectorRegistry(auto_describe=True)

RUNS = Gauge("scalingrun_runs", "ScalingRuns by phase.", ["phase"], registry=REGISTRY)
RECONCILE_ERRORS = Counter("scalingrun_reconcile_errors_total", "Reconciles that raised, by handler.",
                           ["handler"], registry=REGISTRY)
CHILD_CREATE_SECONDS = Histogram(
    "scalingrun_child_create_seconds", "Latency of creating a child object (API call), by kind.", ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=REGISTRY)
RUN_TO_CHILD_SECONDS = Histogram(
    "scalingrun_run_to_child_seconds",
    "Seconds from a ScalingRun's creation to the creation of its child, by kind (1 s timestamp resolution).",
    ["kind"], buckets=(0.5, 1, 2, 5, 10, 30, 60, 300, 1800, 7200), registry=REGISTRY)

EVENTS = Counter("scalingrun_events_total",
                 "Events posted on ScalingRuns, by type and reason (e.g. ImagePullFailed, WorkerPodLost).",
                 ["type", "reason"], registry=REGISTRY)

_lock = threading.Lock()
_phases: dict[str, str] = {}


def observe_run(uid: str, phase: Optional[str], deleted: bool = False) -> None:
    """Records a run's phase (None: not yet reconciled, counted as Pending) or its deletion."""
    with _lock:
        if deleted:
            _phases.pop(uid, None)
        else:
            _phases[uid] = phase or Phase.pending.value
        counts = {p.value: 0 for p in Phase}
        for value in _phases.values():
            counts[value] = counts.get(value, 0) + 1
        for name, count in counts.items():
            RUNS.labels(phase=name).set(count)


def tracked_runs() -> int:
    with _lock:
        return len(_phases)


def observe_child_created(kind: str, seconds: float) -> None:
    CHILD_CREATE_SECONDS.labels(kind=kind).observe(seconds)


def serve(port: int, address: str = "0.0.0.0") -> None:
    if port:
        start_http_server(port, addr=address, registry=REGISTRY)
