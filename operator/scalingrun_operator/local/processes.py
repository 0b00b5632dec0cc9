"""The processes a local run starts in place of its children: the preprocessing Job's shards and the
MPIJob's training, and what they leave behind, written as those children's status as their controllers
(the Job controller, the MPI operator) would write it.

Preprocessing runs as `parallelism` shard processes (what the Indexed Job runs, one pod per shard), or for a
Parquet table one `scalingrun-trainer inspect`; training runs `scalingrun-trainer train` (what the MPIJob launcher
runs) under the engine's local launcher (scalingrun_api.engines: `horovodrun -np N` for Keras + Horovod, `mpirun -np
N` for the others, in the framework's own venv where the engine has one), and a training.command under
`mpirun -np N <command>`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from scalingrun_api.engines import HOROVODRUN, engine, framework_engine
from scalingrun_api.models import ScalingRun
from scalingrun_api.models.training import CONFIG_VARIABLE
from .process_tree import ProcessTree


class LocalRunError(RuntimeError):
    """Why a local run cannot start; the message says what to do."""


# The NVIDIA driver's folder of GPUs: one entry per GPU, present only where the driver is loaded.
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def gpus_here(environ: Optional[dict[str, str]] = None, driver: str = NVIDIA_GPUS) -> int:
    """The NVIDIA GPUs a local run's processes could use: the driver's entries, none where CUDA_VISIBLE_DEVICES
    hides them ("" or -1). The operator imports no CUDA library to ask (the frameworks live in the trainer)."""
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        return sum(1 for _ in Path(driver).iterdir())
    except OSError:
        return 0


def horovodrun() -> str:
    """The venv's horovodrun even when the venv is not activated."""
    beside = Path(sys.executable).with_name("horovodrun")
    found = str(beside) if beside.exists() else shutil.which("horovodrun")
    if not found:
        raise LocalRunError("horovodrun not found: run scripts/setup.sh (it builds Horovod)")
    return found


def lightning_python() -> str:
    """The PyTorch Lightning venv's python (SCALINGRUN_LIGHTNING_PYTHON, else .venv-lightning beside this venv):
    torch lives in its own venv (an engine's own_venv), never in the Keras one."""
    explicit = os.environ.get("SCALINGRUN_LIGHTNING_PYTHON")
    candidates = [Path(explicit)] if explicit else [Path(sys.prefix).parent / ".venv-lightning" / "bin" / "python"]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    raise LocalRunError(f"no PyTorch Lightning venv at {candidates[0]}: run SCALINGRUN_PROFILE=lightning "
                        "scripts/setup.sh (or set SCALINGRUN_LIGHTNING_PYTHON)")


def mpirun(processes: int) -> list[str]:
    """Debian Open MPI's mpirun, one process per slot on this host (root needs --allow-run-as-root)."""
    found = shutil.which("mpirun")
    if not found:
        raise LocalRunError("mpirun not found: install Open MPI (scripts/setup.sh installs openmpi-bin)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [found, *root, "-np", str(processes), "--oversubscribe", "-bind-to", "none"]


@dataclass(frozen=True)
class Commands:
    """The command lines of a local run's processes."""

    def preprocess(self, config: Path, shards: int, index: int, workers: int, plan_id: str) -> list[str]:
        """`plan_id`: one per start of the shards (the Job's uid in the cluster): shard 0 plans, the others wait."""
        return [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--config", str(config),
                "--shard-count", str(shards), "--shard-index", str(index), "--workers", str(workers),
                "--plan-id", plan_id]

    def inspect(self, config: Path) -> list[str]:
        """dataset.format parquet: the check of the table, in the preprocessing's place."""
        return [sys.executable, "-m", "scalingrun_trainer.cli", "inspect", "--config", str(config)]

    def train(self, run: ScalingRun, processes: int, config: Path) -> list[str]:
        """What the MPIJob launcher runs, here, under the engine's local launcher: horovodrun for Keras + Horovod;
        mpirun for the engines that take rank and world size from MPI (Lightning DDP, with the Lightning venv's
        python; Keras multi-worker-mirrored) and for a training.command."""
        train = ["-m", "scalingrun_trainer.cli", "train", "--config", str(config)]
        training = run.spec.training
        if training.command:
            # The user's command on every rank, as the MPIJob's mpirun starts it; `python` is the framework's venv's
            # (train_env puts it first on PATH).
            return [*mpirun(processes), *training.command]
        chosen = engine(training.framework, training.strategy)
        python = lightning_python() if chosen.own_venv else sys.executable
        if chosen.local_launcher == HOROVODRUN:
            return [horovodrun(), "-np", str(processes), "-H", f"localhost:{processes}", "--gloo", python, *train]
        return [*mpirun(processes), python, *train]


def train_env(run: ScalingRun, config: Path) -> dict[str, str]:
    """What a training.command's ranks need beside the storage settings: the config's path for the SDK, and the
    framework's venv first on PATH (its python has the SDK, and TensorFlow + Horovod or torch)."""
    if not run.spec.training.command:
        return {}
    own_venv = framework_engine(run.spec.training.framework).own_venv
    python = Path(lightning_python() if own_venv else sys.executable)
    return {CONFIG_VARIABLE: str(config), "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@dataclass
class Shards:
    """The preprocessing's shard processes; `finish()` waits for them and says how they ended as a Job's status."""

    procs: list[subprocess.Popen]
    relay: Callable[[str], None]
    relays: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, commands: list[list[str]], env: dict[str, str], relay: Callable[[str], None]) -> "Shards":
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for c in commands]
        shards = cls(procs, relay)
        shards.relays = [threading.Thread(target=shards._relay, args=(p.stderr,), daemon=True) for p in procs]
        for thread in shards.relays:
            thread.start()
        return shards

    def _relay(self, stream) -> None:
        for line in stream:
            self.relay("  " + line.rstrip())

    def stop(self) -> int:
        """Stops every shard and what it started (SIGTERM, then SIGKILL); how many processes were running."""
        return ProcessTree(list(self.procs)).stop()

    def finish(self, stamp: str) -> dict:
        """Waits for every shard; the Job status the Job controller would write for them."""
        summaries = []
        for proc in self.procs:
            out = proc.stdout.read()
            proc.wait()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            summaries.append((proc.returncode, json.loads(lines[-1]) if lines else {"error": "no summary"}))
        for thread in self.relays:
            thread.join()
        failed = [(index, summary) for index, (code, summary) in enumerate(summaries) if code != 0]
        status = {"succeeded": len(summaries) - len(failed), "failed": len(failed)}
        if failed:
            index, summary = failed[0]
            message = (f"{len(failed)} of {len(summaries)} shards failed; first: shard {index}: "
                       f"{summary.get('error', 'see the log')}") if len(summaries) > 1 else \
                summary.get("error", "see the log")
            return {**status, "conditions": [{"type": "Failed", "status": "True", "reason": "ShardsFailed",
                                              "message": message, "lastTransitionTime": stamp}]}
        return {**status, "completionTime": stamp,
                "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": stamp}]}


def training_status(code: Optional[int], stamp: str, reason: str = "TrainerExited",
                    message: Optional[str] = None) -> dict:
    """The MPIJob status the MPI operator would write: Running while `code` is None, then how it ended (`message`:
    which rank failed and its error, or why the runner stopped it)."""
    if code is None:
        return {"conditions": [{"type": "Running", "status": "True", "reason": "Started",
                                "lastTransitionTime": stamp}]}
    if code == 0:
        return {"completionTime": stamp, "conditions": [{"type": "Succeeded", "status": "True", "reason": "Exited",
                                                          "lastTransitionTime": stamp}]}
    return {"conditions": [{"type": "Failed", "status": "True", "reason": reason,
                            "message": message or f"the training exited with code {code}", "lastTransitionTime": stamp}]}
