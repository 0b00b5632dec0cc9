"""observe: the facts decide asks for, read from the API server and object storage for one look.

With the status endpoint on (Config.reads_storage False) storage is never read and no Secret either: the
documents come from the run's own pods, progress and heartbeat as pushed, the dataset manifest from the
termination message of the preprocessing or check pod that made it, a pod of the run's own Job (its uid, from the
ask: decide.pods.manifest_left).

One Observer serves one look at one run or sweep: it reads the Secret of a store once, however many
documents the look reads with it; with the operator's copies (latest.py), a Job, an MPIJob or a store's keys
shown recently are not read at all. Failures that decide reports as conditions (storage that cannot be
read, a log that cannot be fetched) become facts; API errors propagate to the reconcile.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Optional, Union

from scalingrun_api.status_push import HEARTBEAT, PROGRESS
from ..config import Config
from ..decide.snapshot import (
    MANIFEST, Child, Document, Listing, Log, LogTail, Names, Nodes, NoticedNodes, PodList, Pods,
    Read, Server, ServerVersion, Store,
)
from ..decide.pods import manifest_left
from ..documents import read_heartbeat, read_manifest, read_progress
from ..storage import Clients, Credentials, StorageError, StorageTarget, list_names
from .k8s import Kube
from .latest import LatestObjects
from .memory import Memory
from .node_notices import NodeNotices
from .pod_index import PodIndex
from ..pushed import PushedDocuments


class Observer:
    def __init__(self, kube: Kube, config: Config, memory: Memory, clients: Clients, namespace: str, name: str,
                 pods: Optional[PodIndex] = None, latest: Optional[LatestObjects] = None,
                 pushed: Optional[PushedDocuments] = None, notices: Optional[NodeNotices] = None):
        self.kube, self.config, self.memory, self.clients, self.pods = kube, config, memory, clients, pods
        self.latest, self.pushed, self.notices = latest, pushed, notices
        self.namespace, self.name = namespace, name
        self._targets: dict[Store, Union[StorageTarget, StorageError]] = {}

    def read(self, ask: Any) -> Any:
        if isinstance(ask, Child):
            read = lambda: self.kube.get_child(ask.kind, self.namespace, ask.name)  # noqa: E731
            return self.latest.child(ask.kind, self.namespace, ask.name, read) if self.latest else read()
        if isinstance(ask, Pods):
            return PodList(tuple(self._pods()), MappingProxyType(self.memory.deleted_pods()))
        if isinstance(ask, Document) and not self.config.reads_storage:
            return self._from_pods(ask)
        if isinstance(ask, Listing) and not self.config.reads_storage:
            # The shard manifests are not counted: the failure says how many of the Job's pods succeeded.
            return Names()
        if isinstance(ask, Document):
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
        if isinstance(ask, Listing):
            try:
                return Names(tuple(list_names(ask.uri, self.target(ask.store))))
            except StorageError as exc:
                self._doubt_credentials(ask.store)
                return Names(error=str(exc))
        if isinstance(ask, Log):
            text, error = self.kube.read_pod_log_tail(self.namespace, ask.pod, ask.container, ask.lines)
            return LogTail(text, error)
        if isinstance(ask, Nodes):
            return MappingProxyType({name: self.kube.get_node(name) for name in ask.names})
        if isinstance(ask, NoticedNodes):  # the Node watch's (Runtime); none in a tool
            return self.notices.nodes() if self.notices is not None else MappingProxyType({})
        if isinstance(ask, ServerVersion):
            return Server(*self.kube.server_version())
        raise TypeError(f"observe cannot read {ask!r}")

    def _from_pods(self, ask: Document) -> Read:
        """A document as the run's own pods told it (no storage read, no Secret): progress and heartbeat as pushed,
        the dataset manifest from the termination message of a preprocessing or check pod of the run's Job that
        succeeded."""
        if ask.what == MANIFEST:
            return Read(manifest_left(self._pods(), ask.job_uid))
        return Read(self.pushed.get(self.namespace, ask.run or self.name, ask.what) if self.pushed else None)

    def _pods(self) -> list[dict[str, Any]]:
        """From the pod watch's index where it knows the run's pods, else listed (and the index seeded)."""
        if self.pods is None:
            return self.kube.list_pods(self.namespace, self.name)
        known = self.pods.pods(self.namespace, self.name)
        if known is not None:
            return known
        return self.pods.listing(self.namespace, self.name, lambda: self.kube.list_pods(self.namespace, self.name))

    def target(self, store: Store) -> StorageTarget:
        """The storage target of `store`, with the keys from its Secret (read once per look); with pod identity none,
        so botocore's default chain finds the operator's own."""
        if not self.config.reads_storage:  # the push path's promise: no store dialled, no Secret read
            raise RuntimeError("this operator reads no storage (its status endpoint is on)")
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
                self._targets[store] = self.config.storage_target(store.endpoint, store.region, credentials,
                                                                  self.clients)
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
        if self.latest and store.secret:
            self.latest.credentials.forget(self._credentials_key(store))

    def _credentials(self, store: Store) -> Credentials:
        key = self._credentials_key(store)
        known = self.latest.credentials.get(key) if self.latest else None
        if known is None:
            known = self.kube.read_credentials(*key)
            if self.latest:
                self.latest.credentials.seen(key, known)
        return known
