"""The CRD step of an upgrade for installs without the chart's CRDs (docs/run-in-a-cluster.md, "Upgrade and removal"):
`scalingrun crd | kubectl apply --server-side --force-conflicts -f -` over the previous release's CRDs, created as
its manifests/crd were, on a real API server of the test's own. The chart's own path (its CRDs are templates, so
`helm upgrade` applies them) is tested on the node cluster: tests/e2e/test_upgrade.py."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from scalingrun_api import models
from tests.support.admission import BASE
from tests.support.apiserver import api_server
from tests.support.env import require

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_COMMIT = next(line.split("=", 1)[1] for line in (ROOT / "tests/e2e/previous-release").read_text().splitlines()
                       if line.startswith("commit="))
NEW_WORKERS_FIELD = "sharedMemory"  # in this version's ScalingRun CRD, not in the previous one's


def previous_manifest(name: str) -> str:
    found = subprocess.run(["git", "show", f"{PREVIOUS_COMMIT}:manifests/crd/{name}"], cwd=ROOT, capture_output=True,
                           text=True)
    require(found.returncode == 0, f"needs commit {PREVIOUS_COMMIT} (tests/e2e/previous-release) in this clone: "
            "git fetch --unshallow")
    return found.stdout


def workers_fields(kubectl: list[str]) -> set[str]:
    crd = json.loads(subprocess.run([*kubectl, "get", "crd", f"{models.PLURAL}.{models.GROUP}", "-o", "json"],
                                    capture_output=True, text=True, check=True).stdout)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return set(schema["properties"]["spec"]["properties"]["workers"]["properties"])


def test_the_crd_step_upgrades_crds_installed_without_the_chart_and_keeps_the_runs(tmp_path):
    require(bool(os.environ.get("KUBEBUILDER_ASSETS")), "needs KUBEBUILDER_ASSETS (an API server of its own)")
    binary = Path(os.environ["KUBEBUILDER_ASSETS"], "kubectl")
    binary = binary if binary.exists() else Path(shutil.which("kubectl") or "kubectl")
    with api_server(tmp_path / "cluster", controllers=False) as kubeconfig:
        kubectl = [str(binary), "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "cache")]

        def run(*args: str, input: str = "") -> subprocess.CompletedProcess:
            return subprocess.run([*kubectl, *args], input=input, capture_output=True, text=True, timeout=120)

        for name in ("scalingrun.dev_scalingruns.yaml", "scalingrun.dev_scalingsweeps.yaml"):
            created = run("create", "-f", "-", input=previous_manifest(name))
            assert created.returncode == 0, created.stderr
        assert run("wait", "--for=condition=Established", f"crd/{models.PLURAL}.{models.GROUP}",
                   "--timeout=60s").returncode == 0
        assert NEW_WORKERS_FIELD not in workers_fields(kubectl)

        body = {**copy.deepcopy(BASE), "metadata": {"name": "before-the-upgrade", "namespace": "default"}}
        created = run("create", "-f", "-", "-o", "jsonpath={.metadata.uid}", input=yaml.safe_dump(body))
        assert created.returncode == 0, created.stderr
        uid = created.stdout

        crds = subprocess.run([sys.executable, "-m", "scalingrun_operator.cli", "crd"], capture_output=True, text=True,
                              check=True).stdout
        # Without --force-conflicts the apply is refused: kubectl create's manager holds the fields it changes.
        refused = run("apply", "--server-side", "-f", "-", input=crds)
        assert refused.returncode != 0 and "conflict" in refused.stderr, refused.stdout + refused.stderr
        assert NEW_WORKERS_FIELD not in workers_fields(kubectl)
        applied = run("apply", "--server-side", "--force-conflicts", "-f", "-", input=crds)
        assert applied.returncode == 0, applied.stderr
        assert NEW_WORKERS_FIELD in workers_fields(kubectl), "the new CRD is served"
        # The run made under the old CRD is still there, the same object.
        assert run("get", models.PLURAL, "before-the-upgrade", "-n", "default", "-o",
                   "jsonpath={.metadata.uid}").stdout == uid
        # A new field is kept, not pruned; kubectl validates against the server's OpenAPI document, which the API
        # server republishes a moment after a CRD changes.
        body = copy.deepcopy(body)
        body["metadata"]["name"] = "after-the-upgrade"
        body["spec"]["workers"] = {**body["spec"].get("workers", {}), "memory": "4Gi", NEW_WORKERS_FIELD: "1Gi"}
        deadline = time.monotonic() + 60
        while True:
            created = run("create", "-f", "-", "-o", "jsonpath={.spec.workers.sharedMemory}",
                          input=yaml.safe_dump(body))
            if f'unknown field "{NEW_WORKERS_FIELD}"' not in created.stderr or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert created.returncode == 0 and created.stdout == "1Gi", created.stdout + created.stderr
