"""Generates the ScalingRun CRD (apiextensions.k8s.io/v1) from the pydantic models.

pydantic emits JSON Schema 2020-12; a CRD needs a *structural* OpenAPI v3.0 schema: no $ref, no
`title`, no `null` types, `exclusiveMinimum` as a boolean, int-or-string marked as such, and
`default: {}` on optional sub-objects so that the apiserver applies their nested defaults.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Any

import yaml
from pydantic import BaseModel

from scalingrun_api import models

# The label on both CRDs that says which release of scalingrun made them (`scalingrun doctor` and the operator's
# start-up compare it with their own: the version-skew check).
VERSION_LABEL = "app.kubernetes.io/version"


def project_version() -> str:
    """The installed scalingrun's version (pyproject.toml's), "unknown" when run from a source tree not installed."""
    try:
        return metadata.version("scalingrun")
    except metadata.PackageNotFoundError:
        return "unknown"


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Workers", "type": "integer", "jsonPath": ".spec.workers.replicas"},
    {"name": "Epoch", "type": "integer", "jsonPath": ".status.training.epoch"},
    {"name": "Best-Epoch", "type": "integer", "description": "the epoch whose weights the model keeps",
     "jsonPath": ".status.training.bestEpoch"},
    {"name": "Val-Accuracy", "type": "number", "description": "val_accuracy of the best epoch (the model's)",
     "jsonPath": ".status.training.bestMetrics.val_accuracy"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

SWEEP_PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Points", "type": "string", "description": "points finished / points", "jsonPath": ".status.progress"},
    {"name": "Recommended-Workers", "type": "integer", "jsonPath": ".status.recommendation.workers"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROPPED_KEYS = {"title", "$defs"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _resolve(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        # Keys beside $ref (description, default) refine the referenced schema.
        extra = {k: _resolve(v, defs) for k, v in node.items() if k != "$ref"}
        return {**target, **extra}
    return {k: _resolve(v, defs) for k, v in node.items() if k not in _DROPPED_KEYS}


def _structural(schema: dict[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    if "anyOf" in out:
        branches = [b for b in out.pop("anyOf") if b.get("type") != "null"]
        types = {b.get("type") for b in branches}
        if types == {"integer", "string"}:
            out["x-kubernetes-int-or-string"] = True
            for b in branches:  # minimum applies to the integers only, pattern to the strings only
                b = dict(b)
                words = [b.pop("const")] if "const" in b else b.pop("enum", None)
                if b.get("type") == "string" and words:  # an enum would refuse every integer
                    b["pattern"] = "^(" + "|".join(re.escape(w) for w in words) + ")$"
                out.update({k: v for k, v in b.items() if k != "type"})
        elif len(branches) == 1:
            if out.get("default", ...) is None:
                del out["default"]
            return _structural({**branches[0], **out})
        else:
            raise ValueError(f"cannot express anyOf {branches} in a structural schema")
    if "const" in out:
        out["enum"] = [out.pop("const")]
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(out.get(bound), (int, float)) and not isinstance(out.get(bound), bool):
            out["minimum" if bound == "exclusiveMinimum" else "maximum"] = out[bound]
            out[bound] = True
    if out.get("type") == "object" or "properties" in out:
        out["type"] = "object"
        props = {name: _structural(p) for name, p in out.get("properties", {}).items()}
        required = set(out.get("required", []))
        for name, prop in props.items():
            # An omitted sub-object with no required fields defaults to {} so its fields get defaults.
            if (
                name not in required
                and prop.get("type") == "object"
                and "properties" in prop
                and not prop.get("required")
                and "default" not in prop
                and not _is_nullable(schema["properties"][name])
            ):
                prop["default"] = {}
        if props:
            out["properties"] = props
        if isinstance(out.get("additionalProperties"), dict):
            out["additionalProperties"] = _structural(out["additionalProperties"])
        elif out.get("additionalProperties") is False:
            del out["additionalProperties"]  # structural schemas prune unknown fields instead
    if out.get("type") == "array" and "items" in out:
        out["items"] = _structural(out["items"])
    return out


def _is_nullable(schema: dict[str, Any]) -> bool:
    return any(b.get("type") == "null" for b in schema.get("anyOf", []))


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(_resolve(raw, raw.get("$defs", {})))


def _non_empty_strings(schema: dict[str, Any]) -> dict[str, Any]:
    """minLength 1 on every string of the spec: 1.20 rejects an empty string anyway ("must be of type string:
    null"), and so does `scalingrun validate`; said here, newer servers agree too."""
    if schema.get("type") == "string" and "enum" not in schema:
        schema.setdefault("minLength", 1)
    for prop in schema.get("properties", {}).values():
        _non_empty_strings(prop)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _non_empty_strings(schema[key])
    return schema


def metadata_schema() -> dict[str, Any]:
    """Only metadata.name can be constrained in a CRD: the run's name limits as the models have them."""
    name = models.ObjectMeta.model_json_schema()["properties"]["name"]
    return {"type": "object", "properties": {"name": {
        "type": "string", **{k: name[k] for k in ("minLength", "maxLength", "pattern") if k in name}}}}


def build_crd() -> dict[str, Any]:
    spec_schema = _non_empty_strings(openapi_schema(models.ScalingRunSpec))
    spec_schema["description"] = models.ScalingRunSpec.__doc__
    status_schema = openapi_schema(models.ScalingRunStatus)
    status_schema["description"] = models.ScalingRunStatus.__doc__
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{models.PLURAL}.{models.GROUP}",
            "labels": {"app.kubernetes.io/name": "scalingrun", "app.kubernetes.io/component": "crd",
                       VERSION_LABEL: project_version()},
        },
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": models.SHORT_NAMES,
                "categories": models.CATEGORIES,
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": models.ScalingRun.__doc__,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": metadata_schema(),
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    header = "# Generated from scalingrun_api.models by `scalingrun crd`. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


def render_chart_crd_template() -> str:
    """The CRD as a Helm template: installed when crds.enabled, kept on uninstall when crds.keep."""
    return _chart_template(build_crd())


def _chart_template(crd: dict[str, Any]) -> str:
    body = yaml.safe_dump(crd, sort_keys=False, width=100)
    head, rest = body.split("  labels:\n", 1)
    keep = (
        "  {{- if .Values.crds.keep }}\n"
        "  annotations:\n"
        "    helm.sh/resource-policy: keep\n"
        "  {{- end }}\n"
    )
    return (
        "{{- if .Values.crds.enabled }}\n"
        "# Generated from scalingrun_api.models by scripts/generate.sh. Do not edit.\n"
        + head + keep + "  labels:\n" + rest + "{{- end }}\n"
    )


def build_sweep_crd() -> dict[str, Any]:
    """The ScalingSweep CRD: the ScalingRun CRD's shape with the sweep's names, schema and columns."""
    import copy

    crd = copy.deepcopy(build_crd())
    crd["metadata"]["name"] = f"{models.SWEEP_PLURAL}.{models.GROUP}"
    crd["spec"]["names"].update(kind=models.SWEEP_KIND, listKind=f"{models.SWEEP_KIND}List",
                                plural=models.SWEEP_PLURAL, singular=models.SWEEP_SINGULAR,
                                shortNames=models.SWEEP_SHORT_NAMES)
    version = crd["spec"]["versions"][0]
    version["additionalPrinterColumns"] = SWEEP_PRINTER_COLUMNS
    root = version["schema"]["openAPIV3Schema"]
    root["description"] = models.ScalingSweep.__doc__
    for key, model in (("spec", models.ScalingSweepSpec), ("status", models.ScalingSweepStatus)):
        root["properties"][key] = openapi_schema(model)
        root["properties"][key]["description"] = model.__doc__
    return crd


def render_sweep_crd_yaml() -> str:
    header = "# Generated from scalingrun_api.models by `scalingrun crd`. Do not edit.\n"
    return header + yaml.safe_dump(build_sweep_crd(), sort_keys=False, width=100)


def render_chart_sweep_crd_template() -> str:
    """The ScalingSweep CRD as a Helm template, gated and kept like the ScalingRun CRD."""
    return _chart_template(build_sweep_crd())
