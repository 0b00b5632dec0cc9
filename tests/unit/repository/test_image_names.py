"""One image scheme everywhere: the names scripts/build-images.sh builds are the API's defaults, the chart's, the
kustomize base's, the examples' `FROM`, the release workflow's and every one the docs print."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from scalingrun_api.engines import ENGINES
from scalingrun_api.models.common import (
    DEFAULT_LIGHTNING_TRAINER_IMAGE, DEFAULT_TRAINER_IMAGE, DEFAULT_TRAINER_IMAGES, IMAGE_REGISTRY, IMAGE_VERSION,
    OPERATOR_IMAGE, TRAINER_FLAVOURS, trainer_image_name,
)
from scalingrun_operator.config import ConfigError, load, variable_names
from scalingrun_operator.cluster.reconcile import settings_of
from scalingrun_operator.decide.run import with_default_image
from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.common import trainer_image
from tests.support.env import require

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts/scalingrun"
# An image of ours as the docs may write it: the version as a number or as <version>.
OUR_IMAGE = re.compile(r"ghcr\.io/scalingrun/[a-z-]+:(?:<version>|[0-9][0-9.]*)(?:-(?:<flavour>|[a-z-]*[a-z]))?")
# The names before this scheme (no registry): none may remain.
UNQUALIFIED = re.compile(r"(?<![\w./-])scalingrun/(?:trainer|operator|example-[a-z-]+):")


def _defaults_env() -> dict[str, str]:
    """The environment without the variables that rename the images (the defaults are under test)."""
    return {k: v for k, v in os.environ.items() if k not in ("SCALINGRUN_IMAGE_REGISTRY", "SCALINGRUN_IMAGE_TAG")}


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    out = subprocess.run(["bash", "scripts/build-images.sh", "--names"], cwd=ROOT, capture_output=True, text=True,
                         check=True, env=_defaults_env()).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_build_images_builds_the_api_defaults_under_one_scheme(built):
    assert built["operator"] == OPERATOR_IMAGE == f"{IMAGE_REGISTRY}/operator:{IMAGE_VERSION}"
    assert built["trainer"] == DEFAULT_TRAINER_IMAGE
    assert built["trainer-lightning"] == DEFAULT_LIGHTNING_TRAINER_IMAGE
    flavours = {name: image for name, image in built.items() if name.startswith("trainer")}
    assert sorted(flavours.values()) == sorted(trainer_image_name(f) for f in TRAINER_FLAVOURS)
    # Every engine's default image, on CPU and on GPUs, is one that is built.
    defaults = {engine.default_image(gpus) for engine in ENGINES.values() for gpus in (0, 1)}
    assert defaults <= set(built.values())
    assert {engine.default_image(1) for engine in ENGINES.values()} == {built["trainer-gpu"],
                                                                          built["trainer-lightning-gpu"]}
    assert all(image.startswith(f"{IMAGE_REGISTRY}/") and f":{IMAGE_VERSION}" in image for image in built.values())


def test_the_image_version_is_the_projects():
    """One version a release (docs/install.md, "Versions and tags"): the package's, the chart's, its appVersion."""
    project = re.search(r'^version = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert IMAGE_VERSION == project == chart["appVersion"] == chart["version"]


def test_the_chart_and_kustomize_name_the_same_images():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert f"{values['image']['repository']}:{values['image']['tag'] or version}" == OPERATOR_IMAGE
    assert f"{values['trainerImages']['repository']}:{values['trainerImages']['tag'] or version}" == DEFAULT_TRAINER_IMAGES
    base = [d for d in yaml.safe_load_all((ROOT / "manifests/base/scalingrun.yaml").read_text()) if d]
    deployment = next(d for d in base if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == OPERATOR_IMAGE
    assert {e["name"]: e.get("value") for e in container["env"]}["SCALINGRUN_TRAINER_IMAGES"] == DEFAULT_TRAINER_IMAGES
    overlay = yaml.safe_load((ROOT / "manifests/overlays/mirror/kustomization.yaml").read_text())
    assert [i["name"] for i in overlay["images"]] == [OPERATOR_IMAGE.rsplit(":", 1)[0]]


def test_the_kustomize_mirror_overlay_moves_both_operator_and_trainer_images():
    tools = subprocess.run(["bash", "scripts/tools.sh"], cwd=ROOT, capture_output=True, text=True)
    require(tools.returncode == 0, f"kubectl not available: {tools.stderr[-300:]}")
    built = subprocess.run([f"{tools.stdout.strip()}/kubectl", "kustomize", "manifests/overlays/mirror"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    deployment = next(d for d in yaml.safe_load_all(built) if d and d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == "registry.example.com/mirror/scalingrun/operator:0.1.0"
    assert env["SCALINGRUN_TRAINER_IMAGES"] == "registry.example.com/mirror/scalingrun/trainer:0.1.0"
    # One naming rule, REGISTRY/operator and REGISTRY/trainer: the chart's mirror values name the same repositories.
    chart = yaml.safe_load((ROOT / "charts/scalingrun/ci/mirror-values.yaml").read_text())
    assert container["image"].rsplit(":", 1)[0] == chart["image"]["repository"]
    assert env["SCALINGRUN_TRAINER_IMAGES"].rsplit(":", 1)[0] == chart["trainerImages"]["repository"]


@pytest.mark.parametrize("dockerfile", ["examples/custom-model/Dockerfile", "examples/custom-training/Dockerfile"])
def test_the_examples_build_from_the_trainer_image(dockerfile, built):
    default = re.search(r"^ARG TRAINER_IMAGE=(\S+)$", (ROOT / dockerfile).read_text(), re.M).group(1)
    assert default == built["trainer"]


def _documents() -> list[Path]:
    files = [ROOT / "README.md", CHART / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file() and p.suffix in ("", ".yaml", ".md", ".py")),
             ROOT / "Dockerfile.trainer", ROOT / "Dockerfile.operator", ROOT / "scripts/quickstart.sh"]
    return [p for p in files if p.is_file()]


def test_docs_and_examples_name_only_images_that_are_built(built):
    known = set(built.values()) | {image.replace(IMAGE_VERSION, "<version>") for image in built.values()} | {
        f"{IMAGE_REGISTRY}/trainer:<version>-<flavour>"}
    named = 0
    for path in _documents():
        text = path.read_text()
        assert not UNQUALIFIED.findall(text), f"{path.relative_to(ROOT)}: an image without the registry"
        unknown = set(OUR_IMAGE.findall(text)) - known
        assert not unknown, f"{path.relative_to(ROOT)} names images nothing builds: {sorted(unknown)}"
        named += len(OUR_IMAGE.findall(text))
    assert named >= 10  # the pattern finds the images the docs name (README, run-in-a-cluster, examples)
    assert not set(OUR_IMAGE.findall("ghcr.io/scalingrun/trainer:0.1.0 and ghcr.io/scalingrun/trainer:9.9-cpu")) - \
        {"ghcr.io/scalingrun/trainer:0.1.0", "ghcr.io/scalingrun/trainer:9.9-cpu"}
    assert {"ghcr.io/scalingrun/trainer:0.1.0", "ghcr.io/scalingrun/trainer:9.9-cpu"}.isdisjoint(known)  # both wrong


def test_the_release_workflow_publishes_what_build_images_builds(built):
    workflow = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    registry = workflow["env"]["REGISTRY"]
    published = set()
    for job in ("images", "examples"):
        for row in workflow["jobs"][job]["strategy"]["matrix"]["include"]:
            flavour = f"-{row['flavour']}" if row["flavour"] else ""
            published.add(f"{registry}/{row['image']}:{IMAGE_VERSION}{flavour}")
    assert published == set(built.values())
    assert registry == IMAGE_REGISTRY
    # The GPU flavours with the build arguments build-images.sh --gpu-commands prints.
    commands = subprocess.run(["bash", "scripts/build-images.sh", "--gpu-commands"], cwd=ROOT, capture_output=True,
                              text=True, check=True, env=_defaults_env()).stdout.splitlines()
    rows = {row["flavour"]: row for row in workflow["jobs"]["images"]["strategy"]["matrix"]["include"]}
    for command in commands:
        flavour = command.rsplit(":", 1)[1].split()[0].split("-", 1)[1]
        args = set(re.findall(r"--build-arg (\S+)", command))
        assert args == set(rows[flavour]["build-args"].split()), flavour
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    assert any("cosign sign" in step.get("run", "") for step in steps)
    assert any("helm push" in step.get("run", "") for step in steps)


def test_one_setting_moves_every_default_trainer_image_to_a_teams_registry():
    assert "SCALINGRUN_TRAINER_IMAGES" in variable_names()
    config = load({"SCALINGRUN_TRAINER_IMAGES": "registry.example.com:5000/ml/trainer:7.1"})
    settings = settings_of(config)
    keras = parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "a"},
                              "spec": {"storage": {"credentialsSecret": "s3"}, "dataset": {"source": "s3://bucket/in", "output": "s3://bucket/out"}}})
    on_cpu = keras.model_copy(deep=True)
    on_cpu.spec.workers.gpus_per_worker = 0
    assert trainer_image(with_default_image(keras.model_copy(deep=True), settings.trainer_images)) == \
        "registry.example.com:5000/ml/trainer:7.1-gpu"  # gpusPerWorker defaults to 1
    assert trainer_image(with_default_image(on_cpu, settings.trainer_images)) == \
        "registry.example.com:5000/ml/trainer:7.1-cpu"
    # Where the run trains on a machine without GPUs (a local run), the CPU image whatever it asks for.
    assert trainer_image(with_default_image(keras.model_copy(deep=True), settings.trainer_images, gpu_images=False)) \
        == "registry.example.com:5000/ml/trainer:7.1-cpu"
    lightning = parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
                                  "metadata": {"name": "b"},
                                  "spec": {"storage": {"credentialsSecret": "s3"}, "dataset": {"source": "s3://bucket/in", "output": "s3://bucket/out"},
                                           "training": {"framework": "pytorch-lightning", "strategy": "ddp"}}})
    lightning_on_cpu = lightning.model_copy(deep=True)
    lightning_on_cpu.spec.workers.gpus_per_worker = 0
    assert trainer_image(with_default_image(lightning, settings.trainer_images)) == \
        "registry.example.com:5000/ml/trainer:7.1-lightning-gpu"
    assert trainer_image(with_default_image(lightning_on_cpu, settings.trainer_images)) == \
        "registry.example.com:5000/ml/trainer:7.1-lightning-cpu"
    own = keras.model_copy(deep=True)
    own.spec.workers.image = "team/mine:1"
    assert trainer_image(with_default_image(own, settings.trainer_images)) == "team/mine:1"  # a run's own wins
    unset = parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "c"},
                              "spec": {"storage": {"credentialsSecret": "s3"}, "dataset": {"source": "s3://bucket/in", "output": "s3://bucket/out"}}})
    assert trainer_image(with_default_image(unset, "")) == trainer_image_name("gpu")  # no setting: ours
    unset.spec.workers.image, unset.spec.workers.gpus_per_worker = None, 0
    assert trainer_image(with_default_image(unset, "")) == DEFAULT_TRAINER_IMAGE


@pytest.mark.parametrize("bad", ["trainer", "registry.example.com/ml/trainer", "a b:1", "repo:tag with space"])
def test_a_trainer_images_setting_without_a_tag_is_refused(bad):
    with pytest.raises(ConfigError, match="SCALINGRUN_TRAINER_IMAGES"):
        load({"SCALINGRUN_TRAINER_IMAGES": bad})
