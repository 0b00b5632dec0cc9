"""Install, upgrade and removal keep every ScalingRun (issue 41, item 8), with the README's helm commands:

- the e2e's release is uninstalled (the chart keeps its CRDs: crds.keep), and the previous release installed over the
  CRDs it left: its chart from git (tests/e2e/previous-release names the commit) and its operator image, built by
  scripts/e2e.sh from the same commit;
- a run started under it is in flight when `helm upgrade` brings this chart and operator: the CRDs are templates, so
  the upgrade applies them (the new fields are served at once), the operator pods roll, and the run keeps training
  (the same MPIJob and launcher, no interruption) to Succeeded. The previous release pulls; this chart's default is
  the push path, whose operator reads no store: the run's pods, made before it, never push, so it is never judged
  stalled, its status keeps the progress read before the upgrade, and it ends on its MPIJob (docs/install.md,
  "Upgrade"); progress.json in storage has every epoch;
- `helm uninstall` (as `scripts/quickstart.sh --cluster --down` removes a release it installed) and a new install
  leave the run in place, finished, and the CRDs with it.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.environment import (
    README_HELM_INSTALL, RELEASE, ROOT, SYSTEM_NAMESPACE, image_values, lease_values, push_values, status_push,
)
from tests.support.e2e_runs import (
    OPERATOR_PODS, RESUMED, _name, condition_texts, finished, launcher_attempt, launcher_log, phase, run_body,
    wait_for_launcher_line,
)
from tests.support.env import require

pytestmark = [pytest.mark.e2e, pytest.mark.k8s]

PREVIOUS_COMMIT = next(line.split("=", 1)[1] for line in (ROOT / "tests/e2e/previous-release").read_text().splitlines()
                       if line.startswith("commit="))
CRDS = ("scalingruns.scalingrun.dev", "scalingsweeps.scalingrun.dev")
NEW_WORKERS_FIELD = "sharedMemory"  # in this chart's ScalingRun CRD, not in the previous one's
# Enough epochs (1 to 5 s each from cached features, on 2 busy cores) to outlast the upgrade, which starts once the
# launcher runs; no early stopping before the last.
EPOCHS = 12


def helm(cluster, *args: str, timeout: float = 600) -> str:
    command = [str(Path(os.environ["SCALINGRUN_TOOLS"]) / "helm"), "--kubeconfig", cluster.kubeconfig, *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def previous_chart(tmp_path: Path) -> Path:
    """charts/scalingrun as of PREVIOUS_COMMIT, extracted from git."""
    found = subprocess.run(["git", "cat-file", "-e", f"{PREVIOUS_COMMIT}^{{commit}}"], cwd=ROOT, capture_output=True)
    require(found.returncode == 0, f"the upgrade test needs commit {PREVIOUS_COMMIT} (tests/e2e/previous-release) in "
            "this clone: git fetch --unshallow")
    archive = subprocess.run(["git", "archive", "--format=tar", PREVIOUS_COMMIT, "charts/scalingrun"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp_path)
    return tmp_path / "charts/scalingrun"


def every_run(cluster) -> dict[str, str]:
    """namespace/name -> uid of every ScalingRun in the cluster."""
    listed = cluster.custom().list_cluster_custom_object("scalingrun.dev", "v1alpha1", "scalingruns")["items"]
    return {f"{r['metadata']['namespace']}/{r['metadata']['name']}": r["metadata"]["uid"] for r in listed}


def crds(cluster) -> dict[str, Any]:
    from kubernetes import client

    ext = client.ApiextensionsV1Api(cluster.api)
    return {c.metadata.name: c for c in ext.list_custom_resource_definition().items if c.metadata.name in CRDS}


def served_workers_fields(cluster) -> set[str]:
    crd = crds(cluster)["scalingruns.scalingrun.dev"]
    schema = crd.spec.versions[0].schema.open_apiv3_schema
    return set(schema.properties["spec"].properties["workers"].properties)


def operator_images(cluster) -> set[str]:
    pods = cluster.core().list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=OPERATOR_PODS).items
    return {c.image for p in pods if p.metadata.deletion_timestamp is None for c in p.spec.containers}


def mpijob_uid(cluster, name: str) -> str:
    return cluster.custom().get_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.namespace, "mpijobs",
                                                         f"{name}-train")["metadata"]["uid"]


def stored_progress(cluster, run_location: str) -> dict[str, Any]:
    """The run's progress.json as its trainer wrote it (read with the runs' Secret, as a user would)."""
    import json

    with cluster.s3() as s3:
        return json.loads(s3.open_input_stream(f"{run_location}/progress.json").read())


def install_current(cluster) -> None:
    """The e2e's own operator as environment.install_operator installs it: the README's helm install."""
    helm(cluster, *README_HELM_INSTALL[1:], *image_values(os.environ["SCALINGRUN_E2E_OPERATOR_IMAGE"]),
         *push_values(), *lease_values(), "--wait", "--timeout", "5m")


def test_install_upgrade_with_a_run_in_flight_and_removal_keep_every_run(cluster, tmp_path):
    previous_image = os.environ.get("SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE", "")
    require(bool(previous_image), "SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE is not set: scripts/e2e.sh builds the "
            "previous release's operator (tests/e2e/previous-release)")
    current_image = os.environ["SCALINGRUN_E2E_OPERATOR_IMAGE"]
    chart = previous_chart(tmp_path)
    started = time.monotonic()
    name = _name("upgrade")
    released = False
    try:
        helm(cluster, "uninstall", RELEASE, "-n", SYSTEM_NAMESPACE, "--wait", "--timeout", "2m")
        released = True
        assert set(crds(cluster)) == set(CRDS), "helm uninstall keeps the CRDs (crds.keep)"
        runs = every_run(cluster)

        # The previous release, installed over the CRDs the current one left.
        helm(cluster, "install", RELEASE, str(chart), "-n", SYSTEM_NAMESPACE, *image_values(previous_image),
             "--wait", "--timeout", "5m")
        assert NEW_WORKERS_FIELD not in served_workers_fields(cluster), "the previous chart's CRD is served"
        assert operator_images(cluster) == {previous_image}
        assert every_run(cluster) == runs

        body = run_body(cluster, name, output=f"s3://scalingrun-e2e/runs/{name}/parquet", epochs=EPOCHS,
                        patience=EPOCHS)
        body["spec"]["dataset"]["imageSize"] = 32
        cluster.create_run(body)
        cluster.wait(name, lambda r: phase(r) == "Training", timeout=300, what="training")
        wait_for_launcher_line(cluster, name, "starting mpirun", timeout=300)  # in flight: the ranks start
        mpijob, attempt = mpijob_uid(cluster, name), launcher_attempt(cluster, name)
        runs = every_run(cluster)
        assert attempt[0], "the launcher runs"

        # helm upgrade to this chart and operator, the run in flight.
        upgrade_started = time.monotonic()
        helm(cluster, "upgrade", RELEASE, "charts/scalingrun", "-n", SYSTEM_NAMESPACE, *image_values(current_image),
             *push_values(), *lease_values(), "--wait", "--timeout", "5m")
        upgrade_seconds = time.monotonic() - upgrade_started
        assert NEW_WORKERS_FIELD in served_workers_fields(cluster), "helm upgrade applied the new CRD"
        deadline = time.monotonic() + 120
        while operator_images(cluster) != {current_image}:  # the old pods are going away
            assert time.monotonic() < deadline, operator_images(cluster)
            time.sleep(1)
        upgraded = cluster.get_run(name)
        epoch_at_upgrade = (upgraded["status"].get("training") or {}).get("epoch")
        print(f"helm upgrade --wait {upgrade_seconds:.0f} s; the new operator alone at epoch {epoch_at_upgrade} of "
              f"{EPOCHS}")
        assert phase(upgraded) == "Training", (f"the run ended before the upgrade did (raise EPOCHS): "
                                               f"{condition_texts(upgraded)}")
        run = cluster.wait(name, finished, timeout=600, what="Succeeded after the upgrade")
        assert mpijob_uid(cluster, name) == mpijob, "the MPIJob is the one the previous operator made"
        assert launcher_attempt(cluster, name)[0] in ("", attempt[0]), "the launcher was not started again"
        assert RESUMED not in launcher_log(cluster, name)
        training = run["status"]["training"]
        assert training.get("restarts", 0) == 0 and "Stalled" not in condition_texts(run), training
        if status_push():  # status keeps what was read before the upgrade; the trainer's record has every epoch
            assert (training.get("epoch") or 0) <= EPOCHS, training
            assert stored_progress(cluster, f"scalingrun-e2e/runs/{name}/parquet/runs/{name}")["epoch"] == EPOCHS
        else:
            assert training["epoch"] == EPOCHS, training
        assert every_run(cluster) == runs

        # Removal, then a new install: the runs and the CRDs stay, the finished run is left as it is.
        helm(cluster, "uninstall", RELEASE, "-n", SYSTEM_NAMESPACE, "--wait", "--timeout", "2m")
        assert set(crds(cluster)) == set(CRDS) and every_run(cluster) == runs
        install_current(cluster)
        released = False
        time.sleep(5)  # a few looks of the new operator at the finished run
        again = cluster.get_run(name)
        assert every_run(cluster) == runs and phase(again) == "Succeeded", condition_texts(again)
        kept = ("epoch", "processes", "metrics", "restarts", "bestEpoch")
        assert {k: again["status"]["training"].get(k) for k in kept} == {k: training.get(k) for k in kept}
        assert again["status"].get("modelUri") == run["status"].get("modelUri")
        print(f"install, upgrade in flight, removal: {time.monotonic() - started:.0f} s")
    finally:
        if released or operator_images(cluster) != {current_image}:  # the e2e's operator back for the next tests
            subprocess.run([str(Path(os.environ["SCALINGRUN_TOOLS"]) / "helm"), "--kubeconfig", cluster.kubeconfig,
                            "uninstall", RELEASE, "-n", SYSTEM_NAMESPACE, "--wait"], cwd=ROOT, capture_output=True)
            install_current(cluster)
        cluster.delete_run(name)
