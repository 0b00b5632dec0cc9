"""The built Horovod really has TensorFlow, MPI and Gloo, and two processes really communicate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.horovodrun import horovodrun


pytestmark = pytest.mark.horovod
HERE = Path(__file__).resolve().parent


def test_check_build_has_tensorflow_mpi_and_gloo():
    out = subprocess.run([horovodrun(), "--check-build"], capture_output=True, text=True, check=True).stdout
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo"):
        assert line in out, out


@pytest.mark.parametrize("controller", ["--gloo", "--mpi"])
def test_two_processes_allreduce_and_broadcast(controller):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [horovodrun(), "-np", "2", "-H", "localhost:2", controller, sys.executable, str(HERE / "allreduce_worker.py")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reports = sorted(re.findall(r"rank=(\d) size=(\d) average=([\d.]+) broadcast=(\d+)", result.stdout))
    assert reports == [("0", "2", "0.50", "100"), ("1", "2", "0.50", "100")], result.stdout
