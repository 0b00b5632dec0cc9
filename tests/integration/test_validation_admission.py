"""`scalingrun validate` equals admission (issue #15, item 2).

Specs are generated from the models: every field of the ScalingRun (walked generically, so fields and
sub-objects added later are covered too) gets valid values and invalid variants (wrong types, numeric
strings, 'yes'/'true' for booleans, fractions for integers, negatives, zero, out-of-bound numbers,
too-long strings, values outside an enum, null). Each spec goes to `validate`'s parse and, as a dry-run
create, to a real kube-apiserver with the generated CRD: both must accept it or both reject it, and
validate's error must name the field.

What 1.20's schema cannot express is kept apart and checked for what it is:
- unknown fields: validate rejects them (a typo must not silently become a default); the API server
  prunes them, so they never reach the operator;
- cross-field rules (validation.semantic_errors): validate and the operator reject, admission cannot.
"""

from __future__ import annotations

import copy
import enum
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import BaseModel

from scalingrun_operator.api import models
from scalingrun_operator.api.validation import InvalidScalingRun, parse_scalingrun, parse_schema

pytestmark = pytest.mark.k8s

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
NOT_STRINGS = [5, 0, -1, 2.5, 2.0, True, False, ["a"], {"a": "b"}]
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
            values += [*_numbers(bounds, 1), 2.0, 2.5, "4", "2.0", True, "x"]
        elif kind is float:
            numbers = _numbers(bounds, 0.5)
            values += [*numbers, *[float(n) for n in numbers if isinstance(n, int)], 0.5, "0.5", "1", True, "x"]
        elif kind is str:
            values += [*STRINGS, *NOT_STRINGS]
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
            values += [{}, {"k": "v"}, {"k": 1}, {"k": True}, {"k": None}, "k=v", ["k"]]
        elif origin is list:
            values += [[], "x", 5, {"a": 1}, [5], ["x"]]
        elif _is_model(kind):
            values += [{}, "x", 5, [], True]
        else:
            pytest.fail(f"the generator knows no values for {kind!r}: teach it this type")
    unique: list[Any] = []
    for value in values:  # 1 == 1.0 == True in Python; JSON (and the API server) tells them apart
        if not any(json.dumps(value) == json.dumps(u) for u in unique):
            unique.append(value)
    return unique


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


def all_fields() -> list[Field]:
    name = models.ObjectMeta.model_fields["name"]
    return [Field(("metadata", "name"), name.annotation, name.metadata), *walk(models.ScalingRunSpec, ("spec",))]


def minimal(model: type[BaseModel]) -> dict[str, Any]:
    """The smallest object of a model that validate accepts: its required fields filled with generated values."""
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


def document(field: Field, value: Any) -> dict[str, Any]:
    """BASE with the field set to value; missing parents are created as their model's minimal object."""
    doc = copy.deepcopy(BASE)
    node: Any = doc
    model: Any = None
    for depth, part in enumerate(field.path[:-1]):
        nxt = field.path[depth + 1]
        if depth == 0:
            model = models.ScalingRunSpec if part == "spec" else None
            node = node[part]
            continue
        info = model.model_fields[next(n for n, i in model.model_fields.items() if (i.alias or n) == part)] \
            if isinstance(part, str) else None
        if isinstance(part, int):
            while len(node) <= part:
                node.append(minimal(model))
            node = node[part]
            continue
        sub = _models_in(info.annotation)
        if sub:
            model = sub[0]
        else:  # a list of models
            model = next(m for kind, _ in _branches(info.annotation, []) for item in typing.get_args(kind)
                         for m in _models_in(item))
        if not isinstance(node.get(part), (dict, list)):
            node[part] = [] if isinstance(nxt, int) else minimal(model)
        node = node[part]
    node[field.path[-1]] = value
    return doc


def validate_outcome(doc: dict[str, Any]) -> tuple[bool, list[str]]:
    """(schema accepts, paths validate names). Cross-field rules are apart: they are beyond the schema."""
    try:
        parse_schema(doc)
    except InvalidScalingRun as exc:
        return False, [e.path for e in exc.errors]
    try:
        parse_scalingrun(doc)
    except InvalidScalingRun as exc:
        return True, [e.path for e in exc.errors]
    return True, []


def admitted(api: client.CustomObjectsApi, namespace: str, doc: dict[str, Any]) -> tuple[bool, Any]:
    try:
        created = api.create_namespaced_custom_object(models.GROUP, models.VERSION, namespace, models.PLURAL,
                                                      doc, dry_run="All")
    except ApiException as exc:
        assert exc.status in (400, 422), f"unexpected answer {exc.status}: {exc.body}"
        return False, exc.body
    return True, created


def test_validate_and_admission_accept_and_reject_the_same_generated_specs(api_client, scalingrun_crd, namespace):
    api = client.CustomObjectsApi(api_client)
    fields = all_fields()
    assert {"spec.workers.cpu", "spec.workers.tolerations[0].effect", "spec.tracking.experimentName",
            "metadata.name"} <= {f.dotted for f in fields}
    disagreements: list[str] = []
    unnamed: list[str] = []
    tried = accepted = 0
    for field in fields:
        outcomes = set()
        for value in value_candidates(field.annotation, field.metadata):
            doc = document(field, value)
            schema_ok, named = validate_outcome(doc)
            server_ok, answer = admitted(api, namespace, doc)
            tried += 1
            accepted += server_ok
            outcomes.add(server_ok)
            if schema_ok != server_ok:
                disagreements.append(f"{field.dotted}={value!r}: validate {'accepts' if schema_ok else 'rejects'}, "
                                     f"the API server {'accepts' if server_ok else 'rejects'}"
                                     + ("" if server_ok else f" ({_reason(answer)})"))
            elif not schema_ok and not any(_names(p, field.dotted) for p in named):
                unnamed.append(f"{field.dotted}={value!r}: validate names {named}")
        if len(outcomes) < 2 and _models_in(field.annotation) == []:
            disagreements.append(f"{field.dotted}: the generated values were all "
                                 f"{'accepted' if True in outcomes else 'rejected'}; generate better ones")
    print(f"{tried} generated specs over {len(fields)} fields, {accepted} admitted, "
          f"{len(disagreements)} disagreements")
    assert not disagreements, f"{len(disagreements)} of {tried} specs:\n" + "\n".join(disagreements)
    assert not unnamed, "\n".join(unnamed)


def _names(error_path: str, field: str) -> bool:
    """validate's error is about the field: the field itself, or a part of an object value set there."""
    return error_path == field or error_path.startswith(field + ".") or error_path.startswith(field + "[")


def _reason(body: Any) -> str:
    try:
        return json.loads(body)["message"][-160:]
    except Exception:
        return str(body)[-160:]


def test_unknown_fields_are_rejected_by_validate_and_pruned_by_the_api_server(api_client, scalingrun_crd, namespace):
    """1.20 cannot reject an unknown field (strict field validation came with 1.25+): it prunes it. validate
    rejects it, naming it, so that a typo does not silently become a default."""
    api = client.CustomObjectsApi(api_client)
    objects = [f for f in all_fields() if _models_in(f.annotation)]
    assert objects
    for field in objects:
        sub = _models_in(field.annotation)[0]
        doc = document(field, {**minimal(sub), "unknownField": 1})
        _, named = validate_outcome(doc)
        assert f"{field.dotted}.unknownField" in named, (field.dotted, named)
        server_ok, created = admitted(api, namespace, doc)
        assert server_ok, (field.dotted, created)
        node = created
        for part in field.path:
            node = node[part]
        assert "unknownField" not in node, f"{field.dotted}: the API server kept an unknown field"


def test_cross_field_rules_are_validates_own(api_client, scalingrun_crd, namespace):
    """Rules between fields need CEL (1.25+): admission takes these specs, validate and the operator do not."""
    api = client.CustomObjectsApi(api_client)
    cases = [
        (("spec", "storage", "credentialsSecret"), ..., "spec.storage.credentialsSecret"),
        (("spec", "dataset", "output"), "s3://bucket/raw/parquet", "spec.dataset.output"),
        (("spec", "runPolicy", "schedulingPolicy"), {"minAvailable": 5}, "spec.runPolicy.schedulingPolicy.minAvailable"),
    ]
    for path, value, named in cases:
        doc = copy.deepcopy(BASE)
        node = doc
        for part in path[:-1]:
            node = node.setdefault(part, {})
        if value is ...:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        schema_ok, paths = validate_outcome(doc)
        assert schema_ok and named in paths, (path, paths)
        assert admitted(api, namespace, doc)[0], path
