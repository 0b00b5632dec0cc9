"""`scalingrun.HorovodRunner(np=...)`: the articles' class. `np < 0` runs -np processes on this machine under
horovodrun (gloo), each calling the shipped function (scalingrun_api.shipped, run by scalingrun_trainer.sdk.function);
`.run(fn, **kwargs)` returns rank 0's return value. `np > 0` (a ScalingRun of np processes in the cluster carrying
the function) is not built yet: it says so."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional

from scalingrun_api.shipped import ERROR_FILE, RESULT_FILE, pack, write
from scalingrun_operator.local.processes import _horovodrun

TAIL_LINES = 20  # of the launcher's output, in the error when no rank left a traceback
WORKER = "scalingrun_trainer.sdk.function"


class HorovodRunnerError(RuntimeError):
    """The function failed on some rank (the message names the rank and ends with its traceback), or the
    processes could not start."""


class HorovodRunner:
    """`HorovodRunner(np=-2).run(train_hvd, epochs=3)`: train_hvd(epochs=3) on 2 Horovod processes here; rank 0's
    return value comes back. `driver_log_verbosity` as the articles': "all" prints every rank's output here,
    "log_callback_only" only the launcher's failures."""

    def __init__(self, np: int, driver_log_verbosity: str = "all", workdir: Optional[str | Path] = None):
        if not isinstance(np, int) or isinstance(np, bool) or np == 0:
            raise ValueError(f"np={np!r}: a negative number of processes on this machine (np=-2), or a positive "
                             "number in the cluster")
        if driver_log_verbosity not in ("all", "log_callback_only"):
            raise ValueError(f"driver_log_verbosity={driver_log_verbosity!r}: 'all' or 'log_callback_only'")
        self.np, self.verbosity = np, driver_log_verbosity
        self.workdir = Path(workdir) if workdir else None

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        if self.np > 0:
            raise NotImplementedError(f"HorovodRunner(np={self.np}): running the function in the cluster is not "
                                      "built yet (docs/python-client.md, \"What is left\"); np=-N runs it here")
        folder = Path(tempfile.mkdtemp(prefix="horovodrunner-", dir=self.workdir))
        write(folder, pack(main, kwargs))
        processes = -self.np
        command = [_horovodrun(), "-np", str(processes), "-H", f"localhost:{processes}", "--gloo",
                   sys.executable, "-m", WORKER, str(folder)]
        code, tail = self._launch(command)
        if code != 0:
            raise HorovodRunnerError(self._failure(folder, code, tail))
        result = folder / RESULT_FILE
        if not result.exists():
            raise HorovodRunnerError(f"horovodrun exited 0 but rank 0 left no return value in {folder}")
        return pickle.loads(result.read_bytes())

    def _launch(self, command: list[str]) -> tuple[int, list[str]]:
        """horovodrun's output relayed to this process's stdout (a notebook shows it), its last lines kept; on an
        interrupt every process it started is stopped."""
        # The ranks import what this process imports (the function's module by value, its imports by name).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                   start_new_session=True)
        try:
            for line in process.stdout:
                tail.append(line.rstrip("\n"))
                if self.verbosity == "all":
                    sys.stdout.write(line)
                    sys.stdout.flush()
            return process.wait(), list(tail)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait()

    def _failure(self, folder: Path, code: int, tail: list[str]) -> str:
        """The lowest rank that raised, with its traceback; else horovodrun's last lines."""
        for rank in range(-self.np):
            error = folder / ERROR_FILE.format(rank=rank)
            if error.exists():
                text = error.read_text().rstrip()
                return f"rank {rank} of {-self.np} failed: {text.splitlines()[-1]}\n{text}"
        return f"horovodrun exited with code {code}:\n" + "\n".join(tail)
