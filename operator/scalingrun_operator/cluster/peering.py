"""The kopf peering objects the operator needs, created by the operator itself before kopf starts.

kopf 1.45 with a peering name starts paused and resumes only when the watch of its (Cluster)KopfPeering
object delivers that object: when the object is missing, the operator pauses forever without a log
line, an Event or a failing probe (kopf/_core/reactor/orchestration.py, `is_preactivated`); when the
peering CRD is missing it pauses too. So the operator creates the object when it is missing (a 409
means a peer or an earlier start made it: fine), and when it cannot (no CRD, no namespace, no RBAC,
namespace patterns) it says why and exits non-zero instead of pausing. Running standalone instead is
not safe as a fallback: with more than one replica every one of them would act.
"""

from __future__ import annotations

import logging
from typing import Iterable

from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api.models import MANAGED_BY

log = logging.getLogger(__name__)

PEERING_GROUP, PEERING_VERSION = "kopf.dev", "v1"
CLUSTER_PLURAL, NAMESPACED_PLURAL = "clusterkopfpeerings", "kopfpeerings"
LABELS = MANAGED_BY
_PATTERN_CHARS = ("*", "?", "!", ",")


class PeeringError(RuntimeError):
    """The peering object is missing and cannot be created; the message says what to do."""


def is_pattern(namespace: str) -> bool:
    """kopf reads these as globs (`team-*`), negations (`!kube-system`) or lists, not as one namespace."""
    return any(char in namespace for char in _PATTERN_CHARS)


def _remedy(name: str) -> str:
    return (f"install kopf's peering CRDs (kubectl apply --server-side -f manifests/crd/kopf.dev_peerings.yaml; "
            f"neither the chart nor kustomize installs them), create the peering object {name!r} yourself, or run "
            "without --peering (a Lease elects the leader) or one replica with --standalone")


def _exists(custom: client.CustomObjectsApi, plural: str, name: str, namespace: str | None) -> bool:
    try:
        if namespace:
            custom.get_namespaced_custom_object(PEERING_GROUP, PEERING_VERSION, namespace, plural, name)
        else:
            custom.get_cluster_custom_object(PEERING_GROUP, PEERING_VERSION, plural, name)
    except ApiException:
        return False
    return True


def ensure_peering(api_client: client.ApiClient, name: str, namespaces: Iterable[str] = ()) -> list[str]:
    """Creates the ClusterKopfPeering (cluster-wide) or one KopfPeering per namespace when missing.

    Returns what it created, e.g. ["ClusterKopfPeering scalingrun"]; raises PeeringError otherwise.
    """
    namespaces = list(namespaces)
    patterns = [ns for ns in namespaces if is_pattern(ns)]
    if patterns:
        raise PeeringError(
            f"peering {name!r} cannot follow namespace patterns ({', '.join(patterns)}): kopf needs a KopfPeering "
            "in every namespace it serves, including ones created later. Name the namespaces, watch all of them "
            "(--all-namespaces), or run one replica with --standalone")
    custom = client.CustomObjectsApi(api_client)
    plural = NAMESPACED_PLURAL if namespaces else CLUSTER_PLURAL
    kind = "KopfPeering" if namespaces else "ClusterKopfPeering"
    try:
        served = {r.name for r in custom.get_api_resources(PEERING_GROUP, PEERING_VERSION).resources}
    except ApiException as exc:
        if exc.status != 404:
            raise PeeringError(f"cannot read the {PEERING_GROUP}/{PEERING_VERSION} API: {exc.status} {exc.reason}") from None
        served = set()
    if plural not in served:
        raise PeeringError(f"peering {name!r} needs the CRD {plural}.{PEERING_GROUP}, which is not installed: "
                           + _remedy(name))
    body = {"apiVersion": f"{PEERING_GROUP}/{PEERING_VERSION}", "kind": kind,
            "metadata": {"name": name, "labels": dict(LABELS)}}
    created = []
    for namespace in namespaces or [None]:
        where = f"{kind} {name}" + (f" in namespace {namespace}" if namespace else "")
        try:
            if namespace:
                custom.create_namespaced_custom_object(PEERING_GROUP, PEERING_VERSION, namespace, plural, body)
            else:
                custom.create_cluster_custom_object(PEERING_GROUP, PEERING_VERSION, plural, body)
        except ApiException as exc:
            if exc.status == 409:
                log.info("%s exists", where)
                continue
            if exc.status == 404 and namespace:
                raise PeeringError(f"cannot create {where}: the namespace does not exist. Create it, or stop "
                                   "watching it") from None
            if exc.status == 403 and _exists(custom, plural, name, namespace):
                log.info("%s exists (no permission to create it, none needed)", where)
                continue
            if exc.status == 403:
                raise PeeringError(f"cannot create {where}: forbidden. The operator's (Cluster)Role needs create "
                                   f"on {plural}.{PEERING_GROUP}, or " + _remedy(name)) from None
            raise PeeringError(f"cannot create {where}: {exc.status} {exc.reason}") from None
        log.info("created %s: kopf pauses without it", where)
        created.append(where)
    return created
