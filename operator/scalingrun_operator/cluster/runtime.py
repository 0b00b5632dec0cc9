"""The operator's one object: its settings, what it remembers, and the parts it acts with.

main.py makes it at start-up and hands it to kopf, which passes it to every handler (`memo.runtime`);
nothing in the operator keeps state at module level, and a test makes its own.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from scalingrun_api.models import GROUP, KIND, VERSION
from scalingrun_api.status_push import HEARTBEAT

from ..config import Config, ConfigError
from ..document_source import Busy
from .coalesce import Coalescer
from .k8s import Kube, new_api_client
from .latest import LatestObjects
from .memory import Memory
from .metrics import Metrics
from .node_notices import NodeNotices
from .pod_index import PodIndex
from .preflight import run_at_start_up
from .push_auth import PushAuthenticator
from ..pushed import Full, PushedDocuments
from .status_config import StatusConfigMaps
from .certificate_secret import CertificateSecret
from ..serving_certificate import host_names
from ..status_server import StatusServer
from .serving import mark_serving
from .reconcile_scheduler import ReconcileScheduler
from .reconcile import Reconciler, SweepReconciler, document_sources

log = logging.getLogger(__name__)

# How long a pod event waits for the rest of its burst (the MPI operator makes a run's pods one after another, and
# a node's kubelet moves them together) before its run is reconciled: one reconcile for the burst.
POD_SETTLE_SECONDS = 0.5
# A run whose pushes a bound refuses (pushed.py) is told so by an Event at most this often: its pods retry every
# minute, and an Event per refusal would be an API write per retry.
FULL_EVENT_SECONDS = 600.0


class Runtime:
    def __init__(self, config: Config, kube: Optional[Kube] = None):
        self.config = config
        self.memory, self.metrics = Memory(), Metrics()
        self._serving = False
        kube = kube or Kube(new_api_client(), config.component)
        self.kube = kube
        # What no Kubernetes event announces: progress documents and rechecks of runs; rechecks of sweeps.
        self.watcher = ReconcileScheduler(lambda namespace, name: self.reconcile_run(namespace, name, "watcher"),
                                          config.poll_interval_seconds, config.progress_checks_per_second)
        self.sweep_rechecks = ReconcileScheduler(
            lambda namespace, name: self.reconcile_sweep(namespace, name, "recheck"),
            config.recheck_interval_seconds, workers=1)
        # The runs' pods from the pod watch (handlers.runs.pod_changed feeds it), not a list per reconcile.
        self.pods = PodIndex(config.pod_resync_seconds)
        # The runs, their Jobs and MPIJobs from their watches, and the stores' keys, not a read per reconcile.
        self.latest = LatestObjects()
        # What the runs' pods push to the status endpoint (status_server.py), newest per run.
        self.pushed = PushedDocuments()
        self.kube = kube
        self.status_server: Optional[StatusServer] = None
        self.status_config_maps: Optional[StatusConfigMaps] = None
        self._full_told: dict[tuple[str, str], float] = {}  # when each run was last told (the server's loop)
        self._full_events = ThreadPoolExecutor(1, thread_name_prefix="push-refused-event")
        self.certificate: Optional[CertificateSecret] = None
        # The Nodes with a cloud's termination taint, from the Node watch (handlers.runs.node_changed).
        self.notices = NodeNotices()
        # Where the runs' documents come from (pushed, or pull mode's stores): one choice, both reconcilers.
        self.documents = document_sources(config, kube, self.latest, self.pushed)
        self.runs = Reconciler(kube, config, self.watcher, self.memory, self.metrics, self.pods, self.latest,
                               self.pushed, self.notices, documents=self.documents)
        # One reconcile per run at a time; pod events at most one per run per second, a burst of them one
        # (cluster/coalesce.py), in a pool of their own: the pod handler never waits for a reconcile.
        self.run_triggers = Coalescer(self._reconcile_run_now, min_interval=1.0, workers=config.max_workers,
                                      settle=POD_SETTLE_SECONDS)
        self.sweeps = SweepReconciler(kube, config, self.sweep_rechecks, self.memory, self.metrics,
                                      pushed=self.pushed, documents=self.documents)
        self.metrics.watch_queue("triggers", lambda: len(self.run_triggers.pending()))
        self.metrics.watch_queue("rechecks", lambda: len(self.watcher.pending_rechecks()))
        self.metrics.watch_queue("sweep_rechecks", lambda: len(self.sweep_rechecks.pending_rechecks()))
        self.metrics.watch_queue("followed", lambda: len(self.watcher.watched()))

    def start(self) -> None:
        self.run_triggers.start()
        self.watcher.start()
        self.sweep_rechecks.start()
        self.serve_metrics()  # once: main.py serves them before the Lease, so that a standby is seen too
        self.metrics.leader.set(1)
        threading.Thread(target=self.preflight, name="preflight", daemon=True).start()
        if self.config.status_port_number:
            self.start_status_server()
            if self.config.pod_name:  # the status Service's pushes come here from now on
                mark_serving(self.kube.api_client, self.config.pod_namespace, self.config.pod_name, serving=True)

    def preflight(self) -> None:
        """What the cluster lacks for runs to train (no MPIJob API, CRDs of another version): logged, exported."""
        for check in run_at_start_up(self.kube.api_client):
            self.metrics.preflight_problem.labels(check=check.name).set(1 if check.problem else 0)

    def serve_metrics(self) -> None:
        if not self._serving:
            self._serving = True
            self.metrics.serve(self.config.metrics_port_number, self.config.metrics_bind_address)

    def start_status_server(self) -> int:
        """The status endpoint on its port (a free one for 0: tests); returns the port."""
        config, tls = self.config, Path(self.config.status_tls_dir)
        if config.status_tls_secret:  # the operator keeps its certificate; else the files are mounted
            if not config.pod_namespace:
                raise ConfigError("SCALINGRUN_STATUS_TLS_SECRET needs SCALINGRUN_POD_NAMESPACE: the operator keeps "
                                  "its certificate's Secret in its own namespace")
            self.certificate = CertificateSecret(
                self.kube.api_client, config.pod_namespace, config.status_tls_secret,
                host_names(urlsplit(config.status_url).hostname or ""), config.status_certificate_lifetimes(),
                config.status_tls_dir)
            self.certificate.ensure()
        self.status_config_maps = StatusConfigMaps(self.kube.api_client, config.status_url, config.status_tls_dir,
                                                   config.namespaces, self.metrics.status_config_rewrites.inc)
        self.status_server = StatusServer(
            PushAuthenticator(self.kube.api_client, self.latest.known_runs.uid, self.pods.pods, self._owner,
                              reread_owners=self._owner_read),
            self.pushed, str(tls / "tls.crt"), str(tls / "tls.key"),
            config.status_port_number,
            on_push=self._pushed,
            count_refused=lambda reason: self.metrics.push_refusals.labels(reason=reason).inc(),
            count_accepted=lambda what: self.metrics.pushes.labels(document=what).inc(),
            on_full=self._push_refused,
            watched=self.watches_namespace)
        port = self.status_server.start()
        if self.certificate is not None:
            threading.Thread(target=self.certificate.keep, args=(self._certificate_changed,),
                             name="status-certificate", daemon=True).start()
        return port

    def _certificate_changed(self) -> None:
        """A renewed certificate or trust bundle: served from now on, and the namespaces' ConfigMaps carry it."""
        if self.status_server is not None:
            self.status_server.reload_certificate()
        if self.status_config_maps is not None:
            self.status_config_maps.publish_again()

    def _owner(self, kind: str, namespace: str, name: str) -> Optional[dict]:
        """A Job or MPIJob on a pushing pod's owner chain: from the copies the watches keep, else read (and kept)."""
        return self.latest.child(kind, namespace, name, lambda: self.kube.get_child(kind, namespace, name))

    def _owner_read(self, kind: str, namespace: str, name: str) -> Optional[dict]:
        """The same owner from the API server (and kept): the copy was another object of its name."""
        found = self.kube.get_child(kind, namespace, name)
        self.latest.child_read(kind, namespace, found)
        return found

    def _push_refused(self, namespace: str, name: str, full: Full) -> None:
        """A bound refused the run's push (counted by the server): a Warning on the run, at most every
        FULL_EVENT_SECONDS, posted from a thread of its own (this is the status server's loop)."""
        now = time.monotonic()
        if now - self._full_told.get((namespace, name), -FULL_EVENT_SECONDS) < FULL_EVENT_SECONDS:
            return
        self._full_told[(namespace, name)] = now
        run = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
               "metadata": {"namespace": namespace, "name": name, "uid": self.latest.known_runs.uid(namespace, name)}}
        message = f"the status endpoint refuses this run's pushes: {full.message}"
        self._full_events.submit(self._post_warning, run, full.reason, message)

    def _post_warning(self, run: dict, reason: str, message: str) -> None:
        if self.kube.post_event(run, "Warning", reason, message):
            self.metrics.events.labels(type="Warning", reason=reason).inc()

    def _pushed(self, namespace: str, name: str, what: str) -> None:
        """A push was accepted. Progress: the run is reconciled soon, in the pool (not the server's loop: a
        reconcile may take a while). A heartbeat changes nothing until the stall deadline, whose recheck reads it
        (decide/stall.py): a reconcile per beat would be work for nothing."""
        if what != HEARTBEAT:
            self.run_triggers.soon((namespace, name), "push")

    def stop(self) -> None:
        self.metrics.leader.set(0)
        self.run_triggers.stop()
        self.watcher.stop()
        self.sweep_rechecks.stop()
        if self.status_server is not None:
            self.status_server.stop()
        if self.status_config_maps is not None:
            self.status_config_maps.stop()
        self._full_events.shutdown(wait=False)
        if self.certificate is not None:
            self.certificate.stop()

    def watches_namespace(self, namespace: str) -> bool:
        """Whether this operator serves runs in `namespace` (its namespaces are kopf globs; none: all)."""
        return not self.config.namespaces or any(fnmatch.fnmatchcase(namespace, pattern)
                                                 for pattern in self.config.namespaces)

    def health(self) -> Optional[str]:
        """What is wrong with the threads every run depends on, for the liveness probe; None when nothing."""
        return self.watcher.health() or self.sweep_rechecks.health()

    def reconcile_run(self, namespace: str, name: str, handler: str, urgent: bool = True) -> None:
        """Reconciles the run now in this thread, or, when one is in flight (or, for a pod event, always: after its
        burst settled, at most once a second), has it reconciled once more afterwards and returns at once."""
        self.run_triggers.trigger((namespace, name), handler, urgent=urgent)

    def _reconcile_run_now(self, key: tuple[str, str], handler: str) -> None:
        namespace, name = key
        self.metrics.reconciles.labels(kind="run").inc()
        if self.status_config_maps is not None:
            try:
                self.status_config_maps.ensure(namespace)
            except Exception as exc:  # noqa: BLE001 - the run goes on; its pods push nothing until this works
                log.warning("%s: cannot write the ConfigMap of the status endpoint: %s", namespace, exc)
        try:
            self.runs(namespace, name)
        except Busy as exc:
            # The run's store has its share of the operator's calls in flight: look again shortly, no condition.
            log.info("%s/%s: %s; again in %g s", namespace, name, exc, exc.delay)
            self.watcher.schedule_recheck(namespace, name, exc.delay)
        except Exception as exc:
            self.metrics.reconcile_errors.labels(handler=handler).inc()
            # kopf retries no event handler, and no timer comes by: the watcher tries again (TemporaryError's delay).
            delay = getattr(exc, "delay", None) or self.config.recheck_interval_seconds
            self.watcher.schedule_recheck(namespace, name, delay)
            raise

    def reconcile_sweep(self, namespace: str, name: str, handler: str) -> None:
        try:
            self.sweeps(namespace, name)
        except Exception:
            self.metrics.reconcile_errors.labels(handler=f"sweep-{handler}").inc()
            raise

    def forget_run(self, namespace: str, name: str) -> None:
        self.memory.forget(("run", namespace, name))
        self.pushed.forget(namespace, name)
        if self.status_server is not None:
            self.status_server.buckets.forget((namespace, name))
        self._full_told.pop((namespace, name), None)
        self.runs.forget(namespace, name)
        self.pods.forget(namespace, name)
        self.run_triggers.forget((namespace, name))
        self.watcher.forget(namespace, name)
