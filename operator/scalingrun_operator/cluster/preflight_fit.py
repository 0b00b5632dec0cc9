"""Preflight for the runs of one namespace (`scalingrun doctor -n NS`): whether the cluster has what they ask for.
The GPU resource each run's workers ask for, allocatable on some node, as many a worker as one node has; the NVIDIA
driver that GPU feature discovery labels the GPU nodes with, against the GPU images' floor (docs/install.md); Kueue's
integrations (MPIJobs, and Jobs for the preprocessing) and a LocalQueue for each queue the runs name.

Gathering (the API calls) and judging (`judge_fit`, pure) are apart, as in preflight.py, whose checks these join.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from scalingrun_api.models import GROUP, PLURAL, VERSION
from scalingrun_api.models.run import DEFAULT_GPU_RESOURCE, Workers
from ..decide.status import TERMINAL
from ..schema.workers import MIG_RESOURCE_PREFIX
from .preflight import ERROR, INFO, KUEUE_GROUP, OK, UNKNOWN, WARNING, Check

log = logging.getLogger(__name__)

# The Lightning GPU image's CUDA 13.0 runtime (requirements/torch-cuda.txt) needs driver 580 or newer.
DRIVER_FLOOR = 580
# GPU feature discovery's driver label: its name since v0.15 (GPU Operator 24.x), then the older one.
DRIVER_LABELS = ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver.major")
# Kueue must manage the MPIJob and the preprocessing Job: both carry the run's queue label.
KUEUE_MPIJOB, KUEUE_JOB = "kubeflow.org/mpijob", "batch/job"
KUEUE_FRAMEWORKS = (KUEUE_MPIJOB, KUEUE_JOB)
KUEUE_CONFIG = "kueue-manager-config"  # the ConfigMap Kueue's manifests and chart make
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
DEFAULT_GPUS_PER_WORKER = Workers.model_fields["gpus_per_worker"].default


@dataclass(frozen=True)
class Node:
    name: str
    extended: dict[str, int]  # extended resource (a device plugin's, e.g. nvidia.com/gpu) -> allocatable, above 0
    driver: Optional[int] = None  # the driver's major version from GPU feature discovery's label; None: unlabelled


@dataclass(frozen=True)
class RunAsk:
    """What one active run of the namespace asks for."""

    name: str
    resource: Optional[str]  # None: trains on CPU (gpusPerWorker 0)
    per_worker: int
    queue: Optional[str] = None


@dataclass
class FitFacts:
    """None where the API server could not be asked (RBAC)."""

    namespace: str
    nodes: Optional[list[Node]] = None
    runs: Optional[list[RunAsk]] = None
    kueue_served: bool = False
    local_queues: Optional[set[str]] = None
    kueue_frameworks: Optional[dict[str, list[str]]] = None  # the config's namespace/name -> integrations.frameworks


def is_gpu_resource(name: str) -> bool:
    return name == DEFAULT_GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


# --- judging (pure) -------------------------------------------------------------------------------------------


def judge_fit(facts: FitFacts) -> list[Check]:
    checks = [_gpu_resource(facts), _gpu_driver(facts)]
    if facts.kueue_served:
        checks.append(_kueue_integration(facts))
    queues = _kueue_queue(facts)
    return checks + ([queues] if queues else [])


def _listing(counts: dict[str, int]) -> str:
    return ", ".join(f"{node} {count}" for node, count in sorted(counts.items()))


def _gpu_resource(facts: FitFacts) -> Check:
    if facts.nodes is None:
        return Check("gpu-resource", UNKNOWN, "Nodes could not be listed: whether a node advertises the GPU resource "
                     "the runs ask for is not checked")
    asking = [run for run in facts.runs or [] if run.resource]
    advertised: dict[str, dict[str, int]] = {}
    for node in facts.nodes:
        for resource, count in node.extended.items():
            if is_gpu_resource(resource) or any(run.resource == resource for run in asking):
                advertised.setdefault(resource, {})[node.name] = count
    have = "; ".join(f"{resource}: {_listing(counts)}" for resource, counts in sorted(advertised.items())) or "none"
    misfits = []
    for run in asking:
        counts = advertised.get(run.resource, {})
        if not counts:
            misfits.append(f"run {run.name} asks for {run.resource}, which no node advertises")
        elif run.per_worker > max(counts.values()):
            misfits.append(f"run {run.name} asks for {run.per_worker} {run.resource} a worker, more than any node "
                           f"has ({max(counts.values())})")
    if misfits:
        return Check("gpu-resource", ERROR, f"{'; '.join(misfits)} (allocatable: {have}): its workers stay Pending. "
                     "Install the device plugin that serves it (NVIDIA's; MIG resources: its mixed strategy), set "
                     "spec.workers.gpuResource and gpusPerWorker to what a node has, or gpusPerWorker: 0 on CPU")
    if advertised:
        fit = f"; the {len(asking)} active run(s) in {facts.namespace} asking for GPUs fit a node" if asking else ""
        return Check("gpu-resource", OK, f"GPU resources allocatable: {have}{fit}")
    return Check("gpu-resource", INFO, f"no node advertises a GPU resource ({DEFAULT_GPU_RESOURCE}, "
                 f"{MIG_RESOURCE_PREFIX}*): runs train on CPU only, with spec.workers.gpusPerWorker: 0 (the default, "
                 f"{DEFAULT_GPUS_PER_WORKER}, asks for {DEFAULT_GPU_RESOURCE}). GPU nodes need NVIDIA's device plugin "
                 "(the GPU Operator installs it)")


def _gpu_driver(facts: FitFacts) -> Check:
    if facts.nodes is None:
        return Check("gpu-driver", UNKNOWN, "Nodes could not be listed: the NVIDIA driver is not checked")
    gpu_nodes = [node for node in facts.nodes if any(is_gpu_resource(r) for r in node.extended)]
    if not gpu_nodes:
        return Check("gpu-driver", INFO, "no node advertises an NVIDIA GPU: no driver to check")
    below = {node.name: node.driver for node in gpu_nodes if node.driver is not None and node.driver < DRIVER_FLOOR}
    unlabelled = [node.name for node in gpu_nodes if node.driver is None]
    unknown = (f"{', '.join(unlabelled)} carry no driver label ({DRIVER_LABELS[0]} or {DRIVER_LABELS[1]}, which "
               f"NVIDIA's GPU feature discovery publishes; the GPU Operator runs it): check that nvidia-smi there "
               f"shows R{DRIVER_FLOOR} or newer, which the Lightning GPU image's CUDA 13.0 runtime needs "
               "(docs/install.md)") if unlabelled else ""
    if below:
        return Check("gpu-driver", WARNING, f"driver below R{DRIVER_FLOOR} on {_listing(below)}: the Lightning GPU "
                     f"image's CUDA 13.0 runtime fails there. Upgrade the driver (GPU Operator: driver.version)"
                     f"{'; ' + unknown if unknown else ''}")
    if unlabelled:
        return Check("gpu-driver", INFO, unknown)
    drivers = {node.name: node.driver for node in gpu_nodes}
    return Check("gpu-driver", OK, f"driver R{DRIVER_FLOOR}+ on every GPU node ({_listing(drivers)})")


def _queued(facts: FitFacts) -> dict[str, list[str]]:
    queued: dict[str, list[str]] = {}
    for run in facts.runs or []:
        if run.queue:
            queued.setdefault(run.queue, []).append(run.name)
    return queued


def _kueue_integration(facts: FitFacts) -> Check:
    wanted = ", ".join(KUEUE_FRAMEWORKS)
    if not facts.kueue_frameworks:
        return Check("kueue-mpijob", UNKNOWN, f"Kueue's configuration (ConfigMap {KUEUE_CONFIG}) not found or not "
                     f"readable: check that integrations.frameworks in its {KUEUE_CONFIG_KEY} lists {wanted}")
    where, frameworks = next(iter(sorted(facts.kueue_frameworks.items())))
    missing = [f for f in KUEUE_FRAMEWORKS if f not in frameworks]
    if missing:
        level = ERROR if _queued(facts) else WARNING
        return Check("kueue-mpijob", level, f"Kueue ({where}) does not manage {', '.join(missing)}: a run naming a "
                     "queue keeps its MPIJob suspended (or its preprocessing Job runs unqueued). Add "
                     f"{', '.join(missing)} to integrations.frameworks in its {KUEUE_CONFIG_KEY} and restart "
                     "kueue-controller-manager")
    return Check("kueue-mpijob", OK, f"Kueue ({where}) manages {wanted}")


def _kueue_queue(facts: FitFacts) -> Optional[Check]:
    queued = _queued(facts)
    said = "; ".join(f"{queue} (run {', '.join(runs)})" for queue, runs in sorted(queued.items()))
    if not facts.kueue_served:
        if not queued:
            return None  # the kueue line says it is not installed
        return Check("kueue-queue", ERROR, f"runs in {facts.namespace} name Kueue queues, {said}, but Kueue is not "
                     "installed: their MPIJobs stay suspended. Install Kueue, or remove spec.runPolicy.kueueQueueName")
    if facts.local_queues is None:
        return Check("kueue-queue", UNKNOWN, f"LocalQueues in {facts.namespace} could not be listed")
    here = ", ".join(sorted(facts.local_queues)) or "none"
    missing = {queue: runs for queue, runs in queued.items() if queue not in facts.local_queues}
    if missing:
        named = "; ".join(f"{queue} (run {', '.join(runs)})" for queue, runs in sorted(missing.items()))
        return Check("kueue-queue", ERROR, f"no LocalQueue in {facts.namespace} for {named} (LocalQueues here: {here}):"
                     " their MPIJobs stay suspended. Create a LocalQueue of that name pointing at a ClusterQueue, or "
                     "set spec.runPolicy.kueueQueueName to one that exists")
    if queued:
        return Check("kueue-queue", OK, f"the runs' queues are LocalQueues in {facts.namespace}: {said}")
    return Check("kueue-queue", INFO, f"no run in {facts.namespace} names a queue; LocalQueues here: {here} (a run "
                 "with spec.runPolicy.kueueQueueName needs one in its own namespace)")


# --- gathering (the API calls) --------------------------------------------------------------------------------


def gather_fit(api_client: Any, namespace: str, kueue_versions: dict[str, set[str]]) -> FitFacts:
    """`kueue_versions`: discovery's Kueue group (version -> resources), as preflight.gather found it."""
    facts = FitFacts(namespace=namespace, kueue_served=bool(kueue_versions))
    facts.nodes = _nodes(api_client)
    facts.runs = _runs(api_client, namespace)
    if facts.kueue_served:
        facts.local_queues = _local_queues(api_client, namespace, kueue_versions)
        facts.kueue_frameworks = _kueue_frameworks(api_client)
    return facts


def _count(quantity: Any) -> int:
    try:
        return int(str(quantity))
    except ValueError:  # an extended resource is a whole number; anything else is not a device count
        return 0


def node_facts(node: dict[str, Any]) -> Node:
    labels = (node.get("metadata") or {}).get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    extended = {name: _count(value) for name, value in allocatable.items() if "/" in name and _count(value) > 0}
    driver = next((labels[label] for label in DRIVER_LABELS if label in labels), None)
    return Node(node["metadata"]["name"], extended, int(driver) if driver and driver.isdigit() else None)


def run_ask(run: dict[str, Any]) -> RunAsk:
    spec = run.get("spec") or {}
    workers = spec.get("workers") or {}
    per_worker = int(workers.get("gpusPerWorker", DEFAULT_GPUS_PER_WORKER))
    resource = (workers.get("gpuResource") or DEFAULT_GPU_RESOURCE) if per_worker > 0 else None
    return RunAsk(run["metadata"]["name"], resource, per_worker,
                  (spec.get("runPolicy") or {}).get("kueueQueueName"))


def kueue_frameworks(config: dict[str, Any]) -> list[str]:
    """The integrations Kueue's configuration enables; without an integrations section Kueue enables Jobs only."""
    integrations = config.get("integrations")
    if integrations is None:
        return [KUEUE_JOB]
    return [str(f) for f in (integrations or {}).get("frameworks") or []]


def _listed(call: Any, *arguments: Any, missing: Any = None) -> Any:
    """The items of a list call; `missing` on 404 (nothing served), None when not allowed."""
    import json

    from kubernetes.client.rest import ApiException

    try:
        return json.loads(call(*arguments, _preload_content=False).data).get("items", [])
    except ApiException as exc:
        log.info("preflight: %s not listable (%s)", getattr(call, "__name__", call), exc.status)
        return missing if exc.status == 404 else None


def _nodes(api_client: Any) -> Optional[list[Node]]:
    from kubernetes import client

    items = _listed(client.CoreV1Api(api_client).list_node)
    return None if items is None else [node_facts(node) for node in items]


def _runs(api_client: Any, namespace: str) -> Optional[list[RunAsk]]:
    from kubernetes import client

    items = _listed(client.CustomObjectsApi(api_client).list_namespaced_custom_object, GROUP, VERSION, namespace,
                    PLURAL, missing=[])
    if items is None:
        return None
    return [run_ask(run) for run in items if ((run.get("status") or {}).get("phase")) not in TERMINAL]


def _local_queues(api_client: Any, namespace: str, kueue_versions: dict[str, set[str]]) -> Optional[set[str]]:
    from kubernetes import client

    versions = sorted(v for v, resources in kueue_versions.items() if "localqueues" in resources)
    if not versions:
        return set()
    items = _listed(client.CustomObjectsApi(api_client).list_namespaced_custom_object, KUEUE_GROUP, versions[-1],
                    namespace, "localqueues", missing=[])
    return None if items is None else {queue["metadata"]["name"] for queue in items}


def _kueue_frameworks(api_client: Any) -> Optional[dict[str, list[str]]]:
    """integrations.frameworks of each Kueue configuration found (any namespace); None: none readable."""
    import yaml
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        listed = client.CoreV1Api(api_client).list_config_map_for_all_namespaces(
            field_selector=f"metadata.name={KUEUE_CONFIG}").items
    except ApiException as exc:
        log.info("preflight: Kueue's configuration not readable (%s)", exc.status)
        return None
    found = {}
    for config_map in listed:
        try:
            config = yaml.safe_load((config_map.data or {}).get(KUEUE_CONFIG_KEY) or "") or {}
        except yaml.YAMLError:
            continue
        found[f"{config_map.metadata.namespace}/{config_map.metadata.name}"] = kueue_frameworks(config)
    return found or None
