"""The operator's entry point: settings from SCALINGRUN_* variables and flags, leader election, then kopf.

Every trigger (create, resume after a restart, spec change, an event of a child Job, MPIJob or pod, a
changed progress document) runs the same level-triggered reconcile: observe -> decide -> act
(cluster/reconcile.py). The kopf handlers are in handlers/; they get the one Runtime that run() makes
here (cluster/runtime.py) through kopf's memo. Run it with `scalingrun-operator` (or `scalingrun operator`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Optional

import kopf
from kubernetes.client.rest import ApiException

from . import handlers  # noqa: F401  (registers the kopf handlers)
from .cluster.k8s import new_api_client
from .cluster.leader import LeaderElector, LeaseSettings, StandbyHealth, default_identity, default_namespace
from .cluster.peering import PeeringError, ensure_peering
from .cluster.runtime import Runtime
from .cluster.serving import mark_serving
from .config import Config, ConfigError, document_choice, load

log = logging.getLogger(__name__)


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
    args = build_parser().parse_args(argv)
    try:
        config = settings_from_args(args, load())
        document_choice(config)
    except (ConfigError, TypeError) as exc:
        print(f"scalingrun-operator: {exc}", file=sys.stderr)
        return 2
    kopf.configure(debug=config.debug, verbose=config.debug,
                   log_format=kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.FULL)
    if not config.debug:
        # "Handler ... succeeded" per event and every probe request drown what matters.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if config.peering:
        # kopf pauses silently while its peering object is missing: create it, or stop and say why.
        try:
            ensure_peering(new_api_client(), config.peering, config.namespaces)
        except PeeringError as exc:
            log.error("scalingrun-operator cannot start: %s", exc)
            return 1
    if config.status_port_number and config.pod_name:
        # Until it leads, this pod serves no status endpoint: the status Service must not send it pushes.
        try:
            mark_serving(new_api_client(), config.pod_namespace, config.pod_name, serving=False)
        except ApiException as exc:
            log.error("scalingrun-operator cannot start: cannot label its pod %s/%s for the status Service (%s %s); "
                      "the chart's Role grants pods patch in the release's namespace", config.pod_namespace,
                      config.pod_name, exc.status, exc.reason)
            return 1
    runtime = Runtime(config)
    runtime.serve_metrics()  # a standby's too: scalingrun_leader 0 says it waits
    # Two replicas: only the Lease holder runs kopf (see leader.py for why not kopf peering).
    elector = lead(config) if config.lease_name and not config.peering else None
    kopf.run(
        memo=kopf.Memo(runtime=runtime),
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        standalone=not config.peering,
        peering_name=config.peering or None,
        priority=config.priority,
        liveness_endpoint=config.liveness_endpoint or None,
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
