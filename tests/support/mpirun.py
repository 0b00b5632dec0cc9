"""mpirun for the Lightning and MultiWorkerMirrored trainers' tests."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.env import require


@pytest.fixture(scope="session")
def mpirun() -> list[str]:
    found = shutil.which("mpirun")
    require(found is not None, "mpirun not found: scripts/setup.sh installs openmpi-bin")
    return [found, *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np", "2", "-bind-to", "none"]
