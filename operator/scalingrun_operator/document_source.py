"""Where observe gets the trainer's documents (decide's Document and Listing asks): one protocol, two sources.

`PodDocuments`, the push path and the default: progress and heartbeat as the run's pods pushed them (pushed.py), the
dataset manifest from the termination message of a pod of the run's own Job; no store is dialled, no Secret read.
`pull.StoreDocuments`, pull mode (deprecated, Config.pull_documents): the run's stores, read with its Secret's keys.
Nothing outside `pull/` knows how a store is read; observe and the reconcile see only this protocol, as the status
server sees only `Authenticator` (push_auth.py) for who may push.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Protocol

from .decide.pods import manifest_left
from .decide.snapshot import MANIFEST, Document, Listing, Names, Read
from .pushed import PushedDocuments

PodsReader = Callable[[], list[dict[str, Any]]]  # the run's pods, as observe lists them for the look


class Busy(Exception):
    """A source's store has its share of calls in flight already: the reconcile looks again after `delay`, and no
    condition is written (nothing is wrong)."""

    def __init__(self, message: str, delay: float):
        super().__init__(message)
        self.delay = delay


class Check(NamedTuple):
    """One conditional check of a followed document: whether it changed since `version`, its version now; `busy`:
    not checked (its store's calls are taken: the next round checks); `error`: it could not be read."""

    changed: bool
    version: Optional[str]
    busy: bool = False
    error: str = ""


class Followed(Protocol):
    """A document the progress watch (cluster/reconcile_scheduler.py) checks between reconciles (pull mode only: a
    pushed document makes its own reconcile). Equal when it is the same document read the same way."""

    uri: str

    def endpoint(self) -> str:
        """The store it is read from: checks are spread per endpoint."""

    def shares_endpoint(self) -> bool:
        """Whether the store is shared by other runs (its checks at once are capped); False: local files."""

    def closed_for(self) -> float:
        """Seconds its store is not asked (a breaker open after failures); 0: it may be asked now."""

    def check(self, version: Optional[str]) -> Check:
        """Whether it changed since `version`; never raises for its store's failures (Check.error)."""


class DocumentSource(Protocol):
    """One look's documents of one run or sweep."""

    def document(self, ask: Document, pods: PodsReader) -> Read:
        """The document decide asks for, as its model (documents.py), or why it cannot be had (Read.error)."""

    def listing(self, ask: Listing) -> Names:
        """The object names decide asks for, or none (Names.error, or no names where nothing is listed)."""

    def followed(self, ask: Document) -> Optional[Followed]:
        """What the progress watch checks for `ask` between looks; None: nothing (its changes come as pushes)."""


class DocumentSources(Protocol):
    """Makes the source of each look (one per operator: the stores' clients and keys outlive a look)."""

    def for_look(self, namespace: str, name: str, copies: bool = True) -> DocumentSource:
        """`copies` False: nothing kept from earlier looks is trusted (a look after a conflict)."""


class PodDocuments:
    """The push path's source: what the run's own pods told the operator."""

    def __init__(self, pushed: Optional[PushedDocuments], namespace: str, name: str):
        self.pushed, self.namespace, self.name = pushed, namespace, name

    def document(self, ask: Document, pods: PodsReader) -> Read:
        """Progress and heartbeat as pushed; the dataset manifest from the termination message of a preprocessing or
        check pod of the run's Job that succeeded (only a pod this Job controls: its uid, from the ask)."""
        if ask.what == MANIFEST:
            return Read(manifest_left(pods(), ask.job_uid))
        return Read(self.pushed.get(self.namespace, ask.run or self.name, ask.what) if self.pushed else None)

    def listing(self, ask: Listing) -> Names:
        # The shard manifests are not counted: the failure says how many of the Job's pods succeeded.
        return Names()

    def followed(self, ask: Document) -> Optional[Followed]:
        return None  # each push makes a reconcile


class PushedSources:
    """PodDocuments for each look, over the documents the status endpoint keeps (none in a tool)."""

    def __init__(self, pushed: Optional[PushedDocuments] = None):
        self.pushed = pushed

    def for_look(self, namespace: str, name: str, copies: bool = True) -> DocumentSource:
        return PodDocuments(self.pushed, namespace, name)
