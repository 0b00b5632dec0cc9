"""Faults the e2e injects into the node cluster (../shared/node), shared by its tests and bench/chaos.py: a pod's
containers paused (`docker pause`: a frozen process, alive and silent) and killed as a reboot would, the kubelet
stopped and started, and the node's capacity as an extended resource no device plugin serves
(scalingrun.dev/e2e-capacity, written into the node's status as a device plugin's kubelet would report it)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

DOCKER = "/usr/bin/docker"  # the Debian client, matching the node's dockerd 20.10 (../shared/node/README.md)
CAPACITY = "scalingrun.dev/e2e-capacity"  # an extended resource no device plugin serves: only the e2e sets it


def docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=120)


def containers_of(pod: Any) -> list[str]:
    """The pod's containers, its sandbox included, on the node's dockerd (the kubelet labels them)."""
    found = docker("ps", "-q", "--filter", f"label=io.kubernetes.pod.uid={pod.metadata.uid}")
    assert found.returncode == 0, found.stderr
    return found.stdout.split()


def freeze(pods: list[Any]) -> list[str]:
    ids = [c for pod in pods for c in containers_of(pod)]
    assert ids, f"no containers of {[p.metadata.name for p in pods]} on the node"
    paused = docker("pause", *ids)
    assert paused.returncode == 0, paused.stderr
    return ids


def kill(ids: list[str]) -> None:
    """What a reboot does to the frozen processes: gone (unpaused first, or dockerd cannot kill them). Containers
    already gone are no error."""
    if ids:
        docker("unpause", *ids)
        docker("kill", *ids)


def kubelet(node_dir: Path, command: str) -> None:
    """../shared/node/cluster.sh kubelet-stop or kubelet-start."""
    done = subprocess.run(["bash", str(node_dir / "cluster.sh"), command], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"cluster.sh {command}: {done.stderr[-2000:]}"


def capacity_pointer(field: str) -> str:
    return f"/status/{field}/{CAPACITY.replace('~', '~0').replace('/', '~1')}"  # JSON pointer escaping


def advertised(cluster, node: str) -> dict[str, Any]:
    status = cluster.core().read_node_status(node).status
    return {field: (getattr(status, field) or {}).get(CAPACITY) for field in ("capacity", "allocatable")}


def set_capacity(cluster, node: str, units: int) -> None:
    """The node reports `units` of CAPACITY (capacity and allocatable), as a device plugin's kubelet would; waits
    until the API server serves it (the scheduler reads the same)."""
    cluster.core().patch_node_status(node, [{"op": "add", "path": capacity_pointer(field), "value": str(units)}
                                            for field in ("capacity", "allocatable")])
    deadline = time.monotonic() + 60
    while advertised(cluster, node) != {"capacity": str(units), "allocatable": str(units)}:
        assert time.monotonic() < deadline, advertised(cluster, node)
        time.sleep(0.5)


@contextlib.contextmanager
def node_capacity(cluster, units: int) -> Iterator[str]:
    """The (only) node advertises `units` of CAPACITY until the block ends, however it ends; yields its name."""
    core = cluster.core()
    [node] = [n.metadata.name for n in core.list_node().items]
    try:
        set_capacity(cluster, node, units)
        yield node
    finally:
        present = [field for field, value in advertised(cluster, node).items() if value is not None]
        if present:
            core.patch_node_status(node, [{"op": "remove", "path": capacity_pointer(field)} for field in present])
        assert advertised(cluster, node) == {"capacity": None, "allocatable": None}, advertised(cluster, node)
