"""Capacity probes of an elastic run (spec.workers.minReplicas) that trains with fewer workers than it asks for: one
pod per missing worker, asking for a worker's resources where a worker may go (its node selector and tolerations),
at the chart's PriorityClass `scalingrun-capacity-probe` (the lowest priority, preemptionPolicy Never): it never
preempts anything and any other pod preempts it, so a probe starves no workload. A probe the scheduler places says
that a worker would fit now; the run grows at its next epoch boundary and deletes the probes as it does."""

from __future__ import annotations

from typing import Any, Sequence

from scalingrun_api.models import ScalingRun, Toleration
from .common import labels, queue_labels
from .mpijob import DEFAULT_GPU_TOLERATIONS, build_mpijob

CAPACITY_PROBE = "capacity-probe"  # the probes' app.kubernetes.io/component
CAPACITY_PROBE_PRIORITY_CLASS = "scalingrun-capacity-probe"  # the chart's PriorityClass (templates/priorityclass.yaml)
# What a probe runs: nothing but a wait, in the worker's image (already on the nodes that ran workers).
PROBE_COMMAND = ["sleep", "2147483647"]
_KEPT = ("nodeSelector", "tolerations", "affinity", "securityContext", "imagePullSecrets", "serviceAccountName",
         "automountServiceAccountToken", "enableServiceLinks")


def probe_name(run: ScalingRun, index: int) -> str:
    return f"{run.metadata.name}-capacity-{index}"


def build_capacity_probe(run: ScalingRun, namespace: str, index: int,
                         priority_class: str = CAPACITY_PROBE_PRIORITY_CLASS,
                         gpu_tolerations: Sequence[Toleration] = DEFAULT_GPU_TOLERATIONS) -> dict[str, Any]:
    """The probe pod `index` of `run`: a worker's placement and requests, none of its work."""
    worker = build_mpijob(run, namespace, gpu_tolerations)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    container = worker["containers"][0]
    spec: dict[str, Any] = {key: worker[key] for key in _KEPT if key in worker}
    spec.update(priorityClassName=priority_class, restartPolicy="Never", terminationGracePeriodSeconds=0,
                containers=[{"name": CAPACITY_PROBE, "image": container["image"], "command": PROBE_COMMAND,
                             "resources": container.get("resources") or {},
                             **({"securityContext": container["securityContext"]}
                                if "securityContext" in container else {})}])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": probe_name(run, index), "namespace": namespace,
                         # The run's LocalQueue too: under Kueue's pod integration a probe asks for quota as well
                         # as room, as a worker would.
                         "labels": {**labels(run, CAPACITY_PROBE), **queue_labels(run)}},
            "spec": spec}
