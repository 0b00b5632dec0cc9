"""The preflight's judgement over facts (cluster/preflight.py), without a cluster: which Deployment serves MPIJobs,
and what each combination of API and controllers is called. tests/integration/test_preflight.py gathers the facts
from a real API server."""

from __future__ import annotations

from scalingrun_operator.cluster.preflight import Controller, Facts, classify, judge


def deployment(name: str, image: str, args: list[str] | None = None, ready: int = 1) -> dict:
    return {"metadata": {"namespace": "ns", "name": name, "labels": {}},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image, "args": args or []}]}}},
            "status": {"readyReplicas": ready}}


def test_controllers_are_told_by_name_and_image_and_the_training_operators_schemes():
    assert classify(deployment("mpi-operator", "mpioperator/mpi-operator:0.8.2")) == Controller(
        "mpi-operator", "ns/mpi-operator", True)
    assert classify(deployment("web", "nginx")) is None
    default = classify(deployment("training-operator", "kubeflow/training-operator:v1-855e096", ready=0))
    assert default == Controller("training-operator", "ns/training-operator", False, serves_mpijobs=True)
    without = classify(deployment("training-operator", "kubeflow/training-operator:v1",
                                  ["--enable-scheme=tfjob", "--enable-scheme=pytorchjob"]))
    assert without.serves_mpijobs is False
    assert classify(deployment("to", "kubeflow/training-operator:v1", ["--enable-scheme=mpijob"])).serves_mpijobs


def levels(facts: Facts) -> dict[str, str]:
    return {check.name: check.level for check in judge(facts)}


def test_each_combination_gets_its_level():
    v2 = {"kubeflow.org": {"v2beta1": {"mpijobs"}}}
    v1 = {"kubeflow.org": {"v1": {"mpijobs", "tfjobs"}}}
    mpi = Controller("mpi-operator", "mpi-operator/mpi-operator", True)
    training = Controller("training-operator", "kubeflow/training-operator", True)
    ours = {"scalingruns.scalingrun.dev": "0.1.0", "scalingsweeps.scalingrun.dev": "0.1.0"}
    assert levels(Facts(groups=v2, controllers=[mpi], crd_versions=ours, version="0.1.0")) == {
        "mpijob-api": "ok", "mpijob-controller": "ok", "kueue": "info", "crd-version": "ok"}
    assert levels(Facts(groups=v1, controllers=[training], crd_versions=ours, version="0.1.0"))["mpijob-api"] == "error"
    assert levels(Facts(groups=v2, controllers=[mpi, training], crd_versions=ours, version="0.1.0"))[
        "mpijob-controller"] == "warning"
    unknown = levels(Facts(groups=v2, controllers=None, crd_versions=None, version="0.1.0"))  # the operator's RBAC
    assert (unknown["mpijob-controller"], unknown["crd-version"]) == ("unknown", "unknown")
    older = levels(Facts(groups=v2, controllers=[mpi], crd_versions={**ours, "scalingsweeps.scalingrun.dev": None},
                         version="0.1.0"))
    assert older["crd-version"] == "warning"
    assert "operator" not in unknown  # asked only with the user's credentials (doctor)
    assert levels(Facts(groups=v2, controllers=[mpi], crd_versions=ours, operators=[], version="0.1.0"))[
        "operator"] == "error"
