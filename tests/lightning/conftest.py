"""The Lightning venv (.venv-lightning, `SCALINGRUN_PROFILE=lightning scripts/setup.sh`) and Open MPI's mpirun."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.env import require

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def lightning_python() -> str:
    python = Path(os.environ.get("SCALINGRUN_LIGHTNING_PYTHON", ROOT / ".venv-lightning/bin/python"))
    require(python.exists(), f"no Lightning venv at {python}: run SCALINGRUN_PROFILE=lightning scripts/setup.sh")
    return str(python)


@pytest.fixture(scope="session")
def mpirun() -> list[str]:
    found = shutil.which("mpirun")
    require(found is not None, "mpirun not found: scripts/setup.sh installs openmpi-bin")
    return [found, *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np", "2", "-bind-to", "none"]
