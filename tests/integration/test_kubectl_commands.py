"""kubectl as people type it (issue 23, item 10), against a real API server with the generated CRDs.

Every `kubectl get|describe|explain` command that the README, docs/, the chart's NOTES and the examples show runs
as written (placeholders filled, `-n` added), then every name of each resource (singular, plural, short
name, kind, plural.group) with `get NAME`, `describe NAME` and `explain`, and the category. Each with
kubectl 1.33 (scripts/tools.sh) and, where KUBEBUILDER_ASSETS has one, the API server's own kubectl 1.20.
A category named like a resource broke `kubectl get scalingrun my-run` ("you must specify only one
resource"): kubectl expands a category before it resolves a resource.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client

from scalingrun_api import models
from tests.support.env import ROOT, require

pytestmark = pytest.mark.k8s

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "charts/scalingrun/templates/NOTES.txt",
             *sorted((ROOT / "examples").glob("**/*.yaml"))]
COMMAND = re.compile(r"kubectl (?:get|describe|explain) [^`#\n]*")
PLACEHOLDERS = {"<name>": "my-run"}
# Kinds the documents name that this test's API server does not serve by design: the Training Operator v1's
# MPIJob (docs/run-in-a-cluster.md, coexistence), where that operator is installed.
NOT_SERVED_HERE = {"mpijobs.v1.kubeflow.org"}
RUN_NAMES = {models.SINGULAR, models.PLURAL, *models.SHORT_NAMES, models.KIND}
SWEEP_NAMES = {models.SWEEP_SINGULAR, models.SWEEP_PLURAL, *models.SWEEP_SHORT_NAMES, models.SWEEP_KIND}
SPEC = {"storage": {"credentialsSecret": "s3-creds"},
        "dataset": {"source": "s3://bucket/raw", "output": "s3://bucket/parquet"}}


def documented_commands() -> list[str]:
    found: list[str] = []
    for path in DOCUMENTS:
        for match in COMMAND.findall(path.read_text()):
            command = match.strip()
            for placeholder, value in PLACEHOLDERS.items():
                command = command.replace(placeholder, value)
            if command not in found and not set(command.split()) & NOT_SERVED_HERE:
                found.append(command)
    return found


COMMANDS = documented_commands()


def generated_commands() -> list[str]:
    out = []
    for names, name in ((RUN_NAMES | {f"{models.PLURAL}.{models.GROUP}"}, "my-run"),
                        (SWEEP_NAMES | {f"{models.SWEEP_PLURAL}.{models.GROUP}"}, "flowers-sweep")):
        for resource in sorted(names):
            out += [f"kubectl get {resource}", f"kubectl get {resource} {name}", f"kubectl describe {resource} {name}"]
            if "." not in resource:  # explain reads dots as fields (a group goes in --api-version)
                out.append(f"kubectl explain {resource}.spec")
    return out + [f"kubectl get {','.join(models.CATEGORIES[1:])}", "kubectl get all"]


def test_the_documents_show_the_commands_this_test_knows():
    """The extraction works: the README's and NOTES' commands are among those found."""
    assert {"kubectl get srun -w", "kubectl describe srun my-run", "kubectl explain scalingrun.spec.training",
            "kubectl get ssweep flowers-sweep -o yaml"} <= set(COMMANDS), COMMANDS


def test_the_category_is_no_resource_name():
    for crd_names in (RUN_NAMES, SWEEP_NAMES):
        assert not {n.lower() for n in crd_names} & set(models.CATEGORIES)


def _kubectls() -> list[tuple[str, str]]:
    """(version label, binary): 1.33 from scripts/tools.sh, 1.20 from KUBEBUILDER_ASSETS when it has one."""
    found = []
    tools = subprocess.run(["bash", str(ROOT / "scripts/tools.sh")], capture_output=True, text=True)
    if tools.returncode == 0:
        found.append(("1.33", str(Path(tools.stdout.strip()) / "kubectl")))
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and Path(assets, "kubectl").exists():
        found.append(("1.20", str(Path(assets, "kubectl"))))
    return found


@pytest.fixture(scope="module")
def kubectls() -> list[tuple[str, str]]:
    found = _kubectls()
    require(any(label == "1.33" for label, _ in found), "kubectl 1.33 not available (scripts/tools.sh)")
    return found


@pytest.fixture(scope="module")
def objects(api_client, scalingrun_crd, scalingsweep_crd):
    """A namespace with the objects the documents name: runs my-run and flowers-auto-batch, the sweep
    flowers-sweep with one point."""
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    namespace = f"kubectl-{os.getpid()}"
    core.create_namespace({"metadata": {"name": namespace}})
    for name, labels in (("my-run", {}), ("flowers-auto-batch", {}),
                         ("flowers-sweep-w1", {"scalingrun.dev/sweep": "flowers-sweep"})):
        custom.create_namespaced_custom_object(models.GROUP, models.VERSION, namespace, models.PLURAL, {
            "apiVersion": models.API_VERSION, "kind": models.KIND,
            "metadata": {"name": name, "labels": labels}, "spec": copy.deepcopy(SPEC)})
    custom.create_namespaced_custom_object(models.GROUP, models.VERSION, namespace, models.SWEEP_PLURAL, {
        "apiVersion": models.API_VERSION, "kind": models.SWEEP_KIND, "metadata": {"name": "flowers-sweep"},
        "spec": {"workers": [1, 2], "template": copy.deepcopy(SPEC)}})
    yield namespace
    core.delete_namespace(namespace)


def run(binary: str, kubeconfig: str, namespace: str, command: str) -> tuple[int, str]:
    """The command as typed, with this kubectl, the test cluster and namespace; a watch (-w) is read for 5 s."""
    argv = [binary, "--kubeconfig", kubeconfig, "-n", namespace, *shlex.split(command)[1:]]
    watch = "-w" in argv
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=5 if watch else 60)
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        return 0, out
    return result.returncode, result.stdout + result.stderr


def _wait_for_openapi(binary: str, kubeconfig: str) -> None:
    """The API server publishes a new CRD's OpenAPI a few seconds after it is established."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if subprocess.run([binary, "--kubeconfig", kubeconfig, "explain", f"{models.SWEEP_SINGULAR}.spec"],
                          capture_output=True).returncode == 0:
            return
        time.sleep(1)


def check(command: str, code: int, out: str) -> None:
    """What the command must show: the objects it names, or the fields it explains."""
    assert code == 0, f"{command!r} failed: {out}"
    words = shlex.split(command)
    verb = words[1]
    if verb == "explain":
        assert "FIELDS:" in out or "FIELD:" in out, out
        return
    if any(w.startswith("jsonpath=") for w in words):
        return  # one status field, empty until an operator writes it: that the command runs is what is checked
    resource = words[2]
    ours = RUN_NAMES | SWEEP_NAMES | {"all", *models.CATEGORIES}
    if resource.split(".")[0] not in ours | {n.lower() for n in ours}:
        return  # another kind (`kubectl get nodes -L ...`): that the command runs is what is checked
    names = [w for w in words[3:] if not w.startswith("-") and "=" not in w and w != "yaml"]
    if verb == "describe":
        # a name describes that object; none describes every one of the kind in the namespace
        wanted = names[:1] or (["flowers-sweep"] if resource.split(".")[0] in {n.lower() for n in SWEEP_NAMES}
                               | SWEEP_NAMES else ["my-run", "flowers-auto-batch"])
        for name in wanted:
            assert re.search(rf"^Name:\s+{name}$", out, re.M), out
        return
    if names:
        assert names[0] in out, out
        if "-o" in words:
            kind = models.SWEEP_KIND if resource.split(".")[0] in {n.lower() for n in SWEEP_NAMES} else models.KIND
            assert f"kind: {kind}" in out and f"name: {names[0]}" in out, out
    elif "-l" in words:
        assert "flowers-sweep-w1" in out and "my-run" not in out, out
    elif resource in ("all", *models.CATEGORIES):
        assert "my-run" in out and "flowers-sweep" in out, out
    elif resource.split(".")[0] in {n.lower() for n in SWEEP_NAMES} | SWEEP_NAMES:
        assert "flowers-sweep" in out and "my-run" not in out, out
    else:
        assert "my-run" in out and "flowers-auto-batch" in out and "flowers-sweep " not in out, out


@pytest.mark.parametrize("source", ["documented", "generated"])
def test_kubectl_commands_as_people_type_them(kubectls, kubeconfig, objects, source):
    commands = COMMANDS if source == "documented" else generated_commands()
    failures = []
    for label, binary in kubectls:
        _wait_for_openapi(binary, kubeconfig)
        for command in commands:
            code, out = run(binary, kubeconfig, objects, command)
            try:
                check(command, code, out)
            except AssertionError as exc:
                failures.append(f"kubectl {label}: {command}: {str(exc)[:400]}")
    print(f"{len(commands)} {source} commands with kubectl {', '.join(label for label, _ in kubectls)}")
    assert not failures, "\n".join(failures)
