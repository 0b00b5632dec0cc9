"""`scalingrun validate` equals admission (issue #15, item 2).

Specs are generated from the models: every field of every resource (a model with apiVersion, kind,
metadata and spec, whose CRD a build_*crd* function of schema/crd.py makes), walked generically so that
fields, sub-objects and resources added later are covered too, gets valid values and invalid variants (wrong types, numeric
strings, 'yes'/'true' for booleans, fractions for integers, negatives, zero, out-of-bound numbers,
too-long strings, values outside an enum, null). Each spec goes to `validate`'s parse and, as a dry-run
create, to a real kube-apiserver with the generated CRD: both must accept it or both reject it, and
validate's error must name the field.

What 1.20's schema cannot express is kept apart and checked for what it is:
- unknown fields: validate rejects them in any spelling, snake_case too, with the name meant (a typo must
  not silently become a default); the API server prunes them, so they never reach the operator;
- cross-field rules (validation.semantic_errors): validate and the operator reject, admission cannot.
"""

from __future__ import annotations

import copy
import enum
import types

import pytest
from kubernetes import client

from scalingrun_api import models
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun
from tests.support.image_refs import ACCEPTED, REFUSED
from tests.support.admission import (  # noqa: F401 (installed: a fixture)
    BASE, RESOURCES, _models_in, _reason, installed, minimal, resources, value_candidates,
)

pytestmark = pytest.mark.k8s


@pytest.mark.parametrize("installed", RESOURCES, ids=lambda r: r.kind, indirect=True)
def test_validate_and_admission_accept_and_reject_the_same_generated_specs(api_client, installed, namespace):
    resource, api = installed, client.CustomObjectsApi(api_client)
    fields = resource.fields()
    if resource.model is models.ScalingRun:
        assert {"spec.workers.cpu", "spec.workers.tolerations[0].effect", "spec.tracking.experimentName",
                "metadata.name"} <= {f.dotted for f in fields}
    disagreements: list[str] = []
    unnamed: list[str] = []
    tried = accepted = 0
    for field in fields:
        outcomes = set()
        for value in value_candidates(field.annotation, field.metadata):
            doc = resource.document(field, value)
            schema_ok, named = resource.validate(doc)
            server_ok, answer = resource.create(api, namespace, doc)
            tried += 1
            accepted += server_ok
            outcomes.add(server_ok)
            if schema_ok != server_ok:
                disagreements.append(f"{field.dotted}={value!r}: validate {'accepts' if schema_ok else 'rejects'}, "
                                     f"the API server {'accepts' if server_ok else 'rejects'}"
                                     + ("" if server_ok else f" ({_reason(answer)})"))
            elif not schema_ok and not any(_names(p, field.dotted) for p in named):
                unnamed.append(f"{field.dotted}={value!r}: validate names {named}")
        if len(outcomes) < 2 and not _models_in(field.annotation):
            disagreements.append(f"{field.dotted}: the generated values were all "
                                 f"{'accepted' if True in outcomes else 'rejected'}; generate better ones")
    print(f"{resource.kind}: {tried} generated specs over {len(fields)} fields, {accepted} admitted, "
          f"{len(disagreements)} disagreements")
    assert not disagreements, f"{len(disagreements)} of {tried} specs:\n" + "\n".join(disagreements)
    assert not unnamed, "\n".join(unnamed)


def _names(error_path: str, field: str) -> bool:
    """validate's error is about the field: the field itself, or a part of an object value set there."""
    return error_path == field or error_path.startswith(field + ".") or error_path.startswith(field + "[")


@pytest.mark.parametrize("installed", RESOURCES, ids=lambda r: r.kind, indirect=True)
def test_unknown_fields_are_rejected_by_validate_and_pruned_by_the_api_server(api_client, installed, namespace):
    """1.20 cannot reject an unknown field (strict field validation came with 1.25+): it prunes it. validate
    rejects it, naming it, so that a typo does not silently become a default."""
    resource, api = installed, client.CustomObjectsApi(api_client)
    objects = [f for f in resource.fields() if _models_in(f.annotation)]
    assert objects
    for field in objects:
        sub = _models_in(field.annotation)[0]
        doc = resource.document(field, {**minimal(sub), "unknownField": 1})
        _, named = resource.validate(doc)
        assert f"{field.dotted}.unknownField" in named, (field.dotted, named)
        server_ok, created = resource.create(api, namespace, doc)
        assert server_ok, (field.dotted, created)
        node = created
        for part in field.path:
            node = node[part]
        assert "unknownField" not in node, f"{field.dotted}: the API server kept an unknown field"


def test_cross_field_rules_are_validates_own(api_client, scalingrun_crd, namespace):
    """Rules between fields need CEL (1.25+): admission takes these specs, validate and the operator do not."""
    resource, api = next(r for r in RESOURCES if r.model is models.ScalingRun), client.CustomObjectsApi(api_client)
    cases = [
        (("spec", "storage", "credentialsSecret"), ..., "spec.storage.credentialsSecret"),
        (("spec", "dataset", "output"), "s3://bucket/raw/parquet", "spec.dataset.output"),
        (("spec", "runPolicy", "schedulingPolicy"), {"minAvailable": 5}, "spec.runPolicy.schedulingPolicy.minAvailable"),
        (("spec", "model"), {"builder": "mypkg.models:build", "base": "xception"}, "spec.model.base"),
        (("spec", "training"), {"command": ["python", "train.py"], "batchSizePerWorker": "auto"},
         "spec.training.batchSizePerWorker"),
        (("spec", "dataset"), {**BASE["spec"]["dataset"], "format": "parquet", "sampleFraction": 0.5},
         "spec.dataset.sampleFraction"),
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
        schema_ok, paths = resource.validate(doc)
        assert schema_ok and named in paths, (path, paths)
        assert resource.create(api, namespace, doc)[0], path


@pytest.mark.parametrize("section,value", [("model", {"builder": "mypkg.models:build", "params": {"width": 8}}),
                                           ("training", {"command": ["python", "-m", "mypkg.train"]})])
def test_a_builder_or_command_is_stored_without_the_builtin_networks_defaults(api_client, scalingrun_crd, namespace,
                                                                               section, value):
    """The CRD defaults no base, weights, trainableBase or dropout: a spec naming only a builder (or a command) is
    stored as written and passes validate, which fills those defaults only for the built-in network."""
    resource, api = next(r for r in RESOURCES if r.model is models.ScalingRun), client.CustomObjectsApi(api_client)
    doc = copy.deepcopy(BASE)
    doc["spec"][section] = value
    admitted, created = resource.create(api, namespace, doc)
    assert admitted, created
    stored_model = created["spec"]["model"]
    assert not {"base", "weights", "trainableBase", "dropout"} & set(stored_model), stored_model
    assert stored_model.get("params", {}) == value.get("params", {})
    run = parse_scalingrun({**doc, "spec": created["spec"]})
    assert run.spec.model.base is None
    plain = parse_scalingrun({**BASE, "spec": resource.create(api, namespace, copy.deepcopy(BASE))[1]["spec"]})
    assert (plain.spec.model.base, plain.spec.model.dropout) == ("efficientnet_lite0", 0.2)


@pytest.mark.parametrize("workers, named, says", [
    ({"gpus_per_worker": 0}, "spec.workers.gpus_per_worker", "write gpusPerWorker"),
    ({"replica": 2}, "spec.workers.replica", "did you mean replicas?"),
], ids=["snake-case", "near-miss"])
def test_a_spelling_the_api_server_drops_is_refused_by_validate_with_the_name_meant(api_client, scalingrun_crd,
                                                                                    namespace, workers, named, says):
    """Issue 41: `gpus_per_worker: 0` was validated as a CPU run, while the API server drops it and the run gets
    the default, 1 GPU. validate refuses it, with the name meant; the server (without strict field validation)
    stores the run without it."""
    resource, api = next(r for r in RESOURCES if r.model is models.ScalingRun), client.CustomObjectsApi(api_client)
    doc = copy.deepcopy(BASE)
    doc["spec"]["workers"] = workers
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingrun(doc)
    [error] = caught.value.errors
    assert error.path == named and says in error.message, error
    admitted, created = resource.create(api, namespace, doc)
    assert admitted, created
    assert set(workers).isdisjoint(created["spec"].get("workers") or {}), created["spec"]


def test_a_quantity_written_as_a_fraction_is_refused_by_both(api_client, scalingrun_crd, namespace):
    """`cpu: 0.5` is neither an integer nor a string to the API server; validate says what to write instead."""
    resource, api = next(r for r in RESOURCES if r.model is models.ScalingRun), client.CustomObjectsApi(api_client)
    doc = copy.deepcopy(BASE)
    doc["spec"]["workers"] = {"cpu": 0.5}
    schema_ok, named = resource.validate(doc)
    assert (schema_ok, named) == (False, ["spec.workers.cpu"])
    with pytest.raises(InvalidScalingRun, match='write "500m" \\(a quantity string\\)'):
        parse_scalingrun(doc)
    admitted, answer = resource.create(api, namespace, doc)
    assert not admitted, answer


def test_image_references_by_tag_or_digest_one_rule_for_validate_and_admission(api_client, scalingrun_crd,
                                                                                namespace):
    """spec.workers.image: the CRD's pattern and validate take the same references, digests too."""
    resource, api = next(r for r in RESOURCES if r.model is models.ScalingRun), client.CustomObjectsApi(api_client)
    outcomes = {}
    for image, wanted in [*((i, True) for i in ACCEPTED), *((i, False) for i in REFUSED)]:
        doc = copy.deepcopy(BASE)
        doc["spec"]["workers"] = {"image": image}
        schema_ok, named = resource.validate(doc)
        admitted, answer = resource.create(api, namespace, doc)
        outcomes[image] = (schema_ok, admitted)
        assert schema_ok == admitted == wanted, (image, named, answer)
        assert schema_ok or named == ["spec.workers.image"]
    assert len(outcomes) == len(ACCEPTED) + len(REFUSED)
