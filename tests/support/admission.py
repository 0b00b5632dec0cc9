"""The models' fields as the API server's admission sees them: each resource, its fields, their bounds and candidate
values."""

from __future__ import annotations

import copy
import enum
import functools
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import BaseModel

from scalingrun_operator.schema import crd as crd_module
from tests.support.apiserver import install_crd
from scalingrun_api import models
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun, parse_schema


BASE = {
    "apiVersion": models.API_VERSION,
    "kind": models.KIND,
    "metadata": {"name": "generated"},
    "spec": {
        "storage": {"credentialsSecret": "s3-creds"},
        "dataset": {"source": "s3://bucket/raw", "output": "s3://bucket/parquet"},
    },
}


# Strings tried in every string field: URIs, quantities, names, and ones no pattern should take.
STRINGS = ["a", "s3://bucket/data", "file:///data/x", "/data/x", "http://host.example:9000", "gs://b/w.h5",
           "imagenet", "none", "500m", "2Gi", "4", "1.5", "0", "0m", "-1", "1e3", "lots", "Bad_Name", "a b", ""]


# The API server's integers are int64: the edges, and just beyond them (a JSON number it reads as "number").
INT64_EDGES = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1]


# Whole numbers written as floats: integers to the API server only below 2^53.
WHOLE_FLOATS = [2.0**53 - 1, 2.0**53, 1e16, -(2.0**53)]


NOT_STRINGS = [5, 0, -1, 2.5, 2.0, True, False, ["a"], {"a": "b"}, *INT64_EDGES]


# \s is Unicode to pydantic's regexps (Rust) and ASCII to the API server's (RE2): these are spaces to one only.
UNICODE_SPACES = ["\u00a0", "\u2003", "\x0b"]


BOOLEAN_LOOKALIKES = ["yes", "no", "true", "false", "True", "on", 1, 0, 1.0, "1"]


def _bounds(metadata: list) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in metadata:
        for name in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern"):
            if getattr(item, name, None) is not None:
                found[name] = getattr(item, name)
        if hasattr(item, "metadata"):  # a FieldInfo inside Annotated[...]
            found.update(_bounds(item.metadata))
    return found


def _branches(annotation: Any, metadata: list) -> Iterator[tuple[Any, list]]:
    """The concrete types a field takes (Optional and unions flattened), each with its constraints."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        yield from _branches(inner, [*metadata, *extra])
    elif origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _branches(arg, metadata)
    else:
        yield annotation, metadata


def _numbers(bounds: dict[str, Any], step: float) -> list[Any]:
    values: list[Any] = [0, -1, 1, 7]
    for name in ("ge", "gt", "le", "lt"):
        if name in bounds:
            values += [bounds[name] - step, bounds[name], bounds[name] + step]
    return values


def value_candidates(annotation: Any, metadata: list) -> list[Any]:
    """Values for one field, valid and invalid alike: the test does not need to know which is which."""
    values: list[Any] = [None]
    for kind, meta in _branches(annotation, metadata):
        bounds = _bounds(meta)
        origin = typing.get_origin(kind)
        if kind is type(None):
            continue
        if kind is bool:
            values += [True, False, *BOOLEAN_LOOKALIKES]
        elif kind is int:
            values += [*_numbers(bounds, 1), *INT64_EDGES, *WHOLE_FLOATS, 2.0, 2.5, "4", "2.0", True, "x"]
        elif kind is float:
            numbers = _numbers(bounds, 0.5)
            values += [*numbers, *[float(n) for n in numbers if isinstance(n, int)], 0.5, "0.5", "1", True, "x"]
        elif kind is str:
            values += [*STRINGS, *NOT_STRINGS]
            if "pattern" in bounds:  # what the pattern takes, with a space inside that regexp engines disagree on
                valid = [v for v in STRINGS if re.fullmatch(bounds["pattern"], v)]
                values += [v[:len(v) // 2] + space + v[len(v) // 2:] for v in valid for space in UNICODE_SPACES]
            for name in ("min_length", "max_length"):
                if name in bounds:
                    values += ["x" * (bounds[name] + d) for d in (-1, 0, 1) if bounds[name] + d >= 0]
            values.append("x" * 300)
        elif typing.get_origin(kind) is None and isinstance(kind, type) and issubclass(kind, enum.Enum):
            members = [m.value for m in kind]
            values += [*members, *[m.upper() for m in members if m.upper() not in members], "NotAMember", 1, True]
        elif origin is typing.Literal:
            members = list(typing.get_args(kind))
            values += [*members, *[m.upper() for m in members if isinstance(m, str)], "not-a-member", 1, True]
        elif origin is dict:
            values += [{}, {"k": "v"}, {"k": ""}, {"k": 1}, {"k": True}, {"k": None}, "k=v", ["k"]]
        elif origin is list:
            values += [[], "x", 5, {"a": 1}, [5], ["x"]]
            item = typing.get_args(kind)[0] if typing.get_args(kind) else None
            if isinstance(item, type) and issubclass(item, enum.Enum):  # a list of members: one valid list
                values += [[next(iter(item)).value], [m.value for m in item]]
        elif _is_model(kind):
            values += [{}, "x", 5, [], True]
        else:
            pytest.fail(f"the generator knows no values for {kind!r}: teach it this type")
    unique: dict[str, Any] = {}  # keyed by JSON: 1 == 1.0 == True in Python; JSON (and the API server) tells them apart
    for value in values:
        unique.setdefault(json.dumps(value), value)
    return list(unique.values())


@dataclass
class Field:
    path: tuple  # keys and list indices from the document root
    annotation: Any
    metadata: list

    @property
    def dotted(self) -> str:
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out


def _is_model(kind: Any) -> bool:
    return typing.get_origin(kind) is None and isinstance(kind, type) and issubclass(kind, BaseModel)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    return [kind for kind, _ in _branches(annotation, []) if _is_model(kind)]


def _field_info(model: type[BaseModel], alias: str):
    return next(info for name, info in model.model_fields.items() if (info.alias or name) == alias)


def walk(model: type[BaseModel], path: tuple) -> Iterator[Field]:
    for name, info in model.model_fields.items():
        field_path = (*path, info.alias or name)
        yield Field(field_path, info.annotation, info.metadata)
        for sub in _models_in(info.annotation):
            yield from walk(sub, field_path)
        for kind, _ in _branches(info.annotation, []):
            if typing.get_origin(kind) is list:
                for item in typing.get_args(kind):
                    for sub in _models_in(item):
                        yield from walk(sub, (*field_path, 0))


def minimal(model: type[BaseModel]) -> dict[str, Any]:
    """The smallest object of a model that validate accepts: its required fields filled with generated values."""
    return copy.deepcopy(_minimal(model))


@functools.cache  # every generated document starts from it: computed once per model, handed out as copies
def _minimal(model: type[BaseModel]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if not info.is_required():
            continue
        sub = _models_in(info.annotation)
        if sub:
            body[info.alias or name] = minimal(sub[0])
            continue
        for value in value_candidates(info.annotation, info.metadata):
            try:
                model.__pydantic_validator__.validate_assignment(model.model_construct(), name, value)
            except Exception:
                continue
            body[info.alias or name] = value
            break
    return body


@dataclass
class Resource:
    """A resource of the API: a model with apiVersion, kind, metadata and spec, and the CRD crd.py builds."""

    model: type[BaseModel]
    crd: dict[str, Any]

    @property
    def spec_model(self) -> type[BaseModel]:
        return _models_in(self.model.model_fields["spec"].annotation)[0]

    @property
    def kind(self) -> str:
        return self.crd["spec"]["names"]["kind"]

    def base(self) -> dict[str, Any]:
        """A valid document: ScalingRun's passes the cross-field rules too; others are their minimal spec."""
        if self.model is models.ScalingRun:
            return copy.deepcopy(BASE)
        group, version = self.crd["spec"]["group"], self.crd["spec"]["versions"][0]["name"]
        return {"apiVersion": f"{group}/{version}", "kind": self.kind, "metadata": {"name": "generated"},
                "spec": minimal(self.spec_model)}

    def fields(self) -> list[Field]:
        meta = _models_in(self.model.model_fields["metadata"].annotation)
        names = [Field(("metadata", "name"), meta[0].model_fields["name"].annotation,
                       meta[0].model_fields["name"].metadata)] if meta and "name" in meta[0].model_fields else []
        return [*names, *walk(self.spec_model, ("spec",))]

    def create(self, api: client.CustomObjectsApi, namespace: str, doc: dict[str, Any]) -> tuple[bool, Any]:
        """A dry-run create: (admitted, the object or the API server's answer)."""
        try:
            created = api.create_namespaced_custom_object(
                self.crd["spec"]["group"], self.crd["spec"]["versions"][0]["name"], namespace,
                self.crd["spec"]["names"]["plural"], doc, dry_run="All")
        except ApiException as exc:
            assert exc.status in (400, 422), f"unexpected answer {exc.status}: {exc.body}"
            return False, exc.body
        return True, created

    def validate(self, doc: dict[str, Any]) -> tuple[bool, list[str]]:
        """(the schema part of validate accepts, the paths validate names). Cross-field rules are apart:
        they are beyond what the schema can say."""
        try:
            parse_schema(doc, self.model)
        except InvalidScalingRun as exc:
            return False, [e.path for e in exc.errors]
        if self.model is models.ScalingRun:
            try:
                parse_scalingrun(doc)
            except InvalidScalingRun as exc:
                return True, [e.path for e in exc.errors]
        return True, []

    def document(self, field: Field, value: Any, doc: "dict[str, Any] | None" = None) -> dict[str, Any]:
        """The base document (or doc, changed in place) with the field set to value; missing parents are
        created as their minimal object."""
        doc = self.base() if doc is None else doc
        node: Any = doc
        model: Any = None
        for depth, part in enumerate(field.path[:-1]):
            if depth == 0:
                model, node = (self.spec_model if part == "spec" else None), node[part]
            elif isinstance(part, int):
                while len(node) <= part:
                    node.append(minimal(model))
                node = node[part]
            else:
                annotation = _field_info(model, part).annotation
                model = (_models_in(annotation) or [m for kind, _ in _branches(annotation, [])
                                                    for item in typing.get_args(kind) for m in _models_in(item)])[0]
                if not isinstance(node.get(part), (dict, list)):
                    node[part] = [] if isinstance(field.path[depth + 1], int) else minimal(model)
                node = node[part]
        node[field.path[-1]] = value
        return doc


def _crds() -> list[dict[str, Any]]:
    """Every CRD api/crd.py builds (build_crd, and any other build_*crd* function without arguments)."""
    found: dict[str, dict[str, Any]] = {}
    for name, function in vars(crd_module).items():
        if name.startswith("build_") and "crd" in name and callable(function):
            try:
                built = function()
            except TypeError:
                continue
            for item in built if isinstance(built, list) else [built]:
                if isinstance(item, dict) and item.get("kind") == "CustomResourceDefinition":
                    found[item["metadata"]["name"]] = item
    return list(found.values())


def resources() -> list[Resource]:
    crds = {c["spec"]["names"]["kind"]: c for c in _crds()}
    out = []
    for model in vars(models).values():
        if _is_model(model) and {"api_version", "kind", "metadata", "spec"} <= set(model.model_fields):
            kind = typing.get_args(model.model_fields["kind"].annotation)[0]
            assert kind in crds, f"no CRD for {kind} among api/crd.py's build_*crd* functions"
            out.append(Resource(model, crds[kind]))
    assert models.ScalingRun in [r.model for r in out]
    return out


RESOURCES = resources()


@pytest.fixture
def installed(api_client, scalingrun_crd, request) -> Resource:
    """The resource given as the test's parameter, its CRD installed (replacing an older one)."""
    resource = request.param
    install_crd(api_client, resource.crd, replace=True)
    return resource


def _reason(body: Any) -> str:
    try:
        return json.loads(body)["message"][-160:]
    except Exception:
        return str(body)[-160:]
