"""Pod identity: spec.workers.serviceAccountName on every pod of a run, and spec.storage.credentials podIdentity
(s3:// without a Secret), held to one set of rules by validate, admission and the operator."""

from __future__ import annotations

import pytest

from scalingrun_operator import config
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun
from scalingrun_operator.builders import build_children
from scalingrun_operator.pull.store_source import StoreSources
from scalingrun_operator.decide.draft import store_of
from scalingrun_operator.pull.storage import StorageError
from tests.support.specs import run_document

POD_IDENTITY = {"credentials": "podIdentity", "credentialsSecret": None}
PULL = {"SCALINGRUN_PULL_DOCUMENTS": "true"}  # the operator reads stores in pull mode only


def _run(storage=None, workers=None):
    doc = run_document(storage=storage or {}, workers=workers or {})
    doc["spec"]["storage"] = {k: v for k, v in doc["spec"]["storage"].items() if v is not None}
    return parse_scalingrun(doc)


def _pod_specs(run):
    children = {child["kind"]: child for child in build_children(run, "ns")}
    specs = {"preprocess": children["Job"]["spec"]["template"]["spec"]}
    for role, replica in children["MPIJob"]["spec"]["mpiReplicaSpecs"].items():
        specs[role] = replica["template"]["spec"]
    return specs


def test_every_pod_of_the_run_runs_as_the_named_service_account():
    specs = _pod_specs(_run(POD_IDENTITY, {"serviceAccountName": "training"}))
    assert {role: spec.get("serviceAccountName") for role, spec in specs.items()} == {
        "preprocess": "training", "Launcher": "training", "Worker": "training"}
    # The IAM webhooks mount their own token: the Kubernetes API token stays unmounted.
    assert all(spec["automountServiceAccountToken"] is False for spec in specs.values())


def test_without_a_name_the_pods_keep_the_namespace_default():
    assert all("serviceAccountName" not in spec for spec in _pod_specs(_run()).values())


def test_pod_identity_gives_the_pods_no_key_variables():
    for spec in _pod_specs(_run(POD_IDENTITY, {"serviceAccountName": "training"})).values():
        names = {env["name"] for container in spec["containers"] for env in container.get("env", [])}
        assert "AWS_DEFAULT_REGION" in names
        assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def test_s3_without_a_secret_is_valid_with_pod_identity_and_names_both_ways_without():
    assert _run(POD_IDENTITY).spec.storage.credentials == "podIdentity"
    with pytest.raises(InvalidScalingRun) as caught:
        _run({"credentialsSecret": None})
    (message,) = [str(e) for e in caught.value.errors]
    assert message.startswith("spec.storage.credentialsSecret: required because s3://")
    assert "spec.storage.credentials: podIdentity" in message


@pytest.mark.parametrize("storage,workers,field,words", [
    ({"credentials": "podIdentity"}, {}, "spec.storage.credentialsSecret", "not used when spec.storage.credentials"),
    ({"credentials": "pod-identity"}, {}, "spec.storage.credentials", "'secret' or 'podIdentity'"),
    ({}, {"serviceAccountName": "Training_SA"}, "spec.workers.serviceAccountName", "must be a Kubernetes name"),
])
def test_bad_identity_settings_name_the_field(storage, workers, field, words):
    with pytest.raises(InvalidScalingRun) as caught:
        _run(storage, workers)
    messages = [str(e) for e in caught.value.errors]
    assert any(m.startswith(f"{field}: ") and words in m for m in messages), messages


def test_the_operator_reads_a_pod_identity_run_with_no_secret():
    store = store_of(_run(POD_IDENTITY))
    assert store.secret is None and store.pod_identity
    assert not store_of(_run()).pod_identity


def test_the_operator_refuses_pod_identity_reads_unless_its_setting_allows_them():
    assert config.load({}).pod_identity_reads is False
    assert config.load({"SCALINGRUN_POD_IDENTITY_READS": "true"}).pod_identity_reads is True
    store = store_of(_run(POD_IDENTITY))
    # Kube is not asked for anything: the refusal comes before any Secret would be read.
    refusing = StoreSources(None, config.load(PULL)).for_look("ns", "demo")  # type: ignore[arg-type]
    with pytest.raises(StorageError, match="operator.podIdentityReads"):
        refusing.target(store)
    settings = config.load({**PULL, "SCALINGRUN_POD_IDENTITY_READS": "true"})
    allowed = StoreSources(None, settings).for_look("ns", "demo")  # type: ignore[arg-type]
    assert allowed.target(store).credentials is None  # botocore's default chain: the operator's own identity
