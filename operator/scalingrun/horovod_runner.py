"""`scalingrun.HorovodRunner(np=...)`: the articles' class; `.run(fn, **kwargs)` returns rank 0's return value.
`np < 0` runs -np processes on this machine under horovodrun (gloo), each calling the shipped function
(scalingrun_api.shipped, run by scalingrun_trainer.sdk.function). `np > 0` makes a ScalingRun of np workers from
`run=` (its storage, dataset and workers) whose training.command runs the function, stored in the run's own store
under its digest (function_store.py), and submits it to the cluster (or, with `local=True`, to the local runner)."""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional

from scalingrun_api.engines import HOROVOD_STALL_ENV
from scalingrun_api.shipped import (ERROR_FILE, RESULT_FILE, WORKER_MODULE, check_packages, digest, pack,
                                    worker_command, write)
from scalingrun_api.shipped_code import pack_directory
from scalingrun_operator.builders.locations import join
from scalingrun_operator.local.processes import horovodrun
from . import function_store
from .run import Run, RunFailed

TAIL_LINES = 20  # of the launcher's output, in the error when no rank left a traceback


class HorovodRunnerError(RuntimeError):
    """The function failed on some rank (the message names the rank and ends with its traceback), or the
    processes could not start."""


class HorovodRunner:
    """`HorovodRunner(np=-2).run(train_hvd, epochs=3)`: train_hvd(epochs=3) on 2 Horovod processes here; rank 0's
    return value comes back. `driver_log_verbosity` as the articles': "all" prints every rank's output here,
    "log_callback_only" only the launcher's failures."""

    Error = HorovodRunnerError
    LAUNCHER = "horovodrun"  # np < 0
    WORKER_OPTIONS: tuple[str, ...] = ()  # of scalingrun_trainer.sdk.function, after the folder

    def __init__(self, np: int, driver_log_verbosity: str = "all", workdir: Optional[str | Path] = None,
                 run: Optional[Run | dict[str, Any]] = None, store_endpoint: Optional[str] = None,
                 timeout: Optional[float] = None, packages: Optional[list[str]] = None,
                 code_dir: Optional[str | Path] = None, **submit: Any):
        """`packages`: requirements every rank installs with pip before it runs the function (cached per list;
        scalingrun_api.shipped.check_packages says which are refused). `code_dir`: a directory of the team's modules
        that the function imports by name, packed at each run() (scalingrun_api.shipped_code: its caps) and first on
        every rank's sys.path. np > 0: `run` is the run the function's takes
        its storage, dataset and workers from (a Run or its document); `store_endpoint` where this machine reaches
        its store, when not at the spec's endpoint (a port-forward); `timeout`: seconds the run may take (Run.wait);
        `submit` goes to Run.submit (kubeconfig=, namespace=, local=True ...)."""
        if not isinstance(np, int) or isinstance(np, bool) or np == 0:
            raise ValueError(f"np={np!r}: a negative number of processes on this machine (np=-2), or a positive "
                             "number in the cluster")
        if driver_log_verbosity not in ("all", "log_callback_only"):
            raise ValueError(f"driver_log_verbosity={driver_log_verbosity!r}: 'all' or 'log_callback_only'")
        if np > 0 and run is None:
            raise ValueError(f"{type(self).__name__}(np={np}) needs run=: the ScalingRun (a Run or its document) whose "
                             "storage, dataset and workers the function's run takes")
        self.np, self.verbosity = np, driver_log_verbosity
        self.packages = check_packages(packages)
        self.code_dir = Path(code_dir) if code_dir else None
        if self.code_dir and not self.code_dir.is_dir():
            raise ValueError(f"code_dir={str(code_dir)!r}: not a directory")
        self.workdir = Path(workdir) if workdir else None
        self.base = run if isinstance(run, Run) or run is None else Run.from_dict(run)
        self.submit, self.store_endpoint, self.timeout = submit, store_endpoint, timeout
        self.last_run: Optional[Run] = None  # np > 0: the run made for the last function, to read its status

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        if self.np > 0:
            return self._in_a_run(main, kwargs)
        folder = Path(tempfile.mkdtemp(prefix=f"{type(self).__name__.lower()}-", dir=self.workdir))
        try:
            return self._here(folder, main, kwargs)
        finally:
            if self.workdir is None:  # a folder of its own in /tmp: nothing in it is needed once it has returned
                shutil.rmtree(folder, ignore_errors=True)

    def _here(self, folder: Path, main: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        write(folder, self._payload(main, kwargs))
        code, tail = self._launch(self._command(-self.np, str(folder)))
        if code != 0:
            raise self.Error(self._failure(folder, code, tail))
        result = folder / RESULT_FILE
        if not result.exists():
            raise self.Error(f"{self.LAUNCHER} exited 0 but rank 0 left no return value in {folder}")
        return pickle.loads(result.read_bytes())

    def _payload(self, main: Callable[..., Any], kwargs: dict[str, Any]) -> bytes:
        return pack(main, kwargs, self.packages, pack_directory(self.code_dir) if self.code_dir else None)

    def _command(self, processes: int, folder: str) -> list[str]:
        """The launcher's command line here: every rank runs the shipped function in `folder`."""
        return [horovodrun(), "-np", str(processes), "-H", f"localhost:{processes}", "--gloo",
                sys.executable, "-m", WORKER_MODULE, folder, *self.WORKER_OPTIONS]

    def _ranks_path(self) -> list[str]:
        """The ranks import what this process imports (the function's module by value, its imports by name)."""
        return [p for p in sys.path if p]

    def _in_a_run(self, main: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """The function in a ScalingRun of np workers: stored, run by every rank of the run's image, rank 0's value
        read back from the store."""
        payload = self._payload(main, kwargs)
        named = digest(payload)
        body = copy.deepcopy(self.base.body)
        body["metadata"] = {**body["metadata"], "name": f"{self.base.name[:30]}-fn-{named.split(':')[1][:10]}"}
        body["spec"].setdefault("workers", {})["replicas"] = self.np
        run = Run.from_dict(body)  # its name places the function: stored under the run that runs it
        folder = function_store.function_folder(run.model, named)
        body["spec"].setdefault("training", {})["command"] = worker_command(folder, named, self.WORKER_OPTIONS)
        run = Run.from_dict(body)
        function_store.store(run.model, payload, named, self.store_endpoint)
        local_workdir = {"workdir": self.workdir / run.name} if self.workdir and self.submit.get("local") else {}
        self.last_run = run.submit(**{**local_workdir, **self.submit})
        try:
            run.wait(timeout=self.timeout, progress=self.verbosity == "all")
        except RunFailed as exc:
            raise self.Error(f"{exc} (function {getattr(main, '__name__', main)}, {named})") from None
        result = function_store.get(run.model, join(folder, RESULT_FILE), self.store_endpoint)
        if result is None:
            raise self.Error(f"ScalingRun {run.name} succeeded but rank 0 left no return value in {folder}")
        return pickle.loads(result)

    def _launch(self, command: list[str]) -> tuple[int, list[str]]:
        """horovodrun's output relayed to this process's stdout (a notebook shows it), its last lines kept; on an
        interrupt every process it started is stopped."""
        # Horovod's stall shutdown and Gloo's timeout as every Horovod rank of ours has them (Gloo's own 30 s fails
        # a rank whose peer a busy machine holds up), unless exported here.
        env = {**HOROVOD_STALL_ENV, **os.environ, "PYTHONPATH": os.pathsep.join(self._ranks_path())}
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
        """The rank whose error was written first (the lowest of a tie), with its traceback: the others' often
        follow from it (a collective whose peer has gone); else the launcher's last lines."""
        written = [(error.stat().st_mtime_ns, rank, error) for rank in range(-self.np)
                   if (error := folder / ERROR_FILE.format(rank=rank)).exists()]
        if written:
            _, rank, error = min(written)
            text = error.read_text().rstrip()
            return f"rank {rank} of {-self.np} failed: {text.splitlines()[-1]}\n{text}"
        return f"{self.LAUNCHER} exited with code {code}:\n" + "\n".join(tail)
