"""The operator's kopf wiring: startup settings and thin handlers that all run one reconcile.

Every trigger (create, resume after a restart, spec change, an event of a child Job, MPIJob or pod,
a changed progress document) calls the same level-triggered reconcile (handlers/reconcile.py), so
what a handler saw last does not matter: the reconcile reads the world again. There is no timer,
daemon or deletion handler per run: kopf would put a finalizer on every run for one, and a run (or
its namespace) could then not be deleted while the operator is down. What no event announces
(object storage) is watched by one operator-wide thread (progress_watch.py). kopf keeps its own
bookkeeping in annotations under scalingrun.dev/, because the status schema is structural and would
prune status.kopf. Run it with `scalingrun-operator` (or `scalingrun operator`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any, Optional

import kopf

from . import metrics, progress_watch
from scalingrun_api.models import GROUP, PLURAL, VERSION
from .config import Config, ConfigError, load
from .builders.common import RUN_LABEL
from .handlers.reconcile import Reconciler, child_event_matters, forget, owner_of, pod_event_matters
from .handlers.sweep import SweepReconciler, sweep_of
from scalingrun_api.models import SWEEP_PLURAL
from .builders.sweep import SWEEP_LABEL
from .k8s import MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION, Kube, new_api_client
from .leader import LeaderElector, LeaseSettings, StandbyHealth, default_identity, default_namespace
from .peering import PeeringError, ensure_peering

log = logging.getLogger(__name__)

# Read at import (flags override it in run()). A bad value is reported by run() (or the startup handler)
# with the variable's name, not as an import traceback.
try:
    CONFIG: Config = load()
    _CONFIG_ERROR: Optional[ConfigError] = None
except ConfigError as _error:
    CONFIG, _CONFIG_ERROR = Config(), _error
ANNOTATION_PREFIX = "scalingrun.dev"
MANAGED = {"app.kubernetes.io/managed-by": "scalingrun-operator"}

_reconcile: dict[str, Reconciler] = {}


def _run(namespace: str, name: str, handler: str) -> None:
    try:
        _reconcile["run"](namespace, name)
    except Exception as exc:
        metrics.RECONCILE_ERRORS.labels(handler=handler).inc()
        # kopf retries no event handler, and no timer comes by: the watcher tries again (TemporaryError's delay).
        delay = getattr(exc, "delay", None) or CONFIG.recheck_interval_seconds
        progress_watch.schedule_recheck(namespace, name, delay)
        raise


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    if _CONFIG_ERROR is not None:
        raise kopf.PermanentError(str(_CONFIG_ERROR))
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"  # unused: deletion is left to GC
    settings.posting.enabled = False  # our Events are written by Kube.post_event, one per phase change
    settings.execution.max_workers = CONFIG.max_workers
    settings.peering.lifetime = CONFIG.peering_lifetime_seconds
    # Re-list now and then (no watch lives forever); a re-list reconciles only what changed (child_event_matters).
    settings.watching.server_timeout = CONFIG.watch_timeout_seconds
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    watcher = progress_watch.ProgressWatcher(lambda namespace, name: _run(namespace, name, "watcher"),
                                             CONFIG.poll_interval_seconds, CONFIG.progress_checks_per_second)
    _reconcile["run"] = Reconciler(Kube(new_api_client(), CONFIG.component), CONFIG, watcher)
    progress_watch.WATCHER = watcher
    watcher.start()
    _reconcile["sweep"] = SweepReconciler(Kube(new_api_client(), CONFIG.component), CONFIG)
    metrics.serve(CONFIG.metrics_port_number)


@kopf.on.cleanup()
def stop_watching(**_: Any) -> None:
    if progress_watch.WATCHER is not None:
        progress_watch.WATCHER.stop()
        progress_watch.WATCHER = None


@kopf.on.probe(id="runs")
def runs_probe(**_: Any) -> int:
    """Liveness: kopf answers on its endpoint while its loop is alive; this adds the runs tracked."""
    return metrics.tracked_runs()


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
def run_created(namespace: str, name: str, **_: Any) -> None:
    _run(namespace, name, "create")


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def spec_changed(namespace: str, name: str, **_: Any) -> None:
    _run(namespace, name, "update")


@kopf.on.event(GROUP, VERSION, PLURAL)
def track(type: Optional[str], uid: str, namespace: str, name: str, status: dict[str, Any], **_: Any) -> None:
    deleted = type == "DELETED"
    metrics.observe_run(uid, status.get("phase"), deleted=deleted)
    if deleted:
        forget(namespace, name)
        if progress_watch.WATCHER is not None:
            progress_watch.WATCHER.forget(namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels=MANAGED)
@kopf.on.event(MPIJOB_GROUP, MPIJOB_VERSION, MPIJOB_PLURAL, labels=MANAGED)
def child_changed(type: Optional[str], body: kopf.Body, namespace: str, **_: Any) -> None:
    """A child's status moved (Job complete, MPIJob failed) or it was deleted: reconcile its run now.

    A deleted child is found by the reconcile itself (status records it), so one deleted while the operator
    was down counts too."""
    owner = owner_of(dict(body))
    if owner and child_event_matters(type, dict(body)):
        _run(namespace, owner, "child")


@kopf.on.event("v1", "pods", labels=MANAGED)
def pod_changed(type: Optional[str], body: kopf.Body, namespace: str, labels: kopf.Labels, **_: Any) -> None:
    """A run's pod cannot pull its image, cannot be scheduled, restarted or is gone: say so in seconds."""
    run = labels.get(RUN_LABEL)
    if run and pod_event_matters(type, dict(body)):
        _run(namespace, run, "pod")


# --- ScalingSweep: no finalizer, timer or daemon; its points' events move it on ---------------------


def _sweep(namespace: str, name: str, handler: str) -> None:
    try:
        _reconcile["sweep"](namespace, name)
    except Exception:
        metrics.RECONCILE_ERRORS.labels(handler=f"sweep-{handler}").inc()
        raise


@kopf.on.resume(GROUP, VERSION, SWEEP_PLURAL)
@kopf.on.create(GROUP, VERSION, SWEEP_PLURAL)
@kopf.on.update(GROUP, VERSION, SWEEP_PLURAL, field="spec")
def sweep_changed(namespace: str, name: str, **_: Any) -> None:
    _sweep(namespace, name, "change")


@kopf.on.event(GROUP, VERSION, PLURAL, labels={SWEEP_LABEL: kopf.PRESENT})
def sweep_point_changed(type: Optional[str], body: kopf.Body, namespace: str, **_: Any) -> None:
    """A point's status moved (Preprocessed, Succeeded, Failed): start the next point, fill its row."""
    sweep = sweep_of(dict(body))
    if sweep:
        _sweep(namespace, sweep, "point")


# --- entry point ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scalingrun-operator",
        description="Run the ScalingRun operator. Settings come from SCALINGRUN_* variables; flags override.")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", dest="namespaces",
                       help="namespace (or glob) to watch; repeatable (default SCALINGRUN_NAMESPACES)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    peers = parser.add_mutually_exclusive_group()
    peers.add_argument("--standalone", action="store_true",
                       help="no leader election, no peering: only for a single replica (local use)")
    peers.add_argument("--lease", help="Lease the replicas elect their leader with (default SCALINGRUN_LEASE_NAME)")
    peers.add_argument("--peering", help="kopf peering instead of the Lease: KopfPeering name (default SCALINGRUN_PEERING)")
    parser.add_argument("--priority", type=int, help="priority among peers (highest acts)")
    parser.add_argument("--liveness", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz; '' for none")
    parser.add_argument("--metrics-port", type=int, help="Prometheus port; 0 for none")
    parser.add_argument("--log-format", choices=["json", "plain"])
    parser.add_argument("--debug", action="store_true", default=None)
    return parser


def settings_from_args(args: argparse.Namespace, base: Config) -> Config:
    config = dataclasses.replace(
        base,
        **{k: v for k, v in {
            "namespaces": tuple(args.namespaces) if args.namespaces else None,
            "peering": "" if args.standalone or args.lease else args.peering,
            "lease_name": "" if args.standalone or args.peering else args.lease,
            "priority": args.priority,
            "liveness_endpoint": args.liveness,
            "metrics_port_number": args.metrics_port,
            "log_format": args.log_format,
            "debug": args.debug,
        }.items() if v is not None})
    if args.all_namespaces:
        config = dataclasses.replace(config, namespaces=())
    return config


def run(argv: Optional[list[str]] = None) -> int:
    """Console entry point: parse flags, configure logging, hand over to kopf until stopped."""
    global CONFIG
    args = build_parser().parse_args(argv)
    if _CONFIG_ERROR is not None:
        print(f"scalingrun-operator: {_CONFIG_ERROR}", file=sys.stderr)
        return 2
    try:
        CONFIG = settings_from_args(args, CONFIG)
    except (ConfigError, TypeError) as exc:
        print(f"scalingrun-operator: {exc}", file=sys.stderr)
        return 2
    kopf.configure(debug=CONFIG.debug, verbose=CONFIG.debug,
                   log_format=kopf.LogFormat.JSON if CONFIG.log_format == "json" else kopf.LogFormat.FULL)
    if not CONFIG.debug:
        # "Handler ... succeeded" per event and every probe request drown what matters.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if CONFIG.peering:
        # kopf pauses silently while its peering object is missing: create it, or stop and say why.
        try:
            ensure_peering(new_api_client(), CONFIG.peering, CONFIG.namespaces)
        except PeeringError as exc:
            log.error("scalingrun-operator cannot start: %s", exc)
            return 1
    # Two replicas: only the Lease holder runs kopf (see leader.py for why not kopf peering).
    elector = lead(CONFIG) if CONFIG.lease_name and not CONFIG.peering else None
    kopf.run(
        clusterwide=not CONFIG.namespaces,
        namespaces=CONFIG.namespaces,
        standalone=not CONFIG.peering,
        peering_name=CONFIG.peering or None,
        priority=CONFIG.priority,
        liveness_endpoint=CONFIG.liveness_endpoint or None,
    )
    if elector:
        elector.release()  # a standby takes over now, not when the Lease expires
    return 0


def lead(config: Config) -> LeaderElector:
    """Waits for the Lease (answering liveness meanwhile), then keeps it renewed while kopf runs."""
    settings = LeaseSettings(
        name=config.lease_name, namespace=config.lease_namespace or default_namespace(),
        identity=config.lease_holder or default_identity(), duration=config.lease_duration_seconds,
        renew_every=config.lease_renew_seconds, renew_deadline=config.lease_renew_deadline_seconds,
        retry_every=config.lease_retry_seconds)
    elector = LeaderElector(new_api_client(), settings)
    health = StandbyHealth(config.liveness_endpoint)
    try:
        elector.acquire()
    finally:
        health.close()
    elector.keep()
    return elector


if __name__ == "__main__":
    sys.exit(run())
