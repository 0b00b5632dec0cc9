"""The Nodes that carry a cloud's termination taint (decide/nodes.py: TERMINATION_TAINTS), as the Node watch reports
them (handlers/runs.py: node_changed): what a look answers decide's NoticedNodes from, instead of reading the Node
of every training pod at every look.

Only the tainted ones are kept, and of them only the name and the taints: a cluster's Nodes are large (images,
conditions) and many, and a healthy one says nothing a look needs. A Node that loses the taint, or is deleted,
leaves the index.
"""

from __future__ import annotations

import threading
from types import MappingProxyType
from typing import Any, Mapping, Optional

from ..decide.nodes import termination_notice


class NodeNotices:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._nodes: dict[str, dict[str, Any]] = {}

    def observe(self, event_type: Optional[str], node: dict[str, Any]) -> bool:
        """A Node's watch event (type None: kopf's listing); True when it newly carries a termination taint, so
        that the runs with pods on it look now."""
        name = (node.get("metadata") or {}).get("name")
        if not name:
            return False
        noticed = event_type != "DELETED" and termination_notice(node) is not None
        with self._guard:
            before = name in self._nodes
            if noticed:
                self._nodes[name] = {"metadata": {"name": name},
                                     "spec": {"taints": list((node.get("spec") or {}).get("taints") or [])}}
            else:
                self._nodes.pop(name, None)
        return noticed and not before

    def nodes(self) -> Mapping[str, dict[str, Any]]:
        with self._guard:
            return MappingProxyType(dict(self._nodes))
