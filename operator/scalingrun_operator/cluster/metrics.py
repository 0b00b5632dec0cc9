"""Prometheus metrics of the operator, served on their own port (`/metrics`); docs/operations.md names them all.

Runs by phase and the per-run series (`scalingrun_run_*`, labelled `namespace` and `run`) come from the ScalingRun
watch stream: every event carries the run's current status, and a deletion removes the run's series, so they are
right whoever wrote the status and a deleted run leaves no series behind. The per-run series are built at scrape
time from the last status seen (a collector, not one Gauge per field): nothing outlives the run.
One Metrics per operator (its own registry), made at start-up; tests make their own.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from scalingrun_api.models import Phase

RUN_LABELS = ["namespace", "run"]


@dataclass(frozen=True)
class RunFacts:
    """What the per-run series say about one run: its status, as last seen."""

    namespace: str
    run: str
    phase: str
    training: dict[str, Any] = field(default_factory=dict)
    conditions: tuple[tuple[str, str], ...] = ()  # (type, status)

    @classmethod
    def of(cls, body: dict[str, Any], phase: str) -> "RunFacts":
        meta, status = body.get("metadata") or {}, body.get("status") or {}
        conditions = tuple((c["type"], c.get("status") or "Unknown") for c in status.get("conditions") or []
                           if isinstance(c, dict) and c.get("type"))
        return cls(meta.get("namespace") or "", meta.get("name") or "", phase, dict(status.get("training") or {}),
                   conditions)


def _timestamp(value: Any) -> Optional[float]:
    if not isinstance(value, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)).timestamp()


# The per-run numbers: (metric, type, help, how to read it from status.training).
_RUN_NUMBERS: tuple[tuple[str, str, str, Callable[[dict[str, Any]], Any]], ...] = (
    ("scalingrun_run_epoch", "gauge", "Last finished epoch (status.training.epoch).", lambda t: t.get("epoch")),
    ("scalingrun_run_max_epochs", "gauge", "Epoch limit (status.training.maxEpochs).", lambda t: t.get("maxEpochs")),
    ("scalingrun_run_images_per_second", "gauge", "Training throughput, all processes, last epoch.",
     lambda t: t.get("imagesPerSecond")),
    ("scalingrun_run_input_wait_ratio", "gauge", "Share of the last epoch the training waited for input (0-1).",
     lambda t: t.get("inputWaitFraction")),
    ("scalingrun_run_heartbeat_timestamp_seconds", "gauge", "Unix time of the training's last heartbeat.",
     lambda t: _timestamp((t.get("heartbeat") or {}).get("time"))),
    ("scalingrun_run_restarts", "counter", "Training restarts (status.training.restarts).",
     lambda t: t.get("restarts")),
    ("scalingrun_run_gpu_hours", "counter", "GPU-hours the training used (status.training.gpuHours).",
     lambda t: t.get("gpuHours")),
    ("scalingrun_run_process_hours", "counter", "Process-hours the training used (status.training.processHours).",
     lambda t: t.get("processHours")),
)


class RunSeries:
    """A collector of the per-run series, from the last status seen of each run (keyed by uid)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RunFacts] = {}

    def observe(self, uid: str, facts: Optional[RunFacts]) -> None:
        with self._lock:
            if facts is None:
                self._runs.pop(uid, None)
            else:
                self._runs[uid] = facts

    def describe(self) -> list[Metric]:
        return list(self._families([]))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            runs = list(self._runs.values())
        return self._families(runs)

    @staticmethod
    def _families(runs: list[RunFacts]) -> Iterator[Metric]:
        phase = GaugeMetricFamily("scalingrun_run_phase", "1 for the run's current phase (one series per run).",
                                  labels=[*RUN_LABELS, "phase"])
        condition = GaugeMetricFamily("scalingrun_run_condition", "A condition of the run: 1 True, 0 False or "
                                      "Unknown.", labels=[*RUN_LABELS, "condition"])
        interruptions = CounterMetricFamily("scalingrun_run_interruptions", "Interruptions of the training, by cause "
                                            "(status.training.interruptions).", labels=[*RUN_LABELS, "cause"])
        numbers = [(GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, text, labels=RUN_LABELS)
                   for name, kind, text, _ in _RUN_NUMBERS]
        for facts in runs:
            labels = [facts.namespace, facts.run]
            phase.add_metric([*labels, facts.phase], 1)
            for type_, status in facts.conditions:
                condition.add_metric([*labels, type_], 1 if status == "True" else 0)
            for cause, count in sorted((facts.training.get("interruptions") or {}).items()):
                if isinstance(count, (int, float)) and not isinstance(count, bool):
                    interruptions.add_metric([*labels, cause], count)
            for family, (_, _, _, read) in zip(numbers, _RUN_NUMBERS):
                value = read(facts.training)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    family.add_metric(labels, value)
        yield from (phase, condition, interruptions, *numbers)


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
        self.api_errors = Counter("scalingrun_api_errors_total",
                                  "Kubernetes API calls of a reconcile that failed, by HTTP status (0: no answer).",
                                  ["code"], registry=self.registry)
        self.push_errors = Counter("scalingrun_push_errors_total",
                                   "Writes the API server refused, by what was written (status, child, event).",
                                   ["what"], registry=self.registry)
        for what in ("status", "child", "event"):  # 0 from the start: rate() and absence alerts need the series
            self.push_errors.labels(what=what)
        self.queue_depth = Gauge("scalingrun_queue_depth", "Objects waiting in one of the operator's queues: "
                                 "triggers (reconciles deferred), rechecks (runs), sweep_rechecks, followed "
                                 "(progress documents watched).", ["queue"], registry=self.registry)
        self.leader = Gauge("scalingrun_leader", "1 while this replica acts (holds the Lease, or runs standalone).",
                            registry=self.registry)
        self.preflight_problem = Gauge("scalingrun_preflight_problem", "1 while a start-up check found a problem "
                                       "(warning or error; the log says which), by check (mpijob-api, crd-version...).",
                                       ["check"], registry=self.registry)
        self.run_series = RunSeries()
        self.registry.register(self.run_series)
        self.pushes = Counter("scalingrun_status_pushes_total",
                              "Pushes accepted by the status endpoint, by document (progress, heartbeat).",
                              ["document"], registry=self.registry)
        self.push_refusals = Counter(
            "scalingrun_status_push_refusals_total",
            "Pushes the status endpoint refused, by reason (NoToken, InvalidToken, WrongAudience, PodGone, "
            "NotAPodToken, OtherNamespace, UnknownRun, OtherRun, NotWatched, TooLarge, RateLimited, ReviewsBusy, "
            "TooManyNewTokens, BadDocument, RunBound, NamespaceBound, StoreFull).",
            ["reason"], registry=self.registry)
        self.status_config_rewrites = Counter(
            "scalingrun_status_configmap_rewrites_total",
            "ConfigMaps scalingrun-status found changed or deleted by someone else and written again.",
            registry=self.registry)
        self._lock = threading.Lock()
        self._phases: dict[str, str] = {}

    def observe_run(self, uid: str, phase: Optional[str], deleted: bool = False,
                    body: Optional[dict[str, Any]] = None) -> None:
        """Records a run's phase (None: not yet reconciled, counted as Pending) or its deletion; with `body`, its
        per-run series too (a deletion removes them)."""
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
        if deleted:
            self.run_series.observe(uid, None)
        elif body is not None:
            self.run_series.observe(uid, RunFacts.of(body, phase or Phase.pending.value))

    def watch_queue(self, queue: str, depth: Callable[[], int]) -> None:
        """`depth()` is read at every scrape."""
        self.queue_depth.labels(queue=queue).set_function(depth)

    def tracked_runs(self) -> int:
        with self._lock:
            return len(self._phases)

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        if port:
            start_http_server(port, addr=address, registry=self.registry)
