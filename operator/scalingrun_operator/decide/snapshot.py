"""What decide reads and what it returns: a snapshot of facts in, a Decision out.

decide never calls the API server or storage and reads no clock: the time of the look is in the
snapshot. The facts it reads are named by asks (the child Job, the run's pods, a document in
storage, ...). A fact the snapshot lacks raises NeedMore: observe reads it and decide runs again on a
snapshot that has it. So a reconcile reads only what the run's phase needs, in the order the phase
needs it, and a table test hands decide every fact up front.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Hashable, Mapping, Optional, Union

from scalingrun_api.models import Toleration
from ..builders.mpijob import DEFAULT_GPU_TOLERATIONS
from ..schema.endpoints import EndpointPolicy
from .status import Event

# --- asks: the facts decide may need ------------------------------------------------------------


@dataclass(frozen=True)
class Store:
    """How to reach a run's objects: the endpoint, and the Secret with its keys when s3:// is used."""

    endpoint: Optional[str]
    region: str
    secret: Optional[str] = None  # None: no credentials (local files, or keys from the environment)
    access_key_id_key: str = "AWS_ACCESS_KEY_ID"
    secret_access_key_key: str = "AWS_SECRET_ACCESS_KEY"
    pod_identity: bool = False  # s3:// with no Secret: the operator reads with its own identity (if it may)


@dataclass(frozen=True)
class Child:
    """The object of this kind and name in the run's namespace (None when there is none)."""

    kind: str
    name: str


@dataclass(frozen=True)
class Pods:
    """The pods labelled as the run's, and how deleted ones were when last seen (a PodList)."""


MANIFEST = "manifest"  # the trainer's PROGRESS and HEARTBEAT are the push contract's (scalingrun_api.status_push)


@dataclass(frozen=True)
class Document:
    """A JSON document in storage (a Read): the dataset MANIFEST, the trainer's PROGRESS or HEARTBEAT; `versioned`: with
    the version the progress watcher follows."""

    uri: str
    store: Store
    what: str = MANIFEST
    versioned: bool = False
    run: Optional[str] = None  # whose document, when not the looked-at object's (a sweep reads its points')
    job_uid: Optional[str] = None  # the MANIFEST as a pod left it: only a pod this Job controls counts (push mode)


@dataclass(frozen=True)
class Listing:
    """The object names under a prefix in storage (a Names)."""

    uri: str
    store: Store


@dataclass(frozen=True)
class Log:
    """The last `lines` lines of a container's log (a LogTail)."""

    pod: str
    container: str
    lines: int


@dataclass(frozen=True)
class ServerVersion:
    """The API server's version (a Server)."""


@dataclass(frozen=True)
class Nodes:
    """The Nodes of these names, cluster-scoped: {name: the Node, or None when there is none}. One ask for all,
    however many nodes a zone's outage takes."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class NoticedNodes:
    """The Nodes that carry a cloud's termination taint (decide/nodes.py: TERMINATION_TAINTS), {name: the Node}, as
    the operator's Node watch last saw them: no read. Empty where no watch runs (a tool, the local runner)."""


Ask = Union[Child, Pods, Document, Listing, Log, ServerVersion, Nodes, NoticedNodes]

# --- facts: what observe answers ------------------------------------------------------------------


@dataclass(frozen=True)
class PodList:
    items: tuple[dict[str, Any], ...] = ()
    deleted: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # uid -> last words


@dataclass(frozen=True)
class Read:
    """A document as read, as its model (documents.py: DatasetManifest, Progress, Heartbeat): None when absent;
    `error` says why it could not be read."""

    document: Any = None
    version: Optional[str] = None
    error: str = ""
    reason: str = "StorageError"  # the condition's reason when `error` (DocumentTooLarge, EndpointNotAllowed)


@dataclass(frozen=True)
class Names:
    names: Optional[tuple[str, ...]] = None  # None: could not be listed (`error` says why)
    error: str = ""


@dataclass(frozen=True)
class LogTail:
    text: Optional[str] = None  # None: could not be read (`error` says why)
    error: str = ""


@dataclass(frozen=True)
class Server:
    major: int = 0
    minor: int = 0
    git_version: str = ""

    def supports_indexed_jobs(self) -> bool:
        return (self.major, self.minor) >= INDEXED_JOBS_SINCE


# Indexed Jobs: alpha (off by default) in 1.21, on by default from 1.22. Older servers drop completionMode
# without a word, and every pod then sees no completion index.
INDEXED_JOBS_SINCE = (1, 22)


class NeedMore(Exception):
    """decide lacks a fact; observe reads it and decide runs again."""

    def __init__(self, ask: Hashable):
        super().__init__(f"decide needs {ask!r}")
        self.ask = ask


@dataclass(frozen=True)
class Snapshot:
    """One look at a resource: the object as read, the time of the look, and the facts read so far."""

    obj: Mapping[str, Any]
    now: dt.datetime
    facts: Mapping[Hashable, Any] = field(default_factory=lambda: MappingProxyType({}))
    # What decide derived from `obj` alone (the parsed spec, the children it renders), kept across the rounds of
    # one look so that each ask does not parse and render again, and across looks while `obj`'s signature
    # (decide.run.derived_signature) stays the same; it never changes a result.
    derived: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)

    def derive(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]

    def need(self, ask: Hashable) -> Any:
        try:
            return self.facts[ask]
        except KeyError:
            raise NeedMore(ask) from None

    def knowing(self, ask: Hashable, value: Any) -> "Snapshot":
        return dataclasses.replace(self, facts=MappingProxyType({**self.facts, ask: value}))


# --- settings and where to look -----------------------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """Where a user looks for logs and Events: kubectl in a cluster, the terminal for a local run."""

    local: bool = False

    def job_logs(self, namespace: str, job: str) -> str:
        if self.local:
            return "see the shard processes' output above"
        return f"see the failed pods' logs (kubectl logs -n {namespace} -l job-name={job} --tail=50)"

    def launcher_logs(self, namespace: str, mpijob: str) -> str:
        if self.local:
            return "see the trainer's output above"
        return (f"see the launcher's log (kubectl logs -n {namespace} -l training.kubeflow.org/job-name={mpijob},"
                "training.kubeflow.org/job-role=launcher --tail=50)")

    def events(self, namespace: str) -> str:
        if self.local:
            return "the run's output above"
        return f"kubectl get events -n {namespace}"

    def trainer_place(self, image: str) -> str:
        """Where rank 0 runs: a local run's trainer runs in this machine's Python, whatever image the spec names."""
        if self.local:
            return "on this machine (a local run trains in its own Python environment, not in the spec's image)"
        return f"in image {image}"


CLUSTER = Where()
LOCAL = Where(local=True)


@dataclass(frozen=True)
class Settings:
    """The figures decide works with (from the operator's Config, or the local runner's)."""

    #: How long a finished Job or MPIJob may wait for its manifest / final progress document.
    completion_grace_seconds: float = 120.0
    #: When to look again at what no event announces (unreadable storage, a document not written yet).
    recheck_interval_seconds: float = 30.0
    #: When to look again at a child's name held by an object the run did not make.
    conflict_recheck_seconds: float = 10.0
    where: Where = CLUSTER
    #: False: the run stops once its dataset is ready (`scalingrun run --local --stop-after preprocessing`).
    train: bool = True
    #: The operator's allow-list of storage endpoints (schema/endpoints.py); empty: any.
    allowed_storage_endpoints: tuple[str, ...] = ()
    #: Without an allow-list: the addresses refused, and whether paths may be read (schema/endpoints.py).
    endpoint_policy: EndpointPolicy = EndpointPolicy()
    #: "<repository>:<tag>" of the default trainer images (a run without spec.workers.image gets
    #: "<this>-<flavour>"); empty: ours (scalingrun_api.models.common.DEFAULT_TRAINER_IMAGES).
    trainer_images: str = ""
    #: (flavour, "sha256:...") pairs: those default images pinned by digest (Config.trainer_image_digests).
    trainer_image_digests: tuple[tuple[str, str], ...] = ()
    #: Whether a run that asks for GPUs gets its engine's GPU image by default: False where it trains on a machine
    #: without GPUs (the local runner's, local.processes.gpus_here), which gets the CPU image whatever it asks for.
    gpu_images: bool = True
    #: What the workers of a run that asks for GPUs tolerate besides their own tolerations (Config.gpu_tolerations).
    gpu_tolerations: tuple[Toleration, ...] = DEFAULT_GPU_TOLERATIONS
    #: Whether spec.podOverrides may give pods hostPath volumes (Config.allow_host_path).
    allow_host_path: bool = False
    #: Seconds an MPIJob may go without any status (no controller wrote a condition) before the run says nothing
    #: serves MPIJobs (MPIJobServed=False); None: never (the local runner's MPIJob is its own process).
    mpijob_unserved_seconds: Optional[float] = None
    #: False: the documents come from the run's pods, not storage (the operator's status endpoint is on), and a
    #: missing manifest is said as the pods' (Config.reads_storage).
    reads_storage: bool = True
    #: With the push path: when this operator began taking pushes (its start). Pushed beats live in its memory, so a
    #: training's silence is counted from no earlier than this: after its restart, or a `helm upgrade` from pull
    #: mode, the pods need a moment to push again. None: storage holds the beats.
    pushes_since: Optional[dt.datetime] = None
    #: The PriorityClass of an elastic run's capacity probes (Config.capacity_probe_priority_class); None: no probes,
    #: so a shrunk run does not grow back (the local runner's case).
    capacity_probe_priority_class: Optional[str] = None
    #: The most capacity probes one run has at a time (Config.max_capacity_probes).
    max_capacity_probes: int = 4


# --- the decision -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Create:
    """Create `obj` with the owner as its controller. `uid_at`: the status field that records its uid."""

    obj: dict[str, Any]
    event: Optional[Event] = None  # posted once it exists, not with the status (a conflict must not lose it)
    uid_at: Optional[tuple[str, str]] = None


@dataclass(frozen=True)
class Patch:
    """A merge patch of `found` at its resourceVersion. act patches only an object the owner controls, or,
    with `adopt`, one without a controller that carries the owner's labels (`labels`)."""

    found: dict[str, Any]
    patch: dict[str, Any]
    event: Optional[Event] = None
    adopt: bool = False
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Delete:
    """Delete the pod `found` (only that uid); `grace_seconds` 0 forces it: its node is not there to confirm. An
    MPIJob `found` (its kind) is deleted the same way, by uid (an elastic run's resize)."""

    found: dict[str, Any]
    grace_seconds: Optional[int] = None  # None: the pod's own grace period
    event: Optional[Event] = None


Action = Union[Create, Patch, Delete]


@dataclass(frozen=True)
class Decision:
    """What one look decided; act applies it in this order: annotation, pin, actions, status, events."""

    phase: Optional[str]
    pin: Optional[str] = None  # status.pinnedSpec to write before any child (decide.pinning)
    drop_pin_annotation: bool = False  # remove the old pinned-spec annotation (it chooses nothing)
    actions: tuple[Action, ...] = ()
    status: Optional[dict[str, Any]] = None  # merge patch of status; None: unchanged
    desired: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # status after the patch
    events: tuple[Event, ...] = ()
    recheck_in: Optional[float] = None  # seconds until the next look that no event will start
    follow: Optional[tuple[Document, Optional[str]]] = None  # the progress document to watch, from this version
    again: bool = False  # a deleted child was counted: look again at once to make it anew


MAX_ASKS = 32  # a look asks for a few facts; more means decide asks in circles


def look(snapshot: Snapshot, decide: Callable[[Snapshot, Settings], Decision], read: Callable[[Any], Any],
         settings: Settings) -> Decision:
    """Runs `decide`, answering each ask with the caller's `read` (its observe), until it decides."""
    for _ in range(MAX_ASKS):
        try:
            return decide(snapshot, settings)
        except NeedMore as more:
            snapshot = snapshot.knowing(more.ask, read(more.ask))
    raise RuntimeError(f"decide asked for more than {MAX_ASKS} facts about {snapshot.obj['metadata'].get('name')}")
