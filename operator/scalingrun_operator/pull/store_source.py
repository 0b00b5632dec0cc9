"""Pull mode's DocumentSource (document_source.py): a look's documents read from the run's stores, with the keys of
the Secret the run names, read once per look (and kept by the operator's copies, cluster/latest.py, between looks);
and the progress document the watch follows between looks, checked with a conditional read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Union

from scalingrun_api.status_push import HEARTBEAT, PROGRESS
from ..config import Config
from ..decide.snapshot import Document, Listing, Names, Read, Store
from ..document_source import Check, PodsReader
from .bounded_http import Clients
from .storage import Credentials, StorageError, StorageTarget, changed_since, list_names
from .store_slots import Busy
from .stored_documents import read_heartbeat, read_manifest, read_progress


class SecretReader(Protocol):
    def read_credentials(self, namespace: str, secret: str, id_key: str, secret_key: str) -> Credentials: ...


def target_of(config: Config, endpoint: Optional[str], region: str, credentials: Optional[Credentials],
              clients: Clients) -> StorageTarget:
    """A run's store (spec.storage), read under the operator's settings: timeouts, size cap, allow-list."""
    return StorageTarget(endpoint, region, credentials, config.storage_timeout_seconds,
                         deadline=config.storage_deadline_seconds, max_document_bytes=config.max_document_bytes,
                         allowed_endpoints=config.allowed_storage_endpoints, policy=config.endpoint_policy(),
                         clients=clients)


@dataclass(frozen=True)
class FollowedDocument:
    """A progress document in a store, as the watch follows it (document_source.Followed)."""

    uri: str
    target: StorageTarget

    def endpoint(self) -> str:
        return (self.target.endpoint or "AWS S3") if self.shares_endpoint() else "files"

    def shares_endpoint(self) -> bool:
        return self.uri.startswith("s3://")  # files (the local runner) have no endpoint to spare

    def closed_for(self) -> float:
        return self.target.clients.guard.open_for(self.endpoint()) if self.shares_endpoint() else 0.0

    def check(self, version: Optional[str]) -> Check:
        try:
            return Check(*changed_since(self.uri, self.target, version))
        except Busy:
            return Check(False, version, busy=True)
        except StorageError as exc:
            return Check(False, version, error=str(exc))


class StoreDocuments:
    """One look's reads of a run's (or a sweep's points') stores."""

    def __init__(self, secrets: SecretReader, config: Config, clients: Clients, namespace: str,
                 credentials: Any = None):
        self.secrets, self.config, self.clients, self.namespace = secrets, config, clients, namespace
        self.credentials = credentials  # the operator's copies of the stores' keys (latest.Latest); None: none kept
        self._targets: dict[Store, Union[StorageTarget, StorageError]] = {}

    def document(self, ask: Document, pods: PodsReader) -> Read:
        try:
            target = self.target(ask.store)
            if ask.what == PROGRESS:
                document, version = read_progress(ask.uri, target, ask.versioned)
                return Read(document, version)
            if ask.what == HEARTBEAT:
                return Read(read_heartbeat(ask.uri, target))
            return Read(read_manifest(ask.uri, target))
        except StorageError as exc:
            self._doubt_credentials(ask.store)
            return Read(error=str(exc), reason=exc.reason)

    def listing(self, ask: Listing) -> Names:
        try:
            return Names(tuple(list_names(ask.uri, self.target(ask.store))))
        except StorageError as exc:
            self._doubt_credentials(ask.store)
            return Names(error=str(exc))

    def followed(self, ask: Document) -> FollowedDocument:
        return FollowedDocument(ask.uri, self.target(ask.store))

    def target(self, store: Store) -> StorageTarget:
        """The storage target of `store`, with the keys from its Secret (read once per look); with pod identity none,
        so botocore's default chain finds the operator's own."""
        if store not in self._targets:
            try:
                credentials = None
                if store.pod_identity and not self.config.pod_identity_reads:
                    raise StorageError(
                        "spec.storage.credentials is podIdentity, and this operator does not read storage with its "
                        "own identity: its administrator sets the chart value operator.podIdentityReads "
                        "(SCALINGRUN_POD_IDENTITY_READS) and gives its ServiceAccount an IAM role that may read the "
                        "run's documents (docs/security.md, \"Pod identity\")")
                if store.secret:
                    credentials = self._credentials(store)
                self._targets[store] = target_of(self.config, store.endpoint, store.region, credentials, self.clients)
            except StorageError as exc:
                self._targets[store] = exc
        found = self._targets[store]
        if isinstance(found, StorageError):
            raise found
        return found

    def _credentials_key(self, store: Store) -> tuple[str, Optional[str], str, str]:
        return self.namespace, store.secret, store.access_key_id_key, store.secret_access_key_key

    def _doubt_credentials(self, store: Store) -> None:
        """A read failed: the next look reads the Secret again (its keys may have been rotated since)."""
        if self.credentials is not None and store.secret:
            self.credentials.forget(self._credentials_key(store))

    def _credentials(self, store: Store) -> Credentials:
        key = self._credentials_key(store)
        known = self.credentials.get(key) if self.credentials is not None else None
        if known is None:
            known = self.secrets.read_credentials(*key)
            if self.credentials is not None:
                self.credentials.seen(key, known)
        return known


@dataclass
class StoreSources:
    """StoreDocuments for each look, sharing the operator's store clients and its copies of the stores' keys."""

    secrets: SecretReader
    config: Config
    credentials: Any = None  # latest.LatestObjects.credentials; None: the keys are read every look
    clients: Clients = field(default_factory=Clients)

    def for_look(self, namespace: str, name: str, copies: bool = True) -> StoreDocuments:
        """`copies` False: the keys are read anew too (a look after a conflict trusts no copy)."""
        return StoreDocuments(self.secrets, self.config, self.clients, namespace,
                              self.credentials if copies else None)
