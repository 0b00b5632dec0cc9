"""A rank of a training.command that raises must exit, or mpirun never stops the other ranks (issue 29): the SDK's
exception hook ends the process even when a thread that is not a daemon (a data reader's) would keep it alive."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.sdk import config  # noqa: F401 - the fixture: a command run's trainer config

__all__ = ["config"]


def rank_1(config: Path, script: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "SCALINGRUN_CONFIG": str(config),
           "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    return subprocess.run([sys.executable, "-c", "from scalingrun_trainer import sdk\n" + textwrap.dedent(script)],
                          capture_output=True, text=True, env=env, timeout=60)


def test_a_rank_that_raised_exits_even_while_a_thread_that_is_not_a_daemon_runs(config):  # noqa: F811
    result = rank_1(config, """
        import threading, time
        sdk.context()
        threading.Thread(target=time.sleep, args=(3600,), name="a reader's thread").start()
        raise IndexError("list index out of range")
    """)
    assert result.returncode == 1 and "IndexError: list index out of range" in result.stderr


def test_without_an_escaping_exception_python_still_waits_for_its_threads(config):  # noqa: F811
    result = rank_1(config, """
        import threading, time
        sdk.context()
        threading.Thread(target=lambda: (time.sleep(0.5), print("thread done", flush=True))).start()
    """)
    assert result.returncode == 0 and "thread done" in result.stdout, result.stderr


def test_a_rank_that_raised_exits_without_waiting_on_its_exit_handlers(config):  # noqa: F811
    """What mpi4py's MPI_Finalize does at exit, waiting for ranks that wait for this one, played by a handler."""
    result = rank_1(config, """
        import atexit, time
        sdk.context()
        atexit.register(time.sleep, 3600)
        raise IndexError("list index out of range")
    """)
    assert result.returncode == 1 and "IndexError: list index out of range" in result.stderr
