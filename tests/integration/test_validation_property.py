"""`scalingrun validate` equals admission, property-based (issue 23, item 3).

Beside the enumerated parity test (test_validation_admission.py: each field alone, with values chosen at
its edges), Hypothesis changes one to three fields of a valid ScalingRun or ScalingSweep at once, with values
drawn from each field's type: integers across and beyond int64, any float JSON carries, text of any
Unicode (control characters, other scripts, whitespace that is not ASCII), strings made from the field's
own pattern and then spoiled, lists, objects and wrong types. Each spec goes to validate's parse and, as a
dry-run create, to a real kube-apiserver with the generated CRD; both must accept it or both reject it.
The cross-field rules (validation.semantic_errors) are validate's own, as in the enumerated test.

Deterministic (derandomize: the same specs in every run, so CI cannot pass by luck) and bounded:
SPECS_PER_RESOURCE examples for each resource, about a minute on the 2-core machine.
"""

from __future__ import annotations

import enum
import json
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from kubernetes import client

from scalingrun_operator.schema.validation import InvalidScalingRun, parse_schema
from tests.support.admission import (  # noqa: F401 (installed: a fixture)
    Field, RESOURCES, Resource, _bounds, _branches, _is_model, _reason, installed, minimal, value_candidates,
)

pytestmark = pytest.mark.k8s

SPECS_PER_RESOURCE = 400
INT64 = 2**63
# Any code point JSON can carry (no lone surrogates): ASCII, controls, Latin-1 and other scripts, Unicode spaces.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
EDGE_INTEGERS = [INT64 - 1, INT64, -INT64, -INT64 - 1, 2**53, 2**53 + 1, 2**64, 10**30]
INTEGERS = st.one_of(st.integers(-3, 2000), st.integers(-2 * INT64, 2 * INT64), st.sampled_from(EDGE_INTEGERS))
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
SCALARS = st.one_of(st.none(), st.booleans(), INTEGERS, FLOATS, TEXT)
JUNK = st.one_of(SCALARS, st.lists(SCALARS, max_size=2), st.dictionaries(TEXT, SCALARS, max_size=2))


# Characters where regexp engines differ, or that a pattern's edges must refuse: newlines, Unicode and ASCII
# spaces (\s is Unicode to pydantic's regexps, ASCII to the API server's), NUL, a letter outside ASCII.
SPOILERS = ["\n", " ", "\t", "\u00a0", "\u2003", "\u0085", "\x0b", "\x0c", "\x00", "\u00e9", "A", "/", ":"]


def _spoiled(valid: str) -> st.SearchStrategy[str]:
    """A string that matched the pattern with one character put in at any place, or in upper case."""
    inserted = st.builds(lambda at, extra: valid[:at] + extra + valid[at:],
                         st.integers(0, len(valid)), st.sampled_from(SPOILERS))
    return st.one_of(inserted, st.just(valid.upper()))


def _strings(bounds: dict[str, Any]) -> st.SearchStrategy[str]:
    options = [TEXT]
    if "pattern" in bounds:
        # from_regex follows Python's regex semantics; both servers and pydantic then judge the string.
        made = st.from_regex(bounds["pattern"], fullmatch=True)
        options += [made, made.flatmap(_spoiled)]
    if "max_length" in bounds:
        options.append(st.integers(max(0, bounds["max_length"] - 2), bounds["max_length"] + 2).map(lambda n: "a" * n))
    return st.one_of(options)


def field_values(field: Field) -> st.SearchStrategy[Any]:
    """Values for one field, from its type: the enumerated edge values and random ones of every kind."""
    options = [st.sampled_from(value_candidates(field.annotation, field.metadata)), JUNK]
    for kind, meta in _branches(field.annotation, field.metadata):
        origin = typing.get_origin(kind)
        if kind is int or kind is float:
            options += [INTEGERS, FLOATS]
        elif kind is str:
            options += [_strings(_bounds(meta)), INTEGERS]  # ints: quantities are int-or-string
        elif isinstance(kind, type) and not origin and issubclass(kind, enum.Enum):
            options.append(st.sampled_from([m.value for m in kind]).flatmap(_spoiled))
        elif origin is list:
            (item,) = typing.get_args(kind)
            inner = [minimal(m) for m, _ in _branches(item, []) if _is_model(m)]
            elements = st.one_of(st.sampled_from(inner), JUNK) if inner else st.one_of(
                INTEGERS, _strings(_bounds([m for _, meta in _branches(item, []) for m in meta])), JUNK)
            options.append(st.lists(elements, max_size=20))
        elif origin is dict:
            options.append(st.dictionaries(TEXT, st.one_of(TEXT, SCALARS), max_size=3))
        elif _is_model(kind):
            options.append(st.just(minimal(kind)))
    return st.one_of(options)


def _unrelated(fields: list[Field]) -> list[Field]:
    """Fields none of which lies inside another (setting a parent would replace its child)."""
    chosen: list[Field] = []
    for field in fields:
        if not any(field.path[:len(c.path)] == c.path or c.path[:len(field.path)] == field.path for c in chosen):
            chosen.append(field)
    return chosen


def changes(resource: Resource) -> st.SearchStrategy[list[tuple[Field, Any]]]:
    fields = resource.fields()
    return st.lists(st.sampled_from(fields), min_size=1, max_size=3).map(_unrelated).flatmap(
        lambda chosen: st.tuples(*[st.tuples(st.just(f), field_values(f)) for f in chosen]).map(list))


def only_unknown_fields(resource: Resource, doc: dict[str, Any]) -> bool:
    """validate refuses the document for unknown fields alone (what 1.20 prunes instead of refusing)."""
    try:
        parse_schema(doc, resource.model)
    except InvalidScalingRun as exc:
        return all(error.message.startswith("unknown field") for error in exc.errors)
    return False


@pytest.mark.parametrize("installed", RESOURCES, ids=lambda r: r.kind, indirect=True)
def test_validate_and_admission_agree_on_generated_specs(api_client, installed, namespace):
    resource, api = installed, client.CustomObjectsApi(api_client)
    disagreements: list[str] = []
    counts = {"specs": 0, "admitted": 0, "cross-field": 0, "unknown fields": 0}

    @settings(max_examples=SPECS_PER_RESOURCE, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(changes(resource))
    def agree(assignments: list[tuple[Field, Any]]) -> None:
        doc = resource.base()
        for field, value in assignments:
            resource.document(field, value, doc)
        json.dumps(doc, allow_nan=False)  # the generators make only what JSON carries
        schema_ok, named = resource.validate(doc)
        server_ok, answer = resource.create(api, namespace, doc)
        counts["specs"] += 1
        counts["admitted"] += server_ok
        counts["cross-field"] += schema_ok and bool(named)
        if not schema_ok and server_ok and only_unknown_fields(resource, doc):
            # The API server prunes unknown fields, validate names them: they agree on what is left, the
            # object the server admitted.
            counts["unknown fields"] += 1
            schema_ok = resource.validate(answer)[0]
        if schema_ok != server_ok:
            what = ", ".join(f"{f.dotted}={v!r}" for f, v in assignments)
            disagreements.append(f"{what}: validate {'accepts' if schema_ok else 'rejects'}, the API server "
                                 + ("accepts" if server_ok else f"rejects ({_reason(answer)})"))

    agree()
    print(f"{resource.kind}: {counts['specs']} generated specs, {counts['admitted']} admitted, "
          f"{counts['cross-field']} refused only by validate's cross-field rules, {counts['unknown fields']} with "
          f"unknown fields (pruned by the server), {len(disagreements)} disagreements")
    assert counts["specs"] >= SPECS_PER_RESOURCE * 0.9, counts
    assert 0.1 * counts["specs"] < counts["admitted"] < 0.9 * counts["specs"], f"valid and invalid alike: {counts}"
    assert not disagreements, f"{len(disagreements)} of {counts['specs']} specs:\n" + "\n".join(disagreements)

