"""The chart on shared clusters: images pinned by digest (one set of rules with validate and the operator), the
grants an adoption needs under OpenShift's OwnerReferencesPermissionEnforcement (chart and kustomize overlay), and
the namespaced install as docs/security.md lists it."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from scalingrun_api.models import common
from scalingrun_operator import config as config_module
from tests.support.chart import CHART, ROOT, helm, render  # noqa: F401 (fixtures)
from tests.support.image_refs import DIGEST
from tests.support.rbac import bound_rules, grants

RBAC = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
# What the operator of a namespaced install needs beyond its namespaces: cluster-scoped resources only.
CLUSTER_SCOPED_NEEDED = {("list", "", "namespaces"), ("watch", "", "namespaces"), ("get", "", "nodes"),
                         ("list", "", "nodes"), ("watch", "", "nodes"),
                         ("list", "apiextensions.k8s.io", "customresourcedefinitions"),
                         ("watch", "apiextensions.k8s.io", "customresourcedefinitions"),
                         ("create", "authentication.k8s.io", "tokenreviews")}  # the push path (the default)
ADOPTION_DELETES = {("delete", "", "configmaps"), ("delete", "batch", "jobs"), ("delete", "scalingrun.dev", "scalingruns")}
RESIZE_DELETE = ("delete", "kubeflow.org", "mpijobs")  # an elastic run's resize makes a new MPIJob: in every install


def _env(objects: list[dict]) -> dict[str, str]:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            if "value" in e}


def _operator_rules(objects: list[dict]) -> list[dict]:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return bound_rules(objects, deployment["spec"]["template"]["spec"]["serviceAccountName"], "scalingrun-system")


def _cluster_wide_rules(objects: list[dict]) -> list[dict]:
    """The rules of the ClusterRoles bound to the operator's ServiceAccount (not the users' aggregated roles)."""
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    return [rule for b in objects if b["kind"] == "ClusterRoleBinding" and any(s["name"] == account
                                                                                for s in b["subjects"])
            for rule in roles[b["roleRef"]["name"]]["rules"]]


# --- images by digest -------------------------------------------------------------------------------------------


def test_the_values_schema_takes_the_models_image_rules():
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    image, trainer = schema["image"]["properties"], schema["trainerImages"]["properties"]
    assert image["repository"]["pattern"] == trainer["repository"]["pattern"] == common.IMAGE_REPOSITORY_PATTERN
    assert image["tag"]["pattern"] == trainer["tag"]["pattern"] == common.OPTIONAL_TAG_PATTERN
    assert image["digest"]["pattern"] == common.OPTIONAL_DIGEST_PATTERN
    digests = trainer["digests"]
    assert set(digests["properties"]) == set(common.TRAINER_FLAVOURS) and digests["additionalProperties"] is False
    assert {p["pattern"] for p in digests["properties"].values()} == {common.DIGEST_PATTERN}


def test_images_pinned_by_digest_reach_the_operator_pod_and_its_settings(helm):
    objects = render(helm, None, "--set", f"image.digest={DIGEST}", "--set", f"trainerImages.digests.cpu={DIGEST}",
                     "--set", f"trainerImages.digests.lightning-gpu={DIGEST}")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(f":{common.IMAGE_VERSION}@{DIGEST}") and re.search(common.IMAGE_REFERENCE_PATTERN, image)
    env = _env(objects)
    settings = config_module.load({k: v for k, v in env.items() if k.startswith("SCALINGRUN_")})
    assert settings.trainer_image_digest_map() == {"cpu": DIGEST, "lightning-gpu": DIGEST}
    assert "SCALINGRUN_TRAINER_IMAGE_DIGESTS" not in _env(render(helm)), "no digests: the variable is left out"
    assert "@" not in next(o for o in render(helm) if o["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]["image"]


@pytest.mark.parametrize("bad", [["--set", "image.digest=sha256:abc"],
                                 ["--set", f"image.digest={DIGEST.upper()}"],
                                 ["--set", f"image.tag=0.1.0@{DIGEST}"],  # the digest has its own value
                                 ["--set", f"trainerImages.digests.tpu={DIGEST}"],
                                 ["--set", "trainerImages.digests.cpu=sha1:" + "0" * 40],
                                 ["--set", f"trainerImages.repository=ghcr.io/x/trainer@{DIGEST}"]])
def test_malformed_image_values_are_refused(helm, bad):
    result = subprocess.run([helm, "template", "t", str(CHART), *bad], capture_output=True, text=True)
    assert result.returncode != 0 and "values don't meet the specifications" in result.stderr, result.stderr


# --- adoption under OwnerReferencesPermissionEnforcement ----------------------------------------------------------


def test_the_openshift_profile_grants_what_the_plugin_asks_for_an_adoption(helm):
    """blockOwnerDeletion: update on the owners' finalizers (always); an ownerReferences change of an existing
    object (adoption): delete on it, only where the plugin runs, and in the runs' namespaces only."""
    finalizers = {("update", "scalingrun.dev", "scalingruns/finalizers"),
                  ("update", "scalingrun.dev", "scalingsweeps/finalizers")}
    # Not counted: the status ConfigMap's delete, by name (resourceNames) only, in every install.
    default = grants(r for r in _operator_rules(render(helm)) if not r.get("resourceNames"))
    assert finalizers <= default and not ADOPTION_DELETES & default and RESIZE_DELETE in default
    objects = render(helm, CHART / "ci/openshift-values.yaml")
    assert finalizers | ADOPTION_DELETES <= grants(_operator_rules(objects))
    assert not ADOPTION_DELETES & grants(_cluster_wide_rules(objects)), "Roles only"
    roles = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-operator")]
    assert [r["metadata"]["namespace"] for r in roles] == ["ml-team-a"]
    assert ADOPTION_DELETES <= grants(roles[0]["rules"])


def test_the_kustomize_openshift_overlay_grants_what_the_chart_does(helm):
    kubectl = str(ROOT / "scripts/tools.sh")
    tools = subprocess.run(["bash", kubectl], capture_output=True, text=True, check=True).stdout.strip()
    built = subprocess.run([f"{tools}/kubectl", "kustomize", str(ROOT / "manifests/overlays/openshift")],
                           capture_output=True, text=True, check=True).stdout
    overlay = next(o for o in yaml.safe_load_all(built) if o and o["kind"] == "ClusterRole"
                   and o["metadata"]["name"] == "scalingrun-operator")
    chart = next(o for o in render(helm, None, "--set", "crds.enabled=false", "--set",
                                   "rbac.ownerReferencesPermissionEnforcement=true", release="scalingrun")
                 if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "scalingrun-operator")
    assert grants(overlay["rules"]) == grants(chart["rules"])
    assert ADOPTION_DELETES <= grants(overlay["rules"])


# --- the namespaced install ---------------------------------------------------------------------------------------


def _documented_namespaced_objects() -> set[tuple[str, str, str]]:
    text = (ROOT / "docs/security.md").read_text()
    table = text[text.index("| Kind | Name | Namespace | Grants |"):].split("\n\n")[0].splitlines()[2:]
    rows = set()
    for row in table:
        kind, name, namespace = (cell.strip() for cell in row.strip("|").split("|")[:3])
        rows.add((kind, name, "" if namespace == "(cluster)" else namespace))
    return rows


def test_the_security_page_lists_exactly_the_rbac_of_a_namespaced_install(helm):
    objects = render(helm, CHART / "ci/namespaced-values.yaml", release="scalingrun")
    rendered = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", "")) for o in objects
                if o["kind"] in RBAC}
    assert _documented_namespaced_objects() == rendered


def test_a_namespaced_install_grants_nothing_namespaced_cluster_wide(helm):
    """Bound to the operator cluster-wide: the cluster-scoped reads it needs, nothing more; the namespaced rules are
    Roles in the watched namespaces; the aggregated user roles are bound to no one."""
    objects = render(helm, CHART / "ci/namespaced-values.yaml")
    assert grants(_cluster_wide_rules(objects)) == CLUSTER_SCOPED_NEEDED
    bound = {b["roleRef"]["name"] for b in objects if b["kind"] == "ClusterRoleBinding"}
    unbound = {o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole"} - bound
    assert unbound == {"t-scalingrun-edit", "t-scalingrun-view"}
    assert not [b for b in objects if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
                and b["roleRef"]["name"] in unbound]
    default = render(helm)
    everywhere = grants(_operator_rules(default))
    # The release namespace's own Roles (its Lease, its pod's label) are not the runs' namespaces' rules.
    release_only = grants([r for o in default if o["kind"] == "Role" for r in o["rules"]])
    namespaced = {g for g in everywhere if g not in CLUSTER_SCOPED_NEEDED and g not in release_only}
    for role in (o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-operator")):
        assert grants(role["rules"]) == namespaced, role["metadata"]["namespace"]


def test_the_release_prints_the_values_that_pin_every_image_by_digest(helm, tmp_path):
    """The release's pin job, run on digests as the image jobs keep them: its values are what the chart takes, and
    pin the operator and every trainer flavour."""
    workflow = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    kept = next(s for s in workflow["jobs"]["images"]["steps"] if s.get("name") == "Keep the digest")
    keys = {row["flavour"] or row["image"] for row in workflow["jobs"]["images"]["strategy"]["matrix"]["include"]}
    assert keys == {*common.TRAINER_FLAVOURS, "operator"} and "matrix.flavour || matrix.image" in kept["env"]["KEY"]
    script = next(s["run"] for s in workflow["jobs"]["pin"]["steps"] if "pin-values.yaml" in s.get("run", ""))
    (tmp_path / "digests").mkdir()
    digests = {key: "sha256:" + f"{n:x}" * 64 for n, key in enumerate(sorted(keys), start=1)}
    for key, digest in digests.items():
        (tmp_path / "digests" / key).write_text(digest + "\n")
    summary = tmp_path / "summary.md"
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, check=True, capture_output=True,
                   env={"GITHUB_STEP_SUMMARY": str(summary), "PATH": "/usr/bin:/bin"})
    assert "pin-values.yaml" not in summary.read_text() and digests["operator"] in summary.read_text()
    objects = render(helm, tmp_path / "pin-values.yaml")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith("@" + digests["operator"])
    settings = config_module.load({k: v for k, v in _env(objects).items() if k.startswith("SCALINGRUN_")})
    assert settings.trainer_image_digest_map() == {f: digests[f] for f in common.TRAINER_FLAVOURS}
