"""Fake GPUs for the e2e's nodes: every node advertises GPU_RESOURCE in its status (capacity and allocatable), as a
device plugin's kubelet reports them, with no device plugin running (the kubelet keeps an extended resource it does not
serve). The GPU scheduling test and doctor's GPU checks share them."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

GPU_RESOURCE = "nvidia.com/gpu"  # the operator's default spec.workers.gpuResource
FAKE_GPUS = 4


def _status_path(field: str) -> str:
    return f"/status/{field}/{GPU_RESOURCE.replace('~', '~0').replace('/', '~1')}"  # JSON pointer escaping


def heartbeats(cluster, nodes: list[str]) -> dict[str, Any]:
    """Each node's Ready lastHeartbeatTime: it moves when the kubelet writes the node's status."""
    return {n: next((c.last_heartbeat_time for c in cluster.core().read_node_status(n).status.conditions or []
                     if c.type == "Ready"), None) for n in nodes}


def advertised(cluster, node: str) -> dict[str, Any]:
    status = cluster.core().read_node_status(node).status
    return {field: (getattr(status, field) or {}).get(GPU_RESOURCE) for field in ("capacity", "allocatable")}


def wait_advertised(cluster, nodes: list[str], count: int, timeout: float = 300.0) -> None:
    """Waits until every node's status serves `count` allocatable GPU_RESOURCE (the patch read back). `timeout` is a
    hang's bound, not the API server's speed under load."""
    deadline = time.monotonic() + timeout
    while any(advertised(cluster, n)["allocatable"] != str(count) for n in nodes):
        assert time.monotonic() < deadline, {n: advertised(cluster, n) for n in nodes}
        time.sleep(1)


@contextlib.contextmanager
def fake_gpus(cluster, count: int) -> Iterator[list[str]]:
    """Every node advertises `count` GPU_RESOURCE in its status (capacity and allocatable, as a device plugin's
    kubelet reports them; the kubelet keeps an extended resource it does not serve) until the block ends, however
    it ends. Yields the node names."""
    core = cluster.core()
    nodes = [n.metadata.name for n in core.list_node().items]
    try:
        for node in nodes:
            core.patch_node_status(node, [{"op": "add", "path": _status_path(field), "value": str(count)}
                                          for field in ("capacity", "allocatable")])
        yield nodes
    finally:
        for node in nodes:
            present = [field for field, value in advertised(cluster, node).items() if value is not None]
            if present:
                core.patch_node_status(node, [{"op": "remove", "path": _status_path(field)} for field in present])
        left = {node: advertised(cluster, node) for node in nodes}
        assert all(v is None for a in left.values() for v in a.values()), f"fake GPUs left on nodes: {left}"
