"""The cluster quick start's checks against a real API server of their own (no controllers): it says how to install
mpi-operator when the MPIJob CRD is missing, says that nothing serves MPIJobs when no controller is ready, names the
one that is; it never takes over a namespace it did not make, and `--down` with nothing to remove changes nothing."""

from __future__ import annotations

import copy
import json
import os
import time

import pytest
from tests.support.apiserver import kubectl_environment, install_crd, mpijob_crd_document

from scalingrun_demo.delivery import Kube, QuickstartError
from scalingrun_operator.builders.mpijob import MPI_OPERATOR_INSTALL
from scalingrun_demo.footprint import demo_namespace
from scalingrun_demo.quickstart import check_mpi_operator, main, mpijob_controllers


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    with kubectl_environment(tmp_path_factory.mktemp("quickstart-cluster")):
        yield Kube()


def deployment(name: str, namespace: str, labels: dict[str, str]) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace,
                                                                       "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "example.invalid/c:1"}]}}}}


def test_mpijob_crd_and_controller_are_checked_with_what_to_do(kube):
    with pytest.raises(QuickstartError, match="no MPIJob CRD") as missing:
        check_mpi_operator(kube, skip=False)
    assert MPI_OPERATOR_INSTALL in str(missing.value)

    from kubernetes import client, config

    api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    # The Training Operator v1's MPIJob (the same CRD name, kubeflow.org/v1 only): not taken for mpi-operator's.
    training_operators = copy.deepcopy(mpijob_crd_document())
    training_operators["spec"]["versions"] = [{"name": "v1", "served": True, "storage": True, "schema": {
        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]
    install_crd(api, training_operators)
    with pytest.raises(QuickstartError, match="serves v1, not v2beta1") as v1_only:
        check_mpi_operator(kube, skip=True)
    assert "run-in-a-cluster.md" in str(v1_only.value) and MPI_OPERATOR_INSTALL not in str(v1_only.value)
    client.ApiextensionsV1Api(api).delete_custom_resource_definition("mpijobs.kubeflow.org")
    wait_gone = time.monotonic() + 30
    while kube.get("crd", "mpijobs.kubeflow.org") is not None:
        assert time.monotonic() < wait_gone, "the v1 MPIJob CRD is not gone"
        time.sleep(0.2)

    install_crd(api, mpijob_crd_document())
    with pytest.raises(QuickstartError, match="no ready Deployment serves MPIJobs") as unserved:
        check_mpi_operator(kube, skip=False)
    assert "--skip-mpi-check" in str(unserved.value)
    check_mpi_operator(kube, skip=True)  # told to trust the user

    kube.kubectl("create", "namespace", "mpi-operator")
    kube.apply([deployment("mpi-operator", "mpi-operator", {"app": "mpi-operator"}),
                deployment("web", "mpi-operator", {"app": "web"})])
    with pytest.raises(QuickstartError, match="no ready Deployment"):  # there, not ready: still nothing serves
        check_mpi_operator(kube, skip=False)
    for name in ("mpi-operator", "web"):  # no controllers here: the status a ready Deployment would have
        kube.kubectl("patch", "deployment", name, "-n", "mpi-operator", "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": {"replicas": 1, "readyReplicas": 1}}))
    check_mpi_operator(kube, skip=False)
    assert mpijob_controllers(kube) == ["mpi-operator/mpi-operator"]  # "web" is ready too, and no MPIJob controller


def test_a_namespace_it_did_not_make_is_never_taken_over(kube, capsys):
    kube.kubectl("create", "namespace", "someone-elses")
    with pytest.raises(QuickstartError, match="did not make it"):
        demo_namespace(kube, "someone-elses")
    assert main(["--down", "--namespace", "someone-elses"]) == 1
    assert "did not make it" in capsys.readouterr().err
    assert kube.get("namespace", "someone-elses") is not None


def test_down_with_nothing_there_removes_nothing(kube, capsys):
    before = kube.kubectl("get", "namespaces", "-o", "name").stdout
    assert main(["--down", "--namespace", "never-made"]) == 0
    assert "nothing to remove" in capsys.readouterr().err
    assert kube.kubectl("get", "namespaces", "-o", "name").stdout == before
