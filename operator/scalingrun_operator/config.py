"""Operator settings: one typed object, read once from SCALINGRUN_* environment variables.

Crate-style: every field is documented with `#:`, has a safe default, and `load()` fails fast with
the variable's name when a value cannot be parsed (a typo in a Deployment must not start an
operator with surprising settings).

No variable name may be one that Kubernetes' service links can produce: for every Service in the
pod's namespace the kubelet injects `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT[_<PORTNAME>]`,
`<NAME>_PORT` and `<NAME>_PORT_<N>_<PROTO>[_PROTO|_PORT|_ADDR]`, so a Service `scalingrun-metrics`
would set `SCALINGRUN_METRICS_PORT=tcp://10.0.0.241:9090`. Hence `SCALINGRUN_METRICS_PORT_NUMBER`;
tests/unit/operator/test_operator_parts.py checks every name against those patterns.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import urlparse

import pydantic

from scalingrun_api.models import DIGEST_PATTERN, Toleration
from scalingrun_api.models.common import TRAINER_FLAVOURS, TRAINER_IMAGES_PATTERN
from .builders.capacity_probes import CAPACITY_PROBE_PRIORITY_CLASS
from .builders.mpijob import DEFAULT_GPU_TOLERATIONS
from .schema.endpoints import EndpointPolicy
from .serving_certificate import Lifetimes

PREFIX = "SCALINGRUN_"


class ConfigError(ValueError):
    """A SCALINGRUN_* variable has a value that cannot be used."""


@dataclass(frozen=True)
class Config:
    #: Seconds between conditional reads (ETag / mtime) of the progress document of each run in Training;
    #: a run is reconciled only when its document changed. Children and pods are watched, not polled.
    poll_interval_seconds: float = 15.0
    #: Seconds between reconciles of a run that waits on something no event announces: unreadable
    #: storage, a finished Job's manifest or a finished MPIJob's final progress not written yet.
    recheck_interval_seconds: float = 30.0
    #: Upper bound on progress-document checks per second, all runs together (each costs ~2 ms of CPU):
    #: above `poll_interval_seconds` x this many runs in Training, each is checked less often.
    progress_checks_per_second: float = 5.0
    #: Seconds a watch stays open before kopf re-lists (runs, children, pods); re-lists reconcile nothing
    #: that did not change.
    watch_timeout_seconds: int = 300
    #: Seconds a run's pods are served from the pod watch's index before a reconcile lists them again (a
    #: safety net for an event kopf's watch missed; a re-list by kopf, or a restart, lists at the next look).
    pod_resync_seconds: float = 300.0
    #: How long a finished Job or MPIJob may wait for its manifest / final progress document to
    #: appear in storage before the run is judged on what is there.
    completion_grace_seconds: float = 120.0
    #: Seconds an MPIJob may have no status at all (no controller wrote a condition) before its run says that nothing
    #: serves MPIJobs (MPIJobServed=False, with the install command); 0 turns the check off. mpi-operator writes one
    #: within seconds: the default leaves room for a controller that restarts or an API server under load.
    mpijob_unserved_seconds: float = 300.0
    #: The PriorityClass of an elastic run's capacity probes (the chart's scalingrun-capacity-probe: lowest priority,
    #: never preempting); empty: no probes, and a shrunk run does not grow back.
    capacity_probe_priority_class: str = CAPACITY_PROBE_PRIORITY_CLASS
    #: The most capacity probes one elastic run has at a time (chart value elastic.maxProbesPerRun): a run far below
    #: spec.workers.replicas grows back in steps of at most this many workers.
    max_capacity_probes: int = 4
    #: Connect/read timeout of one object-storage request.
    storage_timeout_seconds: float = 10.0
    #: 5xx answers and timeouts of object storage are retried (exponential backoff) until this deadline.
    storage_deadline_seconds: float = 30.0
    #: Largest document the operator reads from object storage (the dataset manifest, a progress document):
    #: a larger one is not read and the run says so (StorageReadable=False, DocumentTooLarge).
    max_document_bytes: int = 1024 * 1024  # pull/storage.py's DEFAULT_MAX_DOCUMENT_BYTES (a test holds them equal)
    #: Object-storage endpoints runs may use (spec.storage.endpoint, e.g. http://minio.storage:9000;
    #: https://s3.amazonaws.com for runs that name none); empty: any. Others are refused (InvalidSpec).
    allowed_storage_endpoints: tuple[str, ...] = ()
    #: Without an allow-list, endpoints whose address is link-local (cloud metadata), loopback, the API
    #: server's or in `cluster_service_ranges` are refused; true allows any endpoint.
    allow_any_storage_endpoint: bool = False
    #: The cluster's Service CIDRs (e.g. 10.96.0.0/12): refused as storage addresses without an allow-list.
    #: Not discoverable on every cluster, hence a setting.
    cluster_service_ranges: tuple[str, ...] = ()
    #: The API server's addresses, refused as storage addresses; unset: KUBERNETES_SERVICE_HOST (in a pod).
    api_server_hosts: tuple[str, ...] = ()
    #: Read the s3:// documents (manifest, progress, heartbeat) of runs with spec.storage.credentials
    #: podIdentity with the operator's own identity (its ServiceAccount's IAM role; the AWS SDK's default
    #: credential chain). Off: such runs get StorageReadable=False (docs/security.md, "Pod identity").
    pod_identity_reads: bool = False
    #: Let runs name paths and file:// URIs, which the operator reads from its own disk: tests and
    #: single-machine setups only (`scalingrun run --local` reads paths without it).
    allow_local_paths: bool = False
    #: "<repository>:<tag>" of the default trainer images: a run without spec.workers.image gets
    #: "<this>-cpu" (keras) or "<this>-lightning-cpu" (pytorch-lightning), "-gpu" / "-lightning-gpu" with
    #: spec.workers.gpusPerWorker above 0; empty: ghcr.io/scalingrun/trainer:<version>.
    trainer_images: str = ""
    #: "<flavour>=sha256:<64 hex>", comma-separated: the default trainer images pinned by digest (the release prints
    #: these); a flavour without one is named by its tag alone.
    trainer_image_digests: tuple[str, ...] = ()
    #: Tolerations (a JSON list, in the Pod API's form) the workers of a run that asks for GPUs get, besides their
    #: own: the taints of the cluster's GPU node pools. Default: nvidia.com/gpu (Exists) and sku=gpu, NoSchedule.
    gpu_tolerations: tuple[Toleration, ...] = DEFAULT_GPU_TOLERATIONS
    #: Let runs' spec.podOverrides give their pods hostPath volumes (a node's own files; chart value
    #: runs.allowHostPath). Off: such runs are refused (InvalidSpec).
    allow_host_path: bool = False
    #: Port of the Prometheus /metrics endpoint; 0 turns it off.
    metrics_port_number: int = 9090
    #: The address /metrics listens on: loopback unless set (it is unauthenticated and names every run); the chart
    #: sets the pod's IP, which its NetworkPolicy opens to the monitoring namespace only (metrics.bindAddress).
    metrics_bind_address: str = "127.0.0.1"
    #: Port of the status endpoint (HTTPS), where the runs' pods push their progress and heartbeat
    #: (status_server.py, docs/security.md "The push path"); 0 turns it off, which only pull_documents allows.
    status_port_number: int = 0
    #: Deprecated (docs/install.md, "Pull mode"): read the runs' documents from their stores with the keys of their
    #: Secrets instead of serving the status endpoint their pods push to. Off, the default: push, which needs
    #: status_port_number and status_url; an operator given neither choice refuses to start (`document_choice`).
    pull_documents: bool = False
    #: Directory of the status endpoint's serving certificate (tls.crt, tls.key, ca.crt: the kubelet mounts its
    #: Secret there), read again when it changes.
    status_tls_dir: str = "/etc/scalingrun/status-tls"
    #: The Secret (in pod_namespace) the operator keeps that certificate in: it makes, adopts and renews it
    #: (cluster/certificate_secret.py) and writes its files into status_tls_dir itself. Empty: the files come from
    #: elsewhere (cert-manager's Secret, mounted by the kubelet).
    status_tls_secret: str = ""
    #: Days the operator-made CA and serving certificate are valid; each is renewed with a third of its life left.
    status_ca_days: int = 3650
    status_certificate_days: int = 365
    #: The URL the runs' pods push to (e.g. https://scalingrun-status.scalingrun-system.svc:8443), written with
    #: the CA bundle into the ConfigMap scalingrun-status of every namespace the operator runs a run in.
    status_url: str = ""
    #: This operator's own pod (the chart sets both from the downward API). With the status endpoint on, the pod
    #: that serves it (the leader) carries cluster/serving.py's label, which the status Service selects; empty: no
    #: label is written (outside a pod).
    pod_name: str = ""
    pod_namespace: str = ""
    #: kopf liveness endpoint (served by kopf, answered by the on.probe handlers); empty turns it off.
    liveness_endpoint: str = "http://0.0.0.0:8080/healthz"
    #: Namespaces (or kopf globs) to watch; empty means the whole cluster.
    namespaces: tuple[str, ...] = ()
    #: Name of a KopfPeering object shared by operators (kopf peering, instead of the Lease); empty: none.
    peering: str = ""
    #: Priority among peers: the highest acts, the others pause (equal priorities all pause).
    priority: int = 0
    #: Seconds a peer counts as alive after its last keep-alive: how soon a standby takes over.
    peering_lifetime_seconds: int = 60
    #: Log format: json (structured, one object per line) or plain.
    log_format: str = "json"
    #: Log DEBUG lines too.
    debug: bool = False
    #: Worker threads for the synchronous handlers (Kubernetes and storage calls block).
    max_workers: int = 8
    #: Component name on Events and in `managed-by` labels.
    component: str = "scalingrun-operator"
    #: Lease (coordination.k8s.io/v1) the replicas elect their leader with; empty: no leader election.
    lease_name: str = "scalingrun-operator"
    #: Namespace of the Lease; empty: the pod's own namespace (`default` outside a pod).
    lease_namespace: str = ""
    #: holderIdentity written into the Lease; empty: the pod name (hostname) plus a per-process suffix.
    lease_holder: str = ""
    #: leaseDurationSeconds: a standby takes over this long after the leader's last renewal.
    lease_duration_seconds: float = 15.0
    #: How often the leader renews the Lease.
    lease_renew_seconds: float = 5.0
    #: A leader that has not renewed for this long stops at once (must be below the lease duration).
    lease_renew_deadline_seconds: float = 10.0
    #: How often a standby tries to take the Lease.
    lease_retry_seconds: float = 2.0

    @property
    def reads_storage(self) -> bool:
        """Whether the operator reads the runs' storage (and the Secrets with its keys): only in pull mode; on the
        push path, the default, the runs' pods push their documents and leave their Jobs' results in termination
        messages (docs/security.md, "The push path")."""
        return self.pull_documents

    def endpoint_policy(self) -> EndpointPolicy:
        return EndpointPolicy(allow_any=self.allow_any_storage_endpoint, service_ranges=self.cluster_service_ranges,
                              api_server=self.api_server_hosts, local_files=self.allow_local_paths)

    def status_certificate_lifetimes(self) -> Lifetimes:
        """The operator-made CA's and serving certificate's; ValueError when the second is over a third of the first."""
        return Lifetimes(ca=dt.timedelta(days=self.status_ca_days),
                         serving=dt.timedelta(days=self.status_certificate_days))

    def trainer_image_digest_map(self) -> dict[str, str]:
        """trainer_image_digests as flavour -> "sha256:..."; ConfigError on a flavour or digest that is not one."""
        digests = {}
        for entry in self.trainer_image_digests:
            flavour, _, digest = entry.partition("=")
            if flavour not in TRAINER_FLAVOURS or not re.search(DIGEST_PATTERN, digest):
                raise ConfigError(f"{PREFIX}TRAINER_IMAGE_DIGESTS: {entry!r} is not <flavour>=sha256:<64 hex digits> "
                                  f"with a flavour of {', '.join(TRAINER_FLAVOURS)}")
            digests[flavour] = digest
        return digests


def document_choice(config: Config) -> None:
    """ConfigError unless the operator was told how it gets the runs' documents. An operator started bare pulled
    before push became the default; one that now served a status endpoint no pod was told of would judge every run
    Stalled, so it refuses to start and names both choices instead (docs/install.md, "Pull mode")."""
    if not config.pull_documents and not config.status_port_number:
        raise ConfigError(f"the runs' pods push their documents by default: set {PREFIX}STATUS_PORT_NUMBER and "
                          f"{PREFIX}STATUS_URL (the chart and manifests/base do), or {PREFIX}PULL_DOCUMENTS=true to "
                          "read them from the runs' stores (pull mode, deprecated: docs/install.md)")


def _parse(name: str, raw: str, kind: type, default: object) -> object:
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind is tuple:
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        if kind is int:
            return int(raw)
        if kind is float:
            value = float(raw)
            if value < 0:
                raise ValueError(raw)
            return value
        if kind is Toleration:
            return tuple(pydantic.TypeAdapter(list[Toleration]).validate_json(raw))
        return raw
    except pydantic.ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        detail = f"{where}: {error['msg']}" if where else error["msg"]
        raise ConfigError(f"{name} is not a JSON list of tolerations ({detail}): {raw!r}") from None
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a valid {kind.__name__} (default {default!r})") from None


_KINDS = {"poll_interval_seconds": float, "recheck_interval_seconds": float,
          "progress_checks_per_second": float, "watch_timeout_seconds": int, "pod_resync_seconds": float,
          "completion_grace_seconds": float, "storage_timeout_seconds": float, "mpijob_unserved_seconds": float,
          "capacity_probe_priority_class": str, "max_capacity_probes": int,
          "metrics_port_number": int, "metrics_bind_address": str, "status_port_number": int,
          "pull_documents": bool, "status_tls_dir": str, "status_url": str,
          "status_tls_secret": str, "status_ca_days": int, "status_certificate_days": int,
          "pod_name": str, "pod_namespace": str, "liveness_endpoint": str, "namespaces": tuple, "peering": str,
          "priority": int,
          "peering_lifetime_seconds": int, "log_format": str, "debug": bool, "max_workers": int, "component": str,
          "lease_name": str, "lease_namespace": str, "lease_holder": str, "lease_duration_seconds": float,
          "lease_renew_seconds": float, "lease_renew_deadline_seconds": float, "lease_retry_seconds": float,
          "storage_deadline_seconds": float, "max_document_bytes": int, "allowed_storage_endpoints": tuple,
          "allow_any_storage_endpoint": bool, "cluster_service_ranges": tuple, "allow_local_paths": bool,
          "api_server_hosts": tuple, "pod_identity_reads": bool, "trainer_images": str,
          "trainer_image_digests": tuple, "gpu_tolerations": Toleration, "allow_host_path": bool}


def variable_names() -> list[str]:
    """Every environment variable the configuration reads."""
    return [PREFIX + name.upper() for name in _KINDS]


def load(environ: Optional[Mapping[str, str]] = None, **overrides: object) -> Config:
    """Config from the environment (SCALINGRUN_POLL_INTERVAL_SECONDS, ...), then explicit overrides."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    defaults = Config()
    for (name, kind), var in zip(_KINDS.items(), variable_names()):
        if var in environ:
            values[name] = _parse(var, environ[var], kind, getattr(defaults, name))
    if environ.get("KUBERNETES_SERVICE_HOST") and "api_server_hosts" not in values:
        values["api_server_hosts"] = (environ["KUBERNETES_SERVICE_HOST"],)
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = dataclasses.replace(defaults, **values)
    if config.log_format not in ("json", "plain"):
        raise ConfigError(f"{PREFIX}LOG_FORMAT must be json or plain, not {config.log_format!r}")
    if config.poll_interval_seconds < 0.5:
        raise ConfigError(f"{PREFIX}POLL_INTERVAL_SECONDS must be >= 0.5, not {config.poll_interval_seconds}")
    if config.recheck_interval_seconds < 0.5:
        raise ConfigError(f"{PREFIX}RECHECK_INTERVAL_SECONDS must be >= 0.5, not {config.recheck_interval_seconds}")
    if config.progress_checks_per_second <= 0:
        raise ConfigError(f"{PREFIX}PROGRESS_CHECKS_PER_SECOND must be > 0, not {config.progress_checks_per_second}")
    if config.watch_timeout_seconds < 1:
        raise ConfigError(f"{PREFIX}WATCH_TIMEOUT_SECONDS must be >= 1, not {config.watch_timeout_seconds}")
    try:
        ipaddress.ip_address(config.metrics_bind_address)
    except ValueError:
        raise ConfigError(f"{PREFIX}METRICS_BIND_ADDRESS must be an IP address (127.0.0.1, 0.0.0.0, the pod's), not "
                          f"{config.metrics_bind_address!r}") from None
    if config.max_capacity_probes < 1:
        raise ConfigError(f"{PREFIX}MAX_CAPACITY_PROBES must be >= 1, not {config.max_capacity_probes}")
    if not 0 <= config.metrics_port_number <= 65535:
        raise ConfigError(f"{PREFIX}METRICS_PORT_NUMBER must be a port number, not {config.metrics_port_number}")
    if not 0 <= config.status_port_number <= 65535:
        raise ConfigError(f"{PREFIX}STATUS_PORT_NUMBER must be a port number, not {config.status_port_number}")
    if config.pull_documents and config.status_port_number:
        raise ConfigError(f"{PREFIX}PULL_DOCUMENTS=true and {PREFIX}STATUS_PORT_NUMBER={config.status_port_number} "
                          "contradict each other: the runs' documents are either pulled from their stores or pushed "
                          "to the status endpoint; choose one")
    if config.status_port_number and urlparse(config.status_url).scheme != "https":
        raise ConfigError(f"{PREFIX}STATUS_URL must be the https:// URL the runs' pods reach the status endpoint at, "
                          f"not {config.status_url!r}")
    if config.status_tls_secret:
        try:
            config.status_certificate_lifetimes()
        except ValueError as exc:
            raise ConfigError(f"{PREFIX}STATUS_CERTIFICATE_DAYS, {PREFIX}STATUS_CA_DAYS: {exc}") from None
    if config.max_document_bytes < 1024:
        raise ConfigError(f"{PREFIX}MAX_DOCUMENT_BYTES must be >= 1024, not {config.max_document_bytes}")
    for endpoint in config.allowed_storage_endpoints:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"{PREFIX}ALLOWED_STORAGE_ENDPOINTS: {endpoint!r} is not an http(s):// URL")
    for cidr in config.cluster_service_ranges:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"{PREFIX}CLUSTER_SERVICE_RANGES: {cidr!r} is not a CIDR such as 10.96.0.0/12") from None
    if config.trainer_images and not re.search(TRAINER_IMAGES_PATTERN, config.trainer_images):
        raise ConfigError(f"{PREFIX}TRAINER_IMAGES must be <repository>:<tag> (e.g. "
                          f"registry.example.com/ml/trainer:0.1.0; pin by digest with {PREFIX}TRAINER_IMAGE_DIGESTS), "
                          f"not {config.trainer_images!r}")
    config.trainer_image_digest_map()  # refuses a malformed one now, not at the first run
    if config.lease_name and not (0 < config.lease_renew_seconds < config.lease_renew_deadline_seconds
                                  < config.lease_duration_seconds):
        raise ConfigError(f"{PREFIX}LEASE_RENEW_SECONDS ({config.lease_renew_seconds}) < "
                          f"{PREFIX}LEASE_RENEW_DEADLINE_SECONDS ({config.lease_renew_deadline_seconds}) < "
                          f"{PREFIX}LEASE_DURATION_SECONDS ({config.lease_duration_seconds}) must hold")
    return config
