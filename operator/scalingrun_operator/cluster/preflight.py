"""Preflight: what a cluster must have for ScalingRuns to train, read from the API server: the MPIJob API that is
served (kubeflow.org/v2beta1, mpi-operator v0.8's, or only the Training Operator v1's kubeflow.org/v1), which
controller serves it and whether the Training Operator v1 competes for it, Kueue, the CRDs' version against this
one, and the operator itself. `scalingrun doctor` runs every check with the user's credentials; the operator runs
the ones its RBAC allows at start-up, logs them and exports them (scalingrun_preflight_problem).

Gathering (the API calls) and judging (`judge`, pure) are apart: tests judge facts without a cluster too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from scalingrun_api import models
from scalingrun_api.models import MPIJOB_API_VERSION, MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION
from ..builders.mpijob import MPI_OPERATOR, MPI_OPERATOR_INSTALL
from ..schema.crd import VERSION_LABEL, project_version

log = logging.getLogger(__name__)

OK, INFO, WARNING, ERROR, UNKNOWN = "ok", "info", "warning", "error", "unknown"
KUEUE_GROUP = "kueue.x-k8s.io"
OPERATOR_SELECTOR = "app.kubernetes.io/name=scalingrun,app.kubernetes.io/component=operator"
COEXISTENCE = 'docs/run-in-a-cluster.md, "MPIJobs: mpi-operator and the Training Operator"'
CRD_APPLY = "scalingrun crd | kubectl apply --server-side -f -"
CRD_NAMES = (f"{models.PLURAL}.{models.GROUP}", f"{models.SWEEP_PLURAL}.{models.GROUP}")


@dataclass(frozen=True)
class Check:
    name: str  # mpijob-api, mpijob-controller, kueue, crd-version, operator
    level: str  # ok, info, warning, error, unknown (could not be checked)
    message: str

    @property
    def problem(self) -> bool:
        return self.level in (WARNING, ERROR)


@dataclass(frozen=True)
class Controller:
    """A Deployment that serves MPIJobs: mpi-operator (v2beta1), the Training Operator v1 (v1), or a stand-in."""

    kind: str  # mpi-operator, training-operator
    where: str  # namespace/name
    ready: bool
    serves_mpijobs: bool = True  # the Training Operator without mpijob in its --enable-scheme flags: False


@dataclass
class Facts:
    """What the API server said; None where it could not be asked (RBAC, or not asked: the operator)."""

    groups: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # group -> version -> resources
    controllers: Optional[list[Controller]] = None
    crd_versions: Optional[dict[str, Optional[str]]] = None  # CRD name -> its version label (None: no label)
    operators: Optional[list[dict[str, Any]]] = None  # {"where", "ready", "version", "health"}
    version: str = field(default_factory=project_version)


# --- judging (pure) -------------------------------------------------------------------------------------------


def judge(facts: Facts) -> list[Check]:
    checks = [_mpijob_api(facts), _mpijob_controller(facts), _kueue(facts), _crd_version(facts)]
    if facts.operators is not None:
        checks.append(_operator(facts))
    return checks


def _mpijob_versions(facts: Facts) -> set[str]:
    return {v for v, resources in facts.groups.get(MPIJOB_GROUP, {}).items() if MPIJOB_PLURAL in resources}


def other_mpijob_versions(served: list[str]) -> str:
    """Why an MPIJob CRD serving `served` (not v2beta1: the Training Operator v1's) cannot be used, nor replaced."""
    return (f"{MPIJOB_PLURAL}.{MPIJOB_GROUP} serves {', '.join(served) or 'no version'}, not {MPIJOB_VERSION}: that "
            f"is the Training Operator v1's MPIJob (v1), and ScalingRuns create {MPIJOB_VERSION} MPIJobs. Installing "
            f"mpi-operator over it breaks the Training Operator's MPIJobs: read {COEXISTENCE}")


def _mpijob_api(facts: Facts) -> Check:
    served = _mpijob_versions(facts)
    if MPIJOB_VERSION in served:
        return Check("mpijob-api", OK, f"{MPIJOB_API_VERSION} mpijobs served ({MPI_OPERATOR}'s API)")
    if served:
        return Check("mpijob-api", ERROR, other_mpijob_versions(sorted(served)))
    return Check("mpijob-api", ERROR, f"no MPIJob API ({MPIJOB_API_VERSION}): ScalingRuns train through {MPI_OPERATOR}. "
                 f"Install it: {MPI_OPERATOR_INSTALL}")


def _mpijob_controller(facts: Facts) -> Check:
    if facts.controllers is None:
        return Check("mpijob-controller", UNKNOWN, "Deployments could not be listed: which controller serves MPIJobs "
                     "is not checked (a run whose MPIJob nothing reconciles gets MPIJobServed=False)")
    mpi = [c for c in facts.controllers if c.kind == "mpi-operator"]
    ready = [c.where for c in mpi if c.ready]
    training = [c for c in facts.controllers if c.kind == "training-operator" and c.serves_mpijobs]
    if ready and training:
        return Check("mpijob-controller", WARNING, f"MPIJobs are served by {', '.join(ready)}, and the Training Operator "
                     f"({', '.join(c.where for c in training)}) runs with its MPIJob controller on: both act on "
                     "MPIJobs (two launchers). Start it with --enable-scheme for its other kinds only "
                     f"({COEXISTENCE})")
    if ready:
        return Check("mpijob-controller", OK, f"MPIJobs served by {', '.join(ready)}")
    if mpi:
        return Check("mpijob-controller", ERROR, f"{', '.join(c.where for c in mpi)} serves MPIJobs but has no ready "
                     "replica: runs wait in Training with MPIJobServed=False")
    if training:
        return Check("mpijob-controller", ERROR, f"only the Training Operator v1 ({', '.join(c.where for c in training)}) "
                     f"serves MPIJobs, as kubeflow.org/v1; nothing reconciles {MPIJOB_API_VERSION}. Install "
                     f"{MPI_OPERATOR} beside it as {COEXISTENCE} says")
    return Check("mpijob-controller", ERROR, f"no Deployment serves MPIJobs (none named like mpi-operator): runs would "
                 f"wait in Training. Install {MPI_OPERATOR}: {MPI_OPERATOR_INSTALL}")


def _kueue(facts: Facts) -> Check:
    versions = sorted(facts.groups.get(KUEUE_GROUP, {}))
    if versions:
        return Check("kueue", OK, f"Kueue present ({KUEUE_GROUP}/{', '.join(versions)}): runs with "
                     "spec.runPolicy.kueueQueueName wait for its admission")
    return Check("kueue", INFO, "Kueue not installed: leave spec.runPolicy.kueueQueueName unset (a run naming a queue "
                 "keeps its MPIJob suspended until Kueue admits it)")


def _crd_version(facts: Facts) -> Check:
    if facts.crd_versions is None:
        return Check("crd-version", UNKNOWN, "the CustomResourceDefinitions could not be read")
    missing = [name for name in CRD_NAMES if name not in facts.crd_versions]
    if missing:
        return Check("crd-version", ERROR, f"{', '.join(missing)} not installed: install the chart, or {CRD_APPLY}")
    found = {name: label for name, label in facts.crd_versions.items()}
    unlabelled = [name for name, label in found.items() if not label]
    if unlabelled:
        return Check("crd-version", WARNING, f"{', '.join(unlabelled)} carry no {VERSION_LABEL} label (made before "
                     f"0.1.0): apply this version's ({facts.version}): {CRD_APPLY}")
    other = {name: label for name, label in found.items() if label != facts.version}
    if other:
        said = ", ".join(f"{name} {label}" for name, label in sorted(other.items()))
        return Check("crd-version", WARNING, f"CRDs of another version ({said}) than this one ({facts.version}): "
                     f"upgrade the chart, or {CRD_APPLY} with the matching scalingrun")
    return Check("crd-version", OK, f"CRDs at {facts.version}, as this scalingrun")


def _operator(facts: Facts) -> Check:
    operators = facts.operators or []
    if not operators:
        return Check("operator", ERROR, "no scalingrun operator Deployment found (label "
                     f"{OPERATOR_SELECTOR}): runs get no status. Install the chart: helm install scalingrun "
                     "charts/scalingrun -n scalingrun-system --create-namespace")
    ready = [o for o in operators if o["ready"]]
    if not ready:
        return Check("operator", ERROR, f"{', '.join(o['where'] for o in operators)} has no ready replica: "
                     f"kubectl describe deployment -n {operators[0]['where'].split('/')[0]}")
    first = ready[0]
    skew = [o for o in ready if o.get("version") and o["version"] != facts.version]
    health = first.get("health") or ""
    level = WARNING if skew or not health.startswith("answered") else OK
    text = f"operator {first['where']} ready (chart {first.get('version') or 'version unknown'}); /healthz {health}"
    if skew:
        text += f"; this scalingrun is {facts.version}"
    return Check("operator", level, text)


# --- gathering (the API calls) --------------------------------------------------------------------------------


def gather(api_client: Any, cluster_wide: bool = True) -> Facts:
    """The facts from the API server; `cluster_wide` False: only discovery and the CRDs (the operator's RBAC)."""
    facts = Facts(groups=discovered_groups(api_client, (MPIJOB_GROUP, KUEUE_GROUP)))
    facts.crd_versions = _crd_labels(api_client)
    if cluster_wide:
        facts.controllers = _controllers(api_client)
        facts.operators = _operators(api_client)
    return facts


def discovered_groups(api_client: Any, names: tuple[str, ...]) -> dict[str, dict[str, set[str]]]:
    """Discovery (no RBAC needed): each named group's versions and the resources each serves."""
    from kubernetes import client

    groups: dict[str, dict[str, set[str]]] = {}
    custom = client.CustomObjectsApi(api_client)
    for group in client.ApisApi(api_client).get_api_versions().groups:
        if group.name not in names:
            continue
        for version in group.versions:
            resources = custom.get_api_resources(group.name, version.version).resources or []
            groups.setdefault(group.name, {})[version.version] = {r.name for r in resources if "/" not in r.name}
    return groups


def _crd_labels(api_client: Any) -> Optional[dict[str, Optional[str]]]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        listed = client.ApiextensionsV1Api(api_client).list_custom_resource_definition(
            label_selector="app.kubernetes.io/name=scalingrun")
    except ApiException as exc:
        log.info("preflight: CRDs not readable (%s)", exc.status)
        return None
    return {crd.metadata.name: (crd.metadata.labels or {}).get(VERSION_LABEL) for crd in listed.items}


def classify(deployment: dict[str, Any]) -> Optional[Controller]:
    """An MPIJob controller by its name, labels and images; None for anything else."""
    meta, spec = deployment.get("metadata") or {}, deployment.get("spec") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    words = " ".join([meta.get("name", ""), *(meta.get("labels") or {}).values(),
                      *(c.get("image", "") for c in containers)]).lower()
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    ready = ((deployment.get("status") or {}).get("readyReplicas") or 0) >= 1
    if "mpi-operator" in words or "mpijob-controller" in words:
        return Controller("mpi-operator", where, ready)
    if "training-operator" in words:
        flags = [a for c in containers for a in (c.get("args") or []) + (c.get("command") or [])]
        schemes = [a.split("=", 1)[1].lower() for a in flags if a.startswith("--enable-scheme=")]
        return Controller("training-operator", where, ready, serves_mpijobs=not schemes or "mpijob" in schemes)
    return None


def _controllers(api_client: Any) -> Optional[list[Controller]]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        listed = client.AppsV1Api(api_client).list_deployment_for_all_namespaces(_preload_content=False)
    except ApiException as exc:
        log.info("preflight: Deployments not listable (%s)", exc.status)
        return None
    import json

    found = [classify(d) for d in json.loads(listed.data).get("items", [])]
    return [c for c in found if c is not None]


def _operators(api_client: Any) -> Optional[list[dict[str, Any]]]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    try:
        listed = apps.list_deployment_for_all_namespaces(label_selector=OPERATOR_SELECTOR)
    except ApiException:
        return None
    operators = []
    for deployment in listed.items:
        meta = deployment.metadata
        found = {"where": f"{meta.namespace}/{meta.name}", "ready": (deployment.status.ready_replicas or 0) >= 1,
                 "version": (meta.labels or {}).get(VERSION_LABEL), "health": "not asked"}
        if found["ready"]:
            found["health"] = _health(core, meta.namespace, deployment)
        operators.append(found)
    return operators


def _health(core: Any, namespace: str, deployment: Any) -> str:
    """The operator's liveness endpoint through the API server's pod proxy (what kubelet's probe sees)."""
    from kubernetes.client.rest import ApiException

    selector = ",".join(f"{k}={v}" for k, v in (deployment.spec.selector.match_labels or {}).items())
    try:
        pods = [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items
                if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        if not pods:
            return "not asked (no ready pod)"
        port = next((p.container_port for c in pods[0].spec.containers for p in c.ports or [] if p.name == "health"),
                    8080)
        answer = core.connect_get_namespaced_pod_proxy_with_path(f"{pods[0].metadata.name}:{port}", namespace,
                                                                 "healthz")
        return f"answered by {pods[0].metadata.name}: {str(answer)[:120]}"
    except ApiException as exc:
        return f"not reachable through the API server ({exc.status} {exc.reason})"


def run_at_start_up(api_client: Any) -> list[Check]:
    """The operator's own look (discovery and CRDs: its RBAC), each check logged; never raises."""
    try:
        checks = judge(gather(api_client, cluster_wide=False))
    except Exception as exc:  # a preflight must never keep the operator from starting
        log.warning("preflight could not run: %s", exc)
        return []
    for check in checks:
        log.log(logging.WARNING if check.problem else logging.INFO, "preflight %s: %s: %s", check.name, check.level,
                check.message)
    return checks
