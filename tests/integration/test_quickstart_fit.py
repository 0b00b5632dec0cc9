"""The cluster quick start's two decisions taken before anything is built or installed, on a real API server of
its own (no controllers, no kubelet: the Nodes and the pods bound to them are written as a cluster would have them):
how the images reach the nodes, read from the Nodes, and which worker CPU fits, from `helm template` of the real
chart, the demo store and the run against the Nodes' allocatable and the bound pods' requests."""

from __future__ import annotations

import json
import os

import pytest
from tests.support.apiserver import kubectl_environment, install_crd, mpijob_crd_document

from scalingrun_demo.delivery import Kube, QuickstartError, cluster_nodes, image_route, machine_id
from scalingrun_demo.quickstart import main, parse_args, worker_cpu

# kind's control plane on its node, by its manifests: apiserver, controller-manager, etcd, scheduler, kindnet,
# coredns x 2.
CONTROL_PLANE = ["250m", "200m", "100m", "100m", "100m", "100m", "100m"]


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    with kubectl_environment(tmp_path_factory.mktemp("quickstart-fit")):
        yield Kube()


def add_node(kube: Kube, name: str, cpu: str, runtime: str, machine: str, address: str) -> None:
    kube.apply([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}])
    status = {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
              "capacity": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
              "nodeInfo": {"containerRuntimeVersion": runtime, "machineID": machine, "systemUUID": "x", "bootID": "x",
                           "kernelVersion": "6", "osImage": "Debian", "operatingSystem": "linux",
                           "architecture": "amd64", "kubeletVersion": "v1.20.2", "kubeProxyVersion": "v1.20.2"},
              "addresses": [{"type": "InternalIP", "address": address}]}
    kube.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))


def bind_pods(kube: Kube, node: str, cpus: list[str]) -> None:
    # No controllers here: the ServiceAccount the admission of a pod looks up is made by hand.
    kube.apply([{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": "default"}}])
    kube.apply([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"system-{node}-{i}", "namespace": "default"},
                 "spec": {"nodeName": node, "automountServiceAccountToken": False,
                          "containers": [{"name": "c", "image": "example.invalid/c:1",
                                                            "resources": {"requests": {"cpu": cpu}}}]}}
                for i, cpu in enumerate(cpus)])


def test_a_node_in_this_docker_shares_the_images_and_only_the_smallest_workers_fit_beside_kinds_control_plane(
        kube, capsys):
    add_node(kube, "here", "2", "docker://20.10.5", machine_id() or "no-machine-id", "127.0.0.1")
    bind_pods(kube, "here", CONTROL_PLANE)
    assert image_route(kube.context, "", cluster_nodes(kube)).how == "shared"

    assert worker_cpu(kube, parse_args([]), installs_chart=True) == "250m"
    said = capsys.readouterr().err
    assert "free: 1.05 CPU and 16Gi free on 1 node (2 CPU allocatable, 950m requested by the pods already there)" \
        in said
    assert "workers at 500m CPU: operator 2 x 100m + SeaweedFS 1 x 100m + max(preprocessing 2 x 500m, launcher " \
        "1 x 100m + workers 2 x 500m) = 1.4 CPU" in said and said.count("does not fit") == 2

    with pytest.raises(QuickstartError) as refused:
        worker_cpu(kube, parse_args(["--worker-cpu", "1"]), installs_chart=True)
    assert "nothing was installed" in str(refused.value) and "= 2.4 CPU" in str(refused.value)
    assert "--skip-capacity-check" in str(refused.value)
    assert worker_cpu(kube, parse_args(["--worker-cpu", "1", "--skip-capacity-check"]), installs_chart=True) == "1"
    # With the operator there already, its pods count among the requests, not again as the chart's.
    assert worker_cpu(kube, parse_args([]), installs_chart=False) == "250m"
    assert "operator" not in capsys.readouterr().err.split("workers at 250m CPU:")[1].split("\n")[0]


def test_a_node_elsewhere_stops_the_quick_start_before_anything_is_installed(kube, capsys):
    """A second node on another machine (an address not of this one, another machine ID): local images cannot
    reach it, so `up` stops naming both nodes, with nothing built, pushed or installed."""
    from kubernetes import config

    install_crd(config.new_client_from_config(config_file=os.environ["KUBECONFIG"]), mpijob_crd_document())
    add_node(kube, "elsewhere", "8", "containerd://1.7.13", "0" * 32, "192.0.2.10")
    before = kube.kubectl("get", "namespaces", "-o", "name").stdout
    assert main(["--skip-mpi-check", "--no-build", "--namespace", "fit-demo"]) == 1
    said = capsys.readouterr().err
    assert "the nodes of context" in said and "elsewhere (containerd://1.7.13, another machine)" in said
    assert "here (docker://20.10.5, this machine)" in said
    assert "Nothing was installed. Pass --registry REGISTRY/PREFIX" in said
    assert kube.kubectl("get", "namespaces", "-o", "name").stdout == before
    assert kube.helm("list", "--all-namespaces", "-q").stdout.strip() == ""
