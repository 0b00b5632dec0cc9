"""The generated CRD on a real kube-apiserver: defaults, admission errors with field paths, columns."""

from __future__ import annotations

import copy
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api import models
from tests.support.admission import BASE

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {**copy.deepcopy(BASE), "metadata": {"name": "minimal"}}


def create(api_client, namespace, body, dry_run=False):
    api = client.CustomObjectsApi(api_client)
    plural = models.SWEEP_PLURAL if body.get("kind") == models.SWEEP_KIND else models.PLURAL
    return api.create_namespaced_custom_object(
        models.GROUP, models.VERSION, namespace, plural, body, dry_run="All" if dry_run else None)


def test_apiserver_applies_defaults(api_client, scalingrun_crd, namespace):
    created = create(api_client, namespace, MINIMAL)
    spec = created["spec"]
    assert spec["dataset"]["imageSize"] == 299
    assert spec["dataset"]["validationFraction"] == 0.1
    assert spec["dataset"]["preprocessing"]["parallelism"] == 4
    assert spec["training"]["batchSizePerWorker"] == 32
    assert spec["training"]["earlyStopping"]["restoreBestWeights"] is True
    assert spec["training"]["learningRateScaling"] == "linear"
    assert spec["workers"]["replicas"] == 1
    assert spec["runPolicy"]["cleanPodPolicy"] == "Running"
    assert spec["launcher"] == {"resources": {"cpu": "100m", "memory": "256Mi"}}
    assert "tracking" not in spec


def test_apiserver_defaults_launcher_resources_field_by_field(api_client, scalingrun_crd, namespace):
    body = copy.deepcopy(MINIMAL)
    body["spec"]["launcher"] = {"resources": {"cpu": 1}}
    assert create(api_client, namespace, body)["spec"]["launcher"]["resources"] == {"cpu": 1, "memory": "256Mi"}


def test_apiserver_admits_auto_batch_size_and_defaults_the_input_pipeline(api_client, scalingrun_crd, namespace):
    body = copy.deepcopy(MINIMAL)
    body["metadata"]["name"] = "auto-batch"
    body["spec"]["training"] = {"batchSizePerWorker": "auto"}
    training = create(api_client, namespace, body)["spec"]["training"]
    assert training["batchSizePerWorker"] == "auto"
    assert training["input"] == {"readerWorkers": 4, "rowGroupCache": 50}


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("**/*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_examples_are_admitted(api_client, scalingrun_crd, scalingsweep_crd, namespace, example):
    body = yaml.safe_load(example.read_text())
    assert create(api_client, namespace, body, dry_run=True)["metadata"]["name"] == body["metadata"]["name"]


def test_sweep_defaults_and_admission_errors_name_the_field(api_client, scalingsweep_crd, namespace):
    sweep = {"apiVersion": models.API_VERSION, "kind": models.SWEEP_KIND, "metadata": {"name": "sweep"},
             "spec": {"workers": [1, 2], "template": copy.deepcopy(MINIMAL["spec"])}}
    spec = create(api_client, namespace, sweep)["spec"]
    assert (spec["maxParallel"], spec["efficiencyThreshold"], spec["accuracyTolerance"]) == (1, 0.7, 0.01)
    assert spec["template"]["training"]["batchSizePerWorker"] == 32  # the template gets the run's defaults
    for change, field in (({"workers": [0]}, "spec.workers in body should be greater than or equal to 1"),
                          ({"workers": []}, "spec.workers"),
                          ({"maxParallel": 0}, "spec.maxParallel")):
        body = copy.deepcopy(sweep)
        body["metadata"]["name"] = "bad"
        body["spec"].update(change)
        with pytest.raises(ApiException) as caught:
            create(api_client, namespace, body, dry_run=True)
        assert caught.value.status == 422 and field in caught.value.body, caught.value.body


REJECTED = [
    (("training", "batchSizePerWorker"), 0, "spec.training.batchSizePerWorker"),
    (("training", "batchSizePerWorker"), 65537, "spec.training.batchSizePerWorker"),
    (("training", "batchSizePerWorker"), "32", "spec.training.batchSizePerWorker"),
    (("training", "batchSizePerWorker"), "Auto", "spec.training.batchSizePerWorker"),
    (("training", "input"), {"readerWorkers": 0}, "spec.training.input.readerWorkers"),
    (("training", "optimizer"), "adagrad", "spec.training.optimizer"),
    (("training", "learningRateScaling"), "cubic", "spec.training.learningRateScaling"),
    (("dataset", "validationFraction"), 1.0, "spec.dataset.validationFraction"),
    (("dataset", "validationFraction"), 0, "spec.dataset.validationFraction"),
    (("dataset", "sampleFraction"), 1.5, "spec.dataset.sampleFraction"),
    (("dataset", "imageSize"), 8, "spec.dataset.imageSize"),
    (("dataset", "source"), "bucket/raw", "spec.dataset.source"),
    (("model", "base"), "resnet9000", "spec.model.base"),
    (("model", "weights"), "imagenet21k", "spec.model.weights"),
    (("workers", "replicas"), 0, "spec.workers.replicas"),
    (("workers", "gpusPerWorker"), "two", "spec.workers.gpusPerWorker"),
    (("workers", "memory"), "lots", "spec.workers.memory"),
    (("launcher", "resources"), {"cpu": "lots"}, "spec.launcher.resources.cpu"),
    (("runPolicy", "cleanPodPolicy"), "Sometimes", "spec.runPolicy.cleanPodPolicy"),
    (("storage", "credentialsSecret"), "Bad_Name", "spec.storage.credentialsSecret"),
]


@pytest.mark.parametrize("path,value,field", REJECTED, ids=[f"{'.'.join(r[0])}={r[1]!r}" for r in REJECTED])
def test_invalid_objects_are_rejected_at_admission_with_field_path(api_client, scalingrun_crd, namespace,
                                                                    path, value, field):
    body = copy.deepcopy(MINIMAL)
    body["spec"].setdefault(path[0], {})[path[1]] = value
    with pytest.raises(ApiException) as caught:
        create(api_client, namespace, body)
    assert caught.value.status == 422
    assert field in caught.value.body


def test_missing_dataset_is_rejected(api_client, scalingrun_crd, namespace):
    body = copy.deepcopy(MINIMAL)
    del body["spec"]["dataset"]
    with pytest.raises(ApiException) as caught:
        create(api_client, namespace, body)
    assert caught.value.status == 422 and "spec.dataset" in caught.value.body


def test_kubectl_get_shows_printer_columns(api_client, scalingrun_crd, namespace, kubectl):
    create(api_client, namespace, MINIMAL)
    api = client.CustomObjectsApi(api_client)
    api.patch_namespaced_custom_object_status(
        models.GROUP, models.VERSION, namespace, models.PLURAL, "minimal",
        {"status": {"phase": "Training", "training": {"epoch": 3, "metrics": {"val_accuracy": 0.8},
                                                      "bestEpoch": 2, "bestMetrics": {"val_accuracy": 0.875}}}})
    out = subprocess.run([*kubectl, "get", "srun", "-n", namespace], capture_output=True, text=True, check=True).stdout
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "WORKERS", "EPOCH", "BEST-EPOCH", "VAL-ACCURACY", "AGE"]
    assert row.split()[:6] == ["minimal", "Training", "1", "3", "2", "0.875"], "the best epoch's, not the last"


def test_kubectl_explain_describes_training(scalingrun_crd, kubectl):
    # The apiserver publishes a new CRD's OpenAPI a few seconds after it is established.
    deadline = time.monotonic() + 60
    while True:
        out = subprocess.run([*kubectl, "explain", "scalingrun.spec.training"], capture_output=True, text=True)
        if out.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert out.returncode == 0, out.stderr
    assert "batchSizePerWorker" in out.stdout and "learning rate" in out.stdout.lower()
    out = subprocess.run([*kubectl, "explain", "scalingrun.spec.launcher.resources"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "Default cpu 100m, memory 256Mi" in " ".join(out.stdout.split())


@pytest.mark.parametrize("written, stored, meant", [("off", False, "off"), ("no", False, "off"), ("on", True, "auto"),
                                                    ('"off"', "off", "off"), ("auto", "auto", "auto")])
def test_feature_cache_as_yaml_reads_it_is_admitted_and_taken_as_meant(api_client, scalingrun_crd, namespace,
                                                                       kubectl, written, stored, meant):
    """kubectl's YAML parser (YAML 1.1, like PyYAML) reads an unquoted off as false: the CRD admits it and the
    operator's parse takes it as off."""
    from scalingrun_operator.schema.validation import parse_scalingrun

    name = f"cache-{written.strip(chr(34))}"
    text = yaml.safe_dump({**MINIMAL, "metadata": {"name": name}}) + f"  training:\n    featureCache: {written}\n"
    assert yaml.safe_load(text)["spec"]["training"]["featureCache"] == stored  # as PyYAML reads it too
    subprocess.run([*kubectl, "apply", "-n", namespace, "-f", "-"], input=text, capture_output=True, text=True,
                   check=True)
    api = client.CustomObjectsApi(api_client)
    body = api.get_namespaced_custom_object(models.GROUP, models.VERSION, namespace, models.PLURAL, name)
    assert body["spec"]["training"]["featureCache"] == stored
    assert parse_scalingrun(body).spec.training.feature_cache == meant


@pytest.mark.parametrize("value", ["maybe", 5, "yes", {"on": True}])
def test_feature_cache_other_values_are_refused_naming_the_field(api_client, scalingrun_crd, namespace, value):
    body = copy.deepcopy(MINIMAL)
    body["spec"]["training"] = {"featureCache": value}
    with pytest.raises(ApiException) as caught:
        create(api_client, namespace, body)
    assert caught.value.status == 422 and "spec.training.featureCache" in caught.value.body


def test_feature_cache_defaults_to_auto(api_client, scalingrun_crd, namespace):
    assert create(api_client, namespace, MINIMAL)["spec"]["training"]["featureCache"] == "auto"
