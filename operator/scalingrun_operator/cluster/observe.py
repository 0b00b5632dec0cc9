"""observe: the facts decide asks for, read from the API server and, for documents, from the look's DocumentSource.

The documents come through document_source.py's protocol: on the push path (the default) from the run's own pods,
progress and heartbeat as pushed, the dataset manifest from the termination message of a pod of the run's own Job;
in pull mode (deprecated) from the run's stores (pull/store_source.py). observe knows neither way.

One Observer serves one look at one run or sweep; with the operator's copies (latest.py), a Job or an MPIJob shown
recently is not read at all. Failures that decide reports as conditions (a document that cannot be read, a log
that cannot be fetched) become facts; API errors propagate to the reconcile.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Optional

from ..decide.snapshot import (
    Child, Document, Listing, Log, LogTail, Nodes, NoticedNodes, PodList, Pods, Server, ServerVersion,
)
from ..document_source import DocumentSource
from .k8s import Kube
from .latest import LatestObjects
from .memory import Memory
from .node_notices import NodeNotices
from .pod_index import PodIndex


class Observer:
    def __init__(self, kube: Kube, memory: Memory, documents: DocumentSource, namespace: str, name: str,
                 pods: Optional[PodIndex] = None, latest: Optional[LatestObjects] = None,
                 notices: Optional[NodeNotices] = None):
        self.kube, self.memory, self.documents, self.pods = kube, memory, documents, pods
        self.latest, self.notices = latest, notices
        self.namespace, self.name = namespace, name

    def read(self, ask: Any) -> Any:
        if isinstance(ask, Child):
            read = lambda: self.kube.get_child(ask.kind, self.namespace, ask.name)  # noqa: E731
            return self.latest.child(ask.kind, self.namespace, ask.name, read) if self.latest else read()
        if isinstance(ask, Pods):
            return PodList(tuple(self._pods()), MappingProxyType(self.memory.deleted_pods()))
        if isinstance(ask, Document):
            return self.documents.document(ask, self._pods)
        if isinstance(ask, Listing):
            return self.documents.listing(ask)
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

    def _pods(self) -> list[dict[str, Any]]:
        """From the pod watch's index where it knows the run's pods, else listed (and the index seeded)."""
        if self.pods is None:
            return self.kube.list_pods(self.namespace, self.name)
        known = self.pods.pods(self.namespace, self.name)
        if known is not None:
            return known
        return self.pods.listing(self.namespace, self.name, lambda: self.kube.list_pods(self.namespace, self.name))
