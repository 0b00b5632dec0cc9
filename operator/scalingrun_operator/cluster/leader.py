"""Leader election with a coordination.k8s.io/v1 Lease, so that two replicas never act at once.

Why not kopf peering (kopf 1.45, kopf/_core/engines/peering.py): replicas of equal priority, as two pods
of one Deployment are, all pause ("Pausing all operators, including self"); a standby takes over only
after the dead peer's lifetime (60 s by default) runs out; and nothing fences a replica that can no
longer write its keep-alive: it keeps acting. So the operator does what controller-runtime and
client-go do: before kopf starts, it takes a Lease (holderIdentity = pod name plus a per-process
suffix), renews it every few seconds with optimistic concurrency on resourceVersion, and runs kopf
standalone while it holds it. A standby retries until the holder stops renewing for a whole
leaseDuration, measured on its own clock from when it last saw the Lease change (no clock skew). A
leader that cannot renew before its renew deadline (shorter than the lease), or finds the Lease held
by someone else, exits at once with EXIT_LOST_LEASE: the pod restarts as a standby.
"""

from __future__ import annotations

import datetime
import http.server
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Optional
from urllib.parse import urlparse

from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api.models import MANAGED_BY

log = logging.getLogger(__name__)

EXIT_LOST_LEASE = 3
_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def default_namespace() -> str:
    """The pod's namespace (its service-account mount), or `default` outside a pod."""
    try:
        with open(_SA_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def default_identity() -> str:
    """Pod name (the hostname in a pod) plus a suffix: a restarted container is a new candidate."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseSettings:
    name: str
    namespace: str
    identity: str
    duration: float = 15.0  # leaseDurationSeconds: how long a standby waits after the last renewal
    renew_every: float = 5.0  # the leader's renewal period
    renew_deadline: float = 10.0  # the leader gives up (exits) this long after its last good renewal
    retry_every: float = 2.0  # a standby's period between attempts

    def __post_init__(self) -> None:
        if not self.renew_every < self.renew_deadline < self.duration:
            raise ValueError(f"lease timings must satisfy renew period ({self.renew_every} s) < renew deadline "
                             f"({self.renew_deadline} s) < lease duration ({self.duration} s)")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class LeaderElector:
    """Acquires and keeps one Lease. `acquire()` blocks; `keep()` renews in a daemon thread."""

    def __init__(self, api_client: client.ApiClient, settings: LeaseSettings,
                 on_lost: Optional[Callable[[str], None]] = None):
        self.api = client.CoordinationV1Api(api_client)
        self.settings = settings
        self.on_lost = on_lost or _exit_lost
        self._observed: Optional[tuple[str, float]] = None  # (resourceVersion, monotonic time first seen)
        self._last_renewal = 0.0
        self._stop = threading.Event()
        self._lost = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        # Bounds every API call, so that a standby or the renewer never hangs on a dead connection.
        self._timeout = max(1.0, min(5.0, settings.renew_deadline - settings.renew_every))

    # --- one attempt --------------------------------------------------------------------------------

    def _spec(self, acquired: bool, spec: Optional[client.V1LeaseSpec]) -> client.V1LeaseSpec:
        now = _now()
        transitions = (spec.lease_transitions or 0) if spec else 0
        return client.V1LeaseSpec(
            holder_identity=self.settings.identity, lease_duration_seconds=int(self.settings.duration),
            acquire_time=now if acquired else spec.acquire_time, renew_time=now,
            lease_transitions=transitions + 1 if acquired and spec else transitions)

    def try_acquire_or_renew(self) -> bool:
        """One round: True while this process holds the Lease (just taken or renewed)."""
        s = self.settings
        try:
            lease = self.api.read_namespaced_lease(s.name, s.namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=s.name, namespace=s.namespace,
                                                               labels=dict(MANAGED_BY)),
                                  spec=self._spec(True, None))
            try:
                self.api.create_namespaced_lease(s.namespace, body, _request_timeout=self._timeout)
            except ApiException as create_exc:
                if create_exc.status == 409:  # another candidate created it first
                    return False
                raise
            return True
        spec = lease.spec or client.V1LeaseSpec()
        version = lease.metadata.resource_version
        holder = spec.holder_identity or ""
        if holder != s.identity:
            if self._observed is None or self._observed[0] != version:
                self._observed = (version, time.monotonic())
            duration = spec.lease_duration_seconds or s.duration
            if holder and time.monotonic() - self._observed[1] < duration:
                return False  # held, and renewed within its duration as far as this clock saw
        lease.spec = self._spec(holder != s.identity, spec)
        try:  # replace carries metadata.resourceVersion: a concurrent writer makes this a 409
            self.api.replace_namespaced_lease(s.name, s.namespace, lease, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    # --- standby and leader loops ----------------------------------------------------------------------

    def acquire(self) -> None:
        """Blocks until this process holds the Lease."""
        s = self.settings
        log.info("waiting to lead: Lease %s/%s, identity %s", s.namespace, s.name, s.identity)
        while True:
            try:
                if self.try_acquire_or_renew():
                    self._last_renewal = time.monotonic()
                    log.info("became the leader: holding Lease %s/%s as %s", s.namespace, s.name, s.identity)
                    return
            except ApiException as exc:
                log.warning("cannot read or take Lease %s/%s: %s %s", s.namespace, s.name, exc.status, exc.reason)
            except Exception as exc:  # API server unreachable: a standby just tries again
                log.warning("cannot read or take Lease %s/%s: %s", s.namespace, s.name, exc)
            time.sleep(s.retry_every)

    def keep(self) -> None:
        """Renews in a daemon thread; on loss calls `on_lost` (by default: exit the process at once).

        A watchdog thread enforces the renew deadline even while a renewal call hangs."""
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watchdog, name="lease-watchdog", daemon=True).start()

    def _lose(self, reason: str) -> None:
        if self._lost.acquire(blocking=False) and not self._stop.is_set():
            self._stop.set()
            self.on_lost(reason)

    def _watchdog(self) -> None:
        s = self.settings
        while not self._stop.wait(0.25):
            if time.monotonic() - self._last_renewal >= s.renew_deadline:
                return self._lose(f"Lease {s.namespace}/{s.name} not renewed for {s.renew_deadline:g} s")

    def _renew_loop(self) -> None:
        s = self.settings
        while not self._stop.wait(s.renew_every):
            while True:
                try:
                    if self.try_acquire_or_renew():
                        self._last_renewal = time.monotonic()
                        break
                    holder = self._holder()
                    if holder and holder != s.identity:
                        return self._lose(f"Lease {s.namespace}/{s.name} is now held by {holder}")
                except Exception as exc:
                    log.warning("cannot renew Lease %s/%s: %s", s.namespace, s.name, exc)
                if self._stop.wait(min(1.0, s.retry_every)):
                    return  # released, or the watchdog gave up

    def _holder(self) -> Optional[str]:
        lease = self.api.read_namespaced_lease(self.settings.name, self.settings.namespace,
                                               _request_timeout=self._timeout)
        return (lease.spec.holder_identity if lease.spec else None) or None

    def release(self) -> None:
        """On a clean stop: hand the Lease back so a standby need not wait for it to expire."""
        if not self._lost.acquire(blocking=False):
            return  # lost already: not ours to hand back
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.settings.renew_every + 5)
        s = self.settings
        try:
            lease = self.api.read_namespaced_lease(s.name, s.namespace, _request_timeout=self._timeout)
            if lease.spec and lease.spec.holder_identity == s.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(s.name, s.namespace, lease, _request_timeout=self._timeout)
                log.info("released Lease %s/%s", s.namespace, s.name)
        except Exception as exc:
            log.warning("could not release Lease %s/%s (a standby takes it when it expires): %s",
                        s.namespace, s.name, exc)


def _exit_lost(reason: str) -> None:
    # Not sys.exit: kopf's graceful stop would let handlers act on while another replica leads.
    log.critical("lost leadership, stopping at once so that the pod restarts as a standby: %s", reason)
    logging.shutdown()
    os._exit(EXIT_LOST_LEASE)


class StandbyHealth:
    """Answers the liveness endpoint while waiting for the Lease (kopf serves it only once it runs)."""

    def __init__(self, endpoint: str):
        self._server: Optional[http.server.HTTPServer] = None
        if not endpoint:
            return
        url = urlparse(endpoint)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                ok = self.path.split("?")[0] == (url.path or "/")
                body = b'{"standby": true}' if ok else b"not found"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        http.server.HTTPServer.allow_reuse_address = True
        self._server = http.server.HTTPServer((url.hostname or "0.0.0.0", url.port or 80), Handler)
        threading.Thread(target=self._server.serve_forever, name="standby-health", daemon=True).start()

    def close(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
