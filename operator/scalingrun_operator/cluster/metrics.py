"""Prometheus metrics of the operator, served on their own port (`/metrics`).

Runs by phase come from the ScalingRun watch stream (every event carries the current phase, and
deletions remove the run), so the gauge is right whoever wrote the status. One Metrics per operator
(its own registry), made at start-up; tests make their own.
"""

from __future__ import annotations

import threading
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from scalingrun_api.models import Phase


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.runs = Gauge("scalingrun_runs", "ScalingRuns by phase.", ["phase"], registry=self.registry)
        self.reconcile_errors = Counter("scalingrun_reconcile_errors_total", "Reconciles that raised, by handler.",
                                        ["handler"], registry=self.registry)
        self.reconciles = Counter("scalingrun_reconciles_total", "Reconciles started, by kind (run, sweep).", ["kind"],
                                  registry=self.registry)
        self.child_create_seconds = Histogram(
            "scalingrun_child_create_seconds", "Latency of creating a child object (API call), by kind.", ["kind"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=self.registry)
        self.run_to_child_seconds = Histogram(
            "scalingrun_run_to_child_seconds",
            "Seconds from a ScalingRun's creation to the creation of its child, by kind (1 s timestamp resolution).",
            ["kind"], buckets=(0.5, 1, 2, 5, 10, 30, 60, 300, 1800, 7200), registry=self.registry)
        self.events = Counter("scalingrun_events_total",
                              "Events posted on ScalingRuns, by type and reason (e.g. ImagePullFailed, WorkerPodLost).",
                              ["type", "reason"], registry=self.registry)
        self.pushes = Counter("scalingrun_status_pushes_total",
                              "Pushes accepted by the status endpoint, by document (progress, heartbeat).",
                              ["document"], registry=self.registry)
        self.push_refusals = Counter(
            "scalingrun_status_push_refusals_total",
            "Pushes the status endpoint refused, by reason (NoToken, InvalidToken, WrongAudience, PodGone, "
            "NotAPodToken, OtherNamespace, OtherRun, NotWatched, TooLarge, RateLimited, BadDocument).", ["reason"],
            registry=self.registry)
        self._lock = threading.Lock()
        self._phases: dict[str, str] = {}

    def observe_run(self, uid: str, phase: Optional[str], deleted: bool = False) -> None:
        """Records a run's phase (None: not yet reconciled, counted as Pending) or its deletion."""
        with self._lock:
            if deleted:
                self._phases.pop(uid, None)
            else:
                self._phases[uid] = phase or Phase.pending.value
            counts = {p.value: 0 for p in Phase}
            for value in self._phases.values():
                counts[value] = counts.get(value, 0) + 1
            for name, count in counts.items():
                self.runs.labels(phase=name).set(count)

    def tracked_runs(self) -> int:
        with self._lock:
            return len(self._phases)

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        if port:
            start_http_server(port, addr=address, registry=self.registry)
