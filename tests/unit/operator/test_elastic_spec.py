"""An elastic run's range (spec.workers.minReplicas, resizeAfter): one set of rules for validate, admission and the
operator, and a sweep refuses it (a point measures one size)."""

from __future__ import annotations

import copy

import pytest

from scalingrun_api.models.run import DEFAULT_RESIZE_AFTER_SECONDS
from scalingrun_operator.schema.crd import build_crd
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun, parse_scalingsweep
from tests.support.specs import MINIMAL


def run_with(**workers) -> dict:
    doc = copy.deepcopy(MINIMAL)
    doc["spec"].setdefault("workers", {}).update(workers)
    return doc


def errors_of(doc) -> list[str]:
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingrun(doc)
    return [str(e) for e in caught.value.errors]


def test_a_run_without_min_replicas_is_not_elastic():
    workers = parse_scalingrun(run_with(replicas=4)).spec.workers
    assert (workers.elastic, workers.min_replicas, workers.resize_after) == (False, None, None)


def test_an_elastic_run_takes_its_range_and_bound():
    workers = parse_scalingrun(run_with(replicas=4, minReplicas=2)).spec.workers
    assert (workers.elastic, workers.min_replicas, workers.resize_after_seconds) == (True, 2, DEFAULT_RESIZE_AFTER_SECONDS)
    assert parse_scalingrun(run_with(replicas=4, minReplicas=4, resizeAfter="2m")).spec.workers.resize_after_seconds == 120
    assert parse_scalingrun(run_with(replicas=4, minReplicas=1, resizeAfter=0)).spec.workers.resize_after_seconds == 0


@pytest.mark.parametrize("workers, words", [
    ({"replicas": 2, "minReplicas": 3},
     "spec.workers.minReplicas: must be at most spec.workers.replicas (2, the most workers), got 3"),
    ({"replicas": 2, "minReplicas": 0}, "spec.workers.minReplicas: "),
    ({"replicas": 2, "minReplicas": "1"}, "spec.workers.minReplicas: "),
    ({"replicas": 2, "resizeAfter": 60},
     "spec.workers.resizeAfter: means something only for an elastic run: set spec.workers.minReplicas"),
    ({"replicas": 2, "minReplicas": 1, "resizeAfter": "5 minutes"}, "spec.workers.resizeAfter: "),
    ({"replicas": 2, "minReplicas": 1, "resizeAfter": -1}, "spec.workers.resizeAfter: "),
])
def test_a_bad_range_names_the_field(workers, words):
    messages = errors_of(run_with(**workers))
    assert any(m.startswith(words) for m in messages), messages


def test_the_crd_carries_the_fields_without_defaults():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    workers = schema["properties"]["spec"]["properties"]["workers"]["properties"]
    assert workers["minReplicas"]["minimum"] == 1 and "default" not in workers["minReplicas"]
    assert workers["resizeAfter"]["x-kubernetes-int-or-string"] and "default" not in workers["resizeAfter"]


@pytest.mark.parametrize("field, value", [("minReplicas", 1), ("resizeAfter", "1m")])
def test_a_sweep_refuses_an_elastic_template(field, value):
    template = copy.deepcopy(MINIMAL["spec"])
    template.setdefault("workers", {})[field] = value
    doc = {"apiVersion": MINIMAL["apiVersion"], "kind": "ScalingSweep", "metadata": {"name": "demo"},
           "spec": {"workers": [1, 2, 4], "template": template}}
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingsweep(doc)
    assert [e.path for e in caught.value.errors] == [f"spec.template.workers.{field}"]
    assert "fixed worker count" in caught.value.errors[0].message
