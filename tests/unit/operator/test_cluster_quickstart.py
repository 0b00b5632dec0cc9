"""The cluster quick start's pure parts: the run it applies, the demo store it runs, what --down removes (the whole
of it runs in the e2e's cluster: tests/e2e/test_quickstart_cluster.py)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import kubernetes_validate
import pytest

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.common import trainer_image
from scalingrun_demo import seaweedfs
from scalingrun_demo.delivery import split_image
from scalingrun_demo.delivery import ROOT, Node, QuickstartError, image_route
from scalingrun_demo.footprint import ADDED, LABELS, NAMESPACE, OPERATOR_CRDS, OWNED, RUN_NAME, SECRET
from scalingrun_demo.quickstart import kept_by_release, parse_args, run_document, up
from scalingrun_demo.teardown import down, down_plan
from scalingrun_api.models import DEFAULT_TRAINER_IMAGE


def test_the_run_is_the_examples_quickstart_on_the_demo_store():
    run = parse_scalingrun(run_document("demo", None, 1, "500m", "2Gi"))
    assert run.metadata.name == "quickstart" and run.metadata.namespace == "demo"
    assert run.spec.storage.endpoint == "http://seaweedfs.demo.svc:8333" == seaweedfs.endpoint("demo")
    assert run.spec.storage.credentials_secret == SECRET
    assert run.spec.workers.replicas == 2 and run.spec.workers.gpus_per_worker == 0
    assert (run.spec.workers.cpu, run.spec.workers.memory, run.spec.training.max_epochs) == ("500m", "2Gi", 1)
    assert trainer_image(run) == DEFAULT_TRAINER_IMAGE  # the default: the name build-images.sh builds
    pushed = parse_scalingrun(run_document("demo", "registry.example.com/ml/trainer:0.1.0-cpu", None, "1", "4Gi"))
    assert trainer_image(pushed) == "registry.example.com/ml/trainer:0.1.0-cpu"
    assert pushed.spec.training.max_epochs == 10  # the example's


def test_the_demo_store_is_a_valid_deployment_said_to_be_for_the_demo():
    objects = seaweedfs.demo_manifests("demo", seaweedfs.IMAGE, SECRET, "key", "secret", LABELS)
    for obj in objects:
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert "demo" in deployment["metadata"]["annotations"]["scalingrun.dev/note"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False  # weed reads S3_PORT=tcp://... as a flag otherwise
    assert {"emptyDir": {"sizeLimit": "4Gi"}, "name": "data-root"} in pod["volumes"]
    assert pod["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"} == {SECRET, seaweedfs.IDENTITIES_SECRET}


@pytest.mark.parametrize("image, parts", [("ghcr.io/scalingrun/operator:0.1.0", ("ghcr.io/scalingrun/operator", "0.1.0")),
                                          ("localhost:5000/operator", ("localhost:5000/operator", "")),
                                          ("localhost:5000/operator:1", ("localhost:5000/operator", "1"))])
def test_images_split_into_repository_and_tag(image, parts):
    assert split_image(image) == parts


def test_the_defaults_are_the_readmes():
    args = parse_args([])
    assert (args.namespace, args.per_class, args.worker_cpu, args.down, args.no_build) == \
        ("scalingrun-quickstart", 1000, None, False, False)  # None: the first of WORKER_CPUS that fits


INSTALLED = {"release": "scalingrun", "releaseNamespace": "scalingrun-system", "crds": list(OPERATOR_CRDS),
             "createdNamespace": True}


class FakeKube:
    """kubectl and helm as --down calls them: what `get` finds, and every command it ran."""

    def __init__(self, added: dict, runs: list[tuple[str, str, str]]):
        self.context, self.commands = "test", []
        self.namespace = {"metadata": {"name": NAMESPACE, "labels": {OWNED: "true"},
                                       "annotations": {ADDED: json.dumps(added)}}}
        self.runs = runs  # (namespace, kind, name)

    def get(self, *args: str):
        if args[0] == "namespace":
            return self.namespace
        if args[0] == "crd":
            return {"metadata": {"name": args[1]}}
        return {"items": [{"kind": kind, "metadata": {"name": name}} for namespace, kind, name in self.runs
                          if namespace == args[2]]}

    def kubectl(self, *args: str, **_):
        self.commands.append(("kubectl", *args))

    def helm(self, *args: str, **_):
        self.commands.append(("helm", *args))


@pytest.mark.parametrize("added", [{}, INSTALLED], ids=["operator-was-there", "operator-installed"])
def test_down_never_deletes_a_crd_and_says_it_keeps_them(capsys, added):
    kube = FakeKube(added, [(NAMESPACE, "ScalingRun", RUN_NAME), ("team-a", "ScalingRun", "resnet")])
    assert down(parse_args(["--down"]), kube) == 0
    assert not [c for c in kube.commands if "crd" in c or "customresourcedefinition" in c], kube.commands
    expected = [("kubectl", "delete", "namespace", NAMESPACE, "--wait=true", "--timeout=300s")]
    if added:
        expected += [("helm", "uninstall", "scalingrun", "-n", "scalingrun-system", "--wait", "--timeout", "2m"),
                     ("kubectl", "delete", "namespace", "scalingrun-system", "--ignore-not-found", "--wait=true",
                      "--timeout=300s")]
    assert kube.commands == expected
    err = capsys.readouterr().err
    assert "left in place:" in err and "the images, in Docker" in err
    crds_kept = ("the CRDs (scalingruns.scalingrun.dev scalingsweeps.scalingrun.dev): deleting a CRD deletes every "
                 "ScalingRun and ScalingSweep in every namespace")
    assert (crds_kept in err) == bool(added)


def test_down_refuses_a_demo_namespace_holding_someone_elses_runs():
    others = {NAMESPACE: ["ScalingSweep/mine"]}
    with pytest.raises(QuickstartError, match=f"namespace {NAMESPACE} holds ScalingSweep/mine, which the quick "
                       "start did not make"):
        down_plan(NAMESPACE, INSTALLED, others)
    kube = FakeKube(INSTALLED, [(NAMESPACE, "ScalingSweep", "mine")])
    with pytest.raises(QuickstartError):
        down(parse_args(["--down"]), kube)
    assert kube.commands == []  # nothing deleted


def test_down_leaves_the_release_namespace_when_it_holds_runs():
    steps, left = down_plan(NAMESPACE, INSTALLED, {"scalingrun-system": ["ScalingRun/x"]})
    assert [s.args[:3] for s in steps] == [("delete", "namespace", NAMESPACE), ("uninstall", "scalingrun", "-n")]
    assert left[0] == "namespace scalingrun-system: it holds ScalingRun/x"


def test_crds_the_release_left_are_installed_again_not_taken_for_another_operator():
    left = {"metadata": {"annotations": {"meta.helm.sh/release-name": "scalingrun",
                                         "meta.helm.sh/release-namespace": "scalingrun-system"}}}
    assert kept_by_release(left)
    assert not kept_by_release({"metadata": {"annotations": {"meta.helm.sh/release-name": "other"}}})
    assert not kept_by_release({"metadata": {}})


# --- how the images reach the nodes, decided before anything is built or installed -------------------------------

REMOTE = [Node("gke-pool-1-abc", "containerd://1.7.13", False), Node("gke-pool-1-def", "containerd://1.7.13", False)]


@pytest.mark.parametrize("context, registry, nodes, how", [
    ("gke_project_zone_prod", "registry.example.com/ml", REMOTE, "push"),  # a registry always wins
    ("kind-demo", "", [], "load"), ("k3d-demo", "", [], "load"), ("minikube", "", [], "load"),
    ("local", "", [Node("node-1", "docker://20.10.5", True)], "shared"),  # a node on this machine's Docker
    ("docker-desktop", "", [Node("docker-desktop", "docker://27.1.1", False)], "shared"),
])
def test_images_reach_the_nodes_by_the_one_route_that_works(context, registry, nodes, how):
    assert image_route(context, registry, nodes).how == how


@pytest.mark.parametrize("context, nodes", [
    ("gke_project_zone_prod", REMOTE),  # a cloud cluster: it would end in ImagePullBackOff
    ("local", [Node("node-1", "containerd://1.7.13", True)]),  # on this machine but not in its Docker
    ("local", [Node("node-1", "docker://20.10.5", True), Node("node-2", "docker://20.10.5", False)]),
    ("docker-desktop", [Node("docker-desktop", "containerd://1.7.13", False)]),
    ("restricted", []),  # nodes that cannot be listed
])
def test_a_context_that_cannot_see_local_images_stops_and_says_what_to_pass(context, nodes):
    with pytest.raises(QuickstartError) as stopped:
        image_route(context, "", nodes)
    message = str(stopped.value)
    assert f"the nodes of context {context} cannot use images built in this machine's Docker" in message
    assert "Nothing was installed. Pass --registry REGISTRY/PREFIX" in message


def test_the_route_is_decided_before_any_build_or_install():
    """up() asks for the route and the capacity before it builds an image or installs the chart."""
    source = inspect.getsource(up)
    route, fit = source.index("image_route("), source.index("worker_cpu(")
    assert route < fit < source.index("build_images()") < source.index("install_operator(")


def test_help_runs_on_a_python_without_the_packages(tmp_path):
    """`scripts/quickstart.sh --cluster --help` installs nothing: it runs on Python's own modules."""
    blocked = "import sys\nfor name in ('yaml', 'pydantic', 'kubernetes', 'pyarrow'):\n    sys.modules[name] = None\n"
    code = blocked + "from scalingrun_demo.quickstart import main\nmain(['--help'])\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "operator")})
    assert result.returncode == 0, result.stderr
    assert "--registry REGISTRY/PREFIX" in result.stdout and "--skip-capacity-check" in result.stdout
