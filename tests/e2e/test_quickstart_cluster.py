"""`scripts/quickstart.sh --cluster` in the e2e's cluster, as the README starts "In a cluster": with the images the
e2e built (--no-build), the operator the e2e installed and its MPIJob controller, small data and one epoch. The run
must succeed and print its summary and report; `--down` must leave the cluster as it found it, every ScalingRun
in it included (a run of someone else's is there throughout)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.environment import RELEASE, SYSTEM_NAMESPACE
from tests.support.e2e_runs import _name, run_body

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "scalingrun-quickstart-e2e"
# Cluster-wide and in every namespace: what the quick start could add or remove.
KINDS = ["namespaces", "customresourcedefinitions", "clusterroles", "clusterrolebindings",
         "deployments", "statefulsets", "services", "secrets", "roles", "rolebindings", "serviceaccounts",
         "scalingruns", "scalingsweeps"]


def inventory(cluster) -> set[str]:
    """Every object of KINDS (namespace/kind/name) that no other object owns, and the helm releases. An owned object
    (an earlier test's MPIJob's Secret and Service, say) goes with its owner, when the garbage collector gets to it:
    in a CI run that was during the quick start, and it is not the quick start's to keep or remove."""
    found = set()
    for kind in KINDS:
        listed = subprocess.run([*cluster.kubectl, "get", kind, "--all-namespaces", "-o", "json"], capture_output=True,
                                text=True, check=True).stdout
        for item in json.loads(listed)["items"]:
            meta = item["metadata"]
            if kind == "secrets" and item.get("type") == "kubernetes.io/service-account-token":
                continue  # the token controller's, made and removed with each ServiceAccount
            if meta.get("ownerReferences") or meta.get("deletionTimestamp"):
                continue
            found.add(f"{meta.get('namespace', '')}/{kind}/{meta['name']}")
    helm = Path(os.environ["SCALINGRUN_TOOLS"]) / "helm"
    releases = subprocess.run([str(helm), "--kubeconfig", cluster.kubeconfig, "list", "--all-namespaces", "-q"],
                              capture_output=True, text=True, check=True).stdout.split()
    return found | {f"helm/{release}" for release in releases}


def quickstart(cluster, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig,
           "PATH": f"{os.environ['SCALINGRUN_TOOLS']}:{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "scripts/quickstart.sh", "--cluster", "--namespace", NAMESPACE, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def bystander(cluster) -> str:
    """A ScalingRun of someone else's, in the e2e's namespace, that uses no CPU meanwhile: its preprocessing pod asks
    for more CPU than a node has, so it waits, unscheduled. --down must leave it (and every other run) in place."""
    name = _name("bystander")
    body = run_body(cluster, name, output=f"s3://scalingrun-e2e/runs/{name}/parquet")
    body["spec"]["dataset"]["preprocessing"]["resources"]["cpu"] = "64"
    cluster.create_run(body)
    return name


def test_the_cluster_quick_start_trains_reports_and_leaves_nothing_behind(cluster, tmp_path):
    other_run = bystander(cluster)
    try:
        quick_start_and_down(cluster, tmp_path)
    finally:
        cluster.delete_run(other_run)


def quick_start_and_down(cluster, tmp_path) -> None:
    before = inventory(cluster)
    assert f"{cluster.namespace}/scalingruns/" in " ".join(before)  # the bystander is counted
    assert f"helm/{RELEASE}" in before  # the e2e's operator: the quick start uses it and leaves it
    started = time.monotonic()
    result = quickstart(cluster, "--no-build", "--per-class", "20", "--max-epochs", "1", "--worker-cpu", "500m",
                        "--worker-memory", "2Gi", "--timeout", "900",
                        "--reports", str(tmp_path), timeout=1200)
    seconds = time.monotonic() - started
    print(f"cluster quick start: {seconds:.0f} s\n{result.stdout}\n{result.stderr[-4000:]}")
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    assert "== cluster quick start summary ==" in result.stdout
    assert "Succeeded" in result.stdout
    assert f"using the operator already installed (helm release {RELEASE} in {SYSTEM_NAMESPACE})" in result.stderr
    assert "MPIJobs served by" in result.stderr
    assert "200 Fashion-MNIST JPEGs" in result.stderr
    assert (tmp_path / "quickstart-report.png").stat().st_size > 0
    assert (tmp_path / "quickstart-report.md").read_text()
    during = inventory(cluster)
    assert {f"/namespaces/{NAMESPACE}", f"{NAMESPACE}/deployments/seaweedfs", f"{NAMESPACE}/services/seaweedfs",
            f"{NAMESPACE}/secrets/quickstart-s3"} <= during - before

    result = quickstart(cluster, "--down", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    after = inventory(cluster)
    assert after == before, f"added: {sorted(after - before)}; removed: {sorted(before - after)}"
    # A second --down finds nothing to remove.
    again = quickstart(cluster, "--down", timeout=120)
    assert again.returncode == 0 and "nothing to remove" in again.stderr
