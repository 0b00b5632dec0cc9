"""A cluster user's install is small: `pip install` of the package into a clean venv gives the `scalingrun` CLI
with none of the training stack, from wheels only, and every dependency has wheels for Linux arm64 and macOS too.
Needs the package registry (CI has it); the seconds it took are printed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from tests.support.env import ROOT

# None of these may come with the CLI: the training stack, the operator's runtime, the demo's packages.
NOT_IN_THE_CLI = {"tensorflow", "tensorflow-cpu", "torch", "horovod", "petastorm", "mpi4py", "kopf", "pyarrow",
                  "numpy", "pillow", "matplotlib", "pytorch-lightning", "lightning"}
# (platform tag, what it is): the CLI's closure must resolve to wheels there.
PLATFORMS = [("manylinux2014_aarch64", "Linux arm64"), ("macosx_11_0_arm64", "macOS arm64"),
             ("macosx_10_12_x86_64", "macOS x86_64")]
SOURCES = ("pyproject.toml", "README.md", "operator", "trainer")
# The venv sees only itself: none of the test process's paths (PYTHONPATH names the checkout's packages).
CLEAN = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def pip(python: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=timeout, env=CLEAN)


@pytest.fixture(scope="module")
def cli_wheel(tmp_path_factory) -> Path:
    """The package built as a wheel from a copy of its sources (a build never writes into the checkout)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")}
                                            if (ROOT / name).is_dir() else {}))
    built = pip(Path(sys.executable), "wheel", "--no-deps", "-w", str(out), str(source))
    assert built.returncode == 0, built.stderr[-3000:]
    return next(out.glob("scalingrun-*.whl"))


def test_the_cli_installs_from_wheels_without_the_training_stack_and_validates(cli_wheel, tmp_path):
    started = time.monotonic()
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv/bin/python"
    installed = pip(python, "install", "--only-binary", ":all:", str(cli_wheel))
    seconds = time.monotonic() - started
    assert installed.returncode == 0, installed.stderr[-3000:]
    names = {re.split(r"[=@ ]", line, 1)[0].lower().replace("_", "-")
             for line in pip(python, "freeze", "--all").stdout.splitlines()}
    print(f"clean venv + pip install of the CLI: {seconds:.1f} s, {len(names)} distributions: {sorted(names)}")
    assert {"scalingrun", "kubernetes", "pydantic", "pyyaml", "botocore"} <= names
    assert names & NOT_IN_THE_CLI == set()

    scalingrun = tmp_path / "venv/bin/scalingrun"
    helped = subprocess.run([str(scalingrun), "--help"], capture_output=True, text=True, timeout=60, env=CLEAN)
    assert helped.returncode == 0 and "validate" in helped.stdout and "get" in helped.stdout, helped.stderr
    checked = subprocess.run([str(scalingrun), "validate", "-f", str(ROOT / "examples/quickstart.yaml"),
                              "-f", str(ROOT / "examples/sweep.yaml")], capture_output=True, text=True, timeout=60, env=CLEAN)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ScalingRun quickstart is valid" in checked.stdout and "is valid" in checked.stdout.splitlines()[-1]
    refused = subprocess.run([str(scalingrun), "validate", "-f", "-"], input="apiVersion: scalingrun.dev/v1alpha1\n"
                             "kind: ScalingRun\nmetadata: {name: x}\nspec: {workers: {replicas: 0}}\n",
                             capture_output=True, text=True, timeout=60, env=CLEAN)
    assert refused.returncode != 0 and "replicas" in refused.stdout + refused.stderr
    crd = subprocess.run([str(scalingrun), "crd"], capture_output=True, text=True, timeout=60, env=CLEAN)
    assert crd.returncode == 0 and "name: scalingruns.scalingrun.dev" in crd.stdout
    # A command that needs an extra says which, in one line.
    progress = tmp_path / "progress.json"
    progress.write_text(json.dumps({"state": "running", "epoch": 1, "maxEpochs": 2, "history": [
        {"epoch": 1, "loss": 0.9, "accuracy": 0.6, "val_loss": 0.8, "val_accuracy": 0.7}]}))
    report = subprocess.run([str(scalingrun), "report", "--progress", str(progress), "-o", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=60, env=CLEAN)
    assert report.returncode == 1 and report.stderr.strip() == ("scalingrun report: needs matplotlib, which `pip "
                                                                "install .` leaves out: pip install '.[demo]' "
                                                                "(docs/install.md)"), report.stderr


@pytest.mark.parametrize("platform", [p for p, _ in PLATFORMS], ids=[words for _, words in PLATFORMS])
def test_every_dependency_of_the_cli_has_a_wheel_for(platform, cli_wheel, tmp_path):
    """pip resolves the CLI's closure for PLATFORM with wheels only (no build on the user's machine)."""
    requirements = [line.split(":", 1)[1].strip() for line in subprocess.run(
        ["unzip", "-p", str(cli_wheel), "*.dist-info/METADATA"], capture_output=True, text=True, check=True
    ).stdout.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert requirements, "the wheel names no dependencies"
    fetched = pip(Path(sys.executable), "download", "--only-binary", ":all:", "--platform", platform,
                  "--python-version", "3.11", "--implementation", "cp", "-d", str(tmp_path), *requirements)
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    wheels = sorted(p.name for p in tmp_path.iterdir())
    assert wheels and all(name.endswith(".whl") for name in wheels), wheels
    assert not {w.split("-")[0].lower().replace("_", "-") for w in wheels} & NOT_IN_THE_CLI
