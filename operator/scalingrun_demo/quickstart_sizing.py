"""What the cluster quick start asks of the cluster, against what the nodes have free, with the arithmetic shown.

The demands come from the objects themselves: the chart as `helm template` renders it, the demo SeaweedFS's
Deployment and the run's children as the operator renders them (`builders.build_children`). The preprocessing
Job's pods end before the MPIJob starts, so the run needs the larger of its two phases, not their sum. Free is
each node's allocatable minus what the pods already on it request, as the scheduler counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from scalingrun_api.models.common import quantity_value

ALWAYS, PREPROCESSING, TRAINING = "always", "preprocessing", "training"
DONE_PHASES = ("Succeeded", "Failed")  # their pods request nothing any more


@dataclass(frozen=True)
class Demand:
    """PODS pods of one kind, each requesting CPU cores and MEMORY bytes, present during WHEN."""

    what: str
    pods: int
    cpu: float
    memory: float
    when: str = ALWAYS


@dataclass(frozen=True)
class Capacity:
    """The nodes' allocatable and what the pods already on them request, summed; and the most free on one node."""

    nodes: int
    allocatable_cpu: float
    requested_cpu: float
    allocatable_memory: float
    requested_memory: float
    largest_free_cpu: float

    @property
    def free_cpu(self) -> float:
        return self.allocatable_cpu - self.requested_cpu

    @property
    def free_memory(self) -> float:
        return self.allocatable_memory - self.requested_memory


def pod_requests(pod_spec: dict[str, Any]) -> tuple[float, float]:
    """(CPU cores, memory bytes) a pod requests: its containers' sum, or its largest init container's if more."""
    def requests(containers: Iterable[dict[str, Any]]) -> list[tuple[float, float]]:
        found = []
        for container in containers:
            wanted = (container.get("resources") or {}).get("requests") or {}
            found.append((quantity_value(wanted.get("cpu", 0)), quantity_value(wanted.get("memory", 0))))
        return found

    running = requests(pod_spec.get("containers") or [])
    init = requests(pod_spec.get("initContainers") or [])
    cpu, memory = sum(c for c, _ in running), sum(m for _, m in running)
    return max([cpu, *(c for c, _ in init)]), max([memory, *(m for _, m in init)])


def demands(objects: list[dict[str, Any]], what: str = "") -> list[Demand]:
    """The pods that Deployments, StatefulSets, Jobs and MPIJobs among OBJECTS make, with their requests; a
    Deployment is called WHAT (default: its name), a Job `preprocessing`, an MPIJob's roles `launcher`, `workers`."""
    found = []
    for obj in objects:
        kind, spec = obj.get("kind"), obj.get("spec") or {}
        name = what or obj["metadata"]["name"]
        if kind in ("Deployment", "StatefulSet"):
            found.append(Demand(name, spec.get("replicas", 1), *pod_requests(spec["template"]["spec"])))
        elif kind == "Job":
            found.append(Demand("preprocessing", spec.get("parallelism", 1),
                                *pod_requests(spec["template"]["spec"]), PREPROCESSING))
        elif kind == "MPIJob":
            for role, replica in spec["mpiReplicaSpecs"].items():
                found.append(Demand("workers" if role == "Worker" else role.lower(), replica.get("replicas", 1),
                                    *pod_requests(replica["template"]["spec"]), TRAINING))
    return found


def needed(wanted: list[Demand]) -> tuple[float, float]:
    """(CPU, memory) at the peak: what is always there plus the larger of the two phases."""
    def total(when: str, index: int) -> float:
        return sum(d.pods * (d.cpu, d.memory)[index] for d in wanted if d.when == when)

    return tuple(total(ALWAYS, i) + max(total(PREPROCESSING, i), total(TRAINING, i)) for i in (0, 1))


def cores(value: float) -> str:
    """0.1 -> 100m, 1.0 -> 1, 1.25 -> 1.25: as a Kubernetes quantity reads."""
    return f"{round(value * 1000)}m" if value < 1 else f"{value:.2f}".rstrip("0").rstrip(".")


def gibibytes(value: float) -> str:
    return f"{value / 2 ** 30:.2f}".rstrip("0").rstrip(".") + "Gi"


def arithmetic(wanted: list[Demand]) -> str:
    """The CPU sum in words: `operator 2 x 100m + ... + max(preprocessing 2 x 500m, workers 2 x 500m + launcher
    1 x 100m) = 1.4 CPU`."""
    def terms(when: str) -> str:
        return " + ".join(f"{d.what} {d.pods} x {cores(d.cpu)}" for d in wanted if d.when == when and d.pods)

    phases = [terms(when) for when in (PREPROCESSING, TRAINING) if terms(when)]
    parts = [terms(ALWAYS)] if terms(ALWAYS) else []
    if phases:
        parts.append(f"max({', '.join(phases)})" if len(phases) > 1 else phases[0])
    return f"{' + '.join(parts)} = {cores(needed(wanted)[0])} CPU"


def capacity(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Capacity:
    """The schedulable nodes' allocatable against the requests of the pods bound to them that have not ended."""
    usable = [n for n in nodes if not (n.get("spec") or {}).get("unschedulable")]
    requested: dict[str, tuple[float, float]] = {n["metadata"]["name"]: (0.0, 0.0) for n in usable}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in requested and (pod.get("status") or {}).get("phase") not in DONE_PHASES:
            cpu, memory = pod_requests(pod["spec"])
            requested[node] = (requested[node][0] + cpu, requested[node][1] + memory)
    allocatable = {n["metadata"]["name"]: (quantity_value(n["status"]["allocatable"].get("cpu", 0)),
                                           quantity_value(n["status"]["allocatable"].get("memory", 0)))
                   for n in usable}
    return Capacity(len(usable), sum(c for c, _ in allocatable.values()), sum(c for c, _ in requested.values()),
                    sum(m for _, m in allocatable.values()), sum(m for _, m in requested.values()),
                    max((allocatable[n][0] - requested[n][0] for n in allocatable), default=0.0))


def fits(wanted: list[Demand], free: Capacity) -> bool:
    """The peak within the free CPU and memory, and the largest pod within one node's free CPU."""
    cpu, memory = needed(wanted)
    largest_pod = max((d.cpu for d in wanted if d.pods), default=0.0)
    return cpu <= free.free_cpu + 1e-9 and memory <= free.free_memory and largest_pod <= free.largest_free_cpu + 1e-9


def free_words(free: Capacity) -> str:
    return (f"{cores(free.free_cpu)} CPU and {gibibytes(free.free_memory)} free on {free.nodes} node"
            f"{'s' if free.nodes != 1 else ''} ({cores(free.allocatable_cpu)} CPU allocatable, "
            f"{cores(free.requested_cpu)} requested by the pods already there)")


def choose(candidates: list[tuple[str, list[Demand]]], free: Capacity) -> tuple[str, list[str]]:
    """The first candidate worker CPU whose demands fit, and the lines that show why; ValueError with those
    lines when none does."""
    lines = [f"free: {free_words(free)}"]
    for cpu, wanted in candidates:
        verdict = "fits" if fits(wanted, free) else "does not fit"
        lines.append(f"workers at {cpu} CPU: {arithmetic(wanted)}, {gibibytes(needed(wanted)[1])} memory: {verdict}")
        if verdict == "fits":
            return cpu, lines
    raise ValueError("\n".join(lines))
