"""The Helm chart: lint, render for several values files, validate every object against its schema."""

from __future__ import annotations

import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/scalingrun"
VALUES = [None, *sorted((CHART / "ci").glob("*-values.yaml"))]
K8S_SCHEMA_VERSION = "1.30.0"


@pytest.fixture(scope="session")
def helm() -> str:
    result = subprocess.run(["bash", str(ROOT / "scripts/tools.sh")], capture_output=True, text=True)
    require(result.returncode == 0, f"helm not available: {result.stderr[-500:]}")
    return str(Path(result.stdout.strip()) / "helm")


def render(helm: str, values: Path | None = None, *extra: str, release: str = "t") -> list[dict]:
    args = [helm, "template", release, str(CHART), "--namespace", "scalingrun-system", *extra]
    if values:
        args += ["-f", str(values)]
    result = subprocess.run(args, capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def crd_schemas() -> dict[tuple[str, str], dict]:
    schemas = {}
    for path in (ROOT / "manifests/crd").glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd and crd.get("kind") == "CustomResourceDefinition":
                for version in crd["spec"]["versions"]:
                    api = f"{crd['spec']['group']}/{version['name']}"
                    schemas[(api, crd["spec"]["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return schemas


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.name if v else "default")
def test_lint_strict(helm, values):
    args = [helm, "lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.name if v else "default")
def test_rendered_objects_are_valid(helm, values):
    schemas = crd_schemas()
    for obj in render(helm, values):
        key = (obj["apiVersion"], obj["kind"])
        if key in schemas:
            jsonschema.validate(obj, schemas[key])
        elif obj["apiVersion"] == "monitoring.coreos.com/v1":
            assert obj["spec"]["endpoints"][0]["port"] == "metrics"  # no schema shipped here for it
        else:
            kubernetes_validate.validate(obj, K8S_SCHEMA_VERSION, strict=True)


def test_operator_pod_is_locked_down(helm):
    deployment = next(o for o in render(helm) if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--all-namespaces" in container["args"] and "--peering=scalingrun" in container["args"]
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert container["image"].endswith(":" + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def test_namespaced_install_uses_roles_only(helm):
    objects = render(helm, CHART / "ci/namespaced-values.yaml")
    bindings = [o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert bindings == ["t-scalingrun-crd-watch"]  # only CRD list/watch is cluster-wide
    roles = [o for o in objects if o["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml-team-a", "ml-team-b"]
    assert sorted(o["metadata"]["namespace"] for o in objects if o["kind"] == "KopfPeering") == ["ml-team-a", "ml-team-b"]
    args = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=ml-team-a" in args and "--all-namespaces" not in args


def test_crd_kept_on_uninstall_and_optional(helm):
    crd = next(o for o in render(helm) if o["kind"] == "CustomResourceDefinition"
               and o["metadata"]["name"] == "scalingruns.scalingrun.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not [o for o in render(helm, CHART / "ci/standalone-values.yaml") if o["kind"] == "CustomResourceDefinition"]


@pytest.mark.parametrize("bad", [["--set", "replicaCount=2", "--set", "peering.name="],
                                 ["--set", "unknownKey=1"], ["--set", "operator.logFormat=xml"]])
def test_bad_values_are_refused(helm, bad):
    result = subprocess.run([helm, "template", "t", str(CHART), *bad], capture_output=True, text=True)
    assert result.returncode != 0 and result.stderr


def test_chart_versions_follow_the_project():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = next(line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines()
                   if line.startswith("version = "))
    assert chart["version"] == chart["appVersion"] == version


def test_kustomize_base_is_the_rendered_chart(helm):
    rendered = render(helm, None, "--set", "crds.enabled=false", release="scalingrun")
    base = [d for d in yaml.safe_load_all((ROOT / "manifests/base/scalingrun.yaml").read_text()) if d]
    assert base == rendered, "manifests/base is out of date: run scripts/generate.sh"
