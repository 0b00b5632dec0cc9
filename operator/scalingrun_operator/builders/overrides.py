"""spec.podOverrides applied to a rendered pod template (pure). Validation (schema/pod_overrides.py) has refused what
the operator owns and what two overrides give twice, so applying them in order only adds: the operator's labels,
variables, volumes and mounts stay first and unchanged, the overrides' follow in the spec's order."""

from __future__ import annotations

import copy
from typing import Any

from scalingrun_api.models import PodOverride, PodRole, ScalingRun, overrides_for


def _dump(items: list[Any]) -> list[Any]:
    return [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in items]


def override_tolerations(run: ScalingRun, role: PodRole) -> list[dict[str, Any]]:
    """The tolerations the overrides give ROLE's pods (the MPIJob adds the GPU and node-loss ones after them)."""
    return [t for _, o in overrides_for(run.spec.pod_overrides, role.value) for t in _dump(o.tolerations)]


def launcher_variables(run: ScalingRun) -> list[str]:
    """The variables the overrides give the launcher, by name: mpirun forwards them (-x) to every rank, which ssh
    starts without the worker pods' own environment."""
    return [var.name for _, o in overrides_for(run.spec.pod_overrides, PodRole.launcher.value) for var in o.env]


def apply_overrides(run: ScalingRun, role: PodRole, template: dict[str, Any]) -> dict[str, Any]:
    """TEMPLATE ({"metadata", "spec"} of a pod) with ROLE's overrides added; a new dict, TEMPLATE is left as it was.
    Tolerations are not added here: the caller merges them with its own (override_tolerations)."""
    chosen = [o for _, o in overrides_for(run.spec.pod_overrides, role.value)]
    out = copy.deepcopy(template)
    if not chosen:
        return out
    meta, spec = out.setdefault("metadata", {}), out["spec"]
    container = spec["containers"][0]
    for override in chosen:
        _add(override, meta, spec, container)
    meta["labels"] = {**meta.get("labels", {}), **template.get("metadata", {}).get("labels", {})}  # ours last
    return out


def _add(override: PodOverride, meta: dict[str, Any], spec: dict[str, Any], container: dict[str, Any]) -> None:
    if override.metadata.labels:
        meta.setdefault("labels", {}).update(override.metadata.labels)
    if override.metadata.annotations:
        meta.setdefault("annotations", {}).update(override.metadata.annotations)
    for key, items in (("volumes", copy.deepcopy(override.volumes)),
                       ("topologySpreadConstraints", copy.deepcopy(override.topology_spread_constraints))):
        if items:
            spec[key] = [*spec.get(key, []), *items]
    for key, items in (("volumeMounts", _dump(override.volume_mounts)), ("env", _dump(override.env)),
                       ("envFrom", _dump(override.env_from))):
        if items:
            container[key] = [*container.get(key, []), *items]
    if override.node_selector:
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **override.node_selector}
    if override.affinity is not None:
        spec["affinity"] = copy.deepcopy(override.affinity)
    if override.priority_class_name:
        spec["priorityClassName"] = override.priority_class_name
