"""The Lightning venv (.venv-lightning, `SCALINGRUN_PROFILE=lightning scripts/setup.sh`) and Open MPI's mpirun."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.env import require
from tests.support.mpirun import mpirun  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def lightning_python() -> str:
    python = Path(os.environ.get("SCALINGRUN_LIGHTNING_PYTHON", ROOT / ".venv-lightning/bin/python"))
    require(python.exists(), f"no Lightning venv at {python}: run SCALINGRUN_PROFILE=lightning scripts/setup.sh")
    return str(python)


