"""`scalingrun run --local`: the same ScalingRun on one machine, without Kubernetes.

Preprocessing runs as `parallelism` shard processes (what the Indexed Job runs, one pod per shard);
training runs `horovodrun -np N scalingrun-trainer train` (what the MPIJob launcher runs), or for a
multi-worker-mirrored run `mpirun -np N`, and for a pytorch-lightning run `mpirun -np N` with the Lightning venv's
python. Status is
written to a local document in the same shape as the ScalingRun's status. Credentials come from the
environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), the local stand-in for the Secret.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from scalingrun_api.models import (
    Condition, Framework, Phase, PreprocessingStatus, ScalingRun, ScalingRunStatus, Strategy, TrainingStatus,
)
from scalingrun_api.progress import Progress
from ..api.validation import s3_fields
from ..builders.common import storage_env
from ..builders.config import build_trainer_config, total_processes
from ..handlers.training import input_bound, progress_uri, training_status
from ..storage import StorageError, StorageTarget, read_json


def _horovodrun() -> str:
    """The venv's horovodrun even when the venv is not activated."""
    beside = Path(sys.executable).with_name("horovodrun")
    found = str(beside) if beside.exists() else shutil.which("horovodrun")
    if not found:
        raise LocalRunError("horovodrun not found: run scripts/setup.sh (it builds Horovod)")
    return found


def _lightning_python() -> str:
    """The PyTorch Lightning venv's python (SCALINGRUN_LIGHTNING_PYTHON, else .venv-lightning beside this venv):
    torch lives in its own venv, never in the Keras one."""
    explicit = os.environ.get("SCALINGRUN_LIGHTNING_PYTHON")
    candidates = [Path(explicit)] if explicit else [Path(sys.prefix).parent / ".venv-lightning" / "bin" / "python"]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    raise LocalRunError(f"no PyTorch Lightning venv at {candidates[0]}: run SCALINGRUN_PROFILE=lightning "
                        "scripts/setup.sh (or set SCALINGRUN_LIGHTNING_PYTHON)")


def _mpirun(processes: int) -> list[str]:
    """Debian Open MPI's mpirun, one process per slot on this host (root needs --allow-run-as-root)."""
    found = shutil.which("mpirun")
    if not found:
        raise LocalRunError("mpirun not found: install Open MPI (scripts/setup.sh installs openmpi-bin)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [found, *root, "-np", str(processes), "--oversubscribe", "-bind-to", "none"]


def training_command(run: ScalingRun, processes: int, config: Path) -> list[str]:
    """What the MPIJob launcher runs, here: horovodrun for Keras + Horovod; mpirun for the engines that take rank
    and world size from MPI (Lightning DDP, with the Lightning venv's python; Keras multi-worker-mirrored)."""
    train = ["-m", "scalingrun_trainer.cli", "train", "--config", str(config)]
    training = run.spec.training
    if training.framework == Framework.pytorch_lightning.value:
        return [*_mpirun(processes), _lightning_python(), *train]
    if training.strategy == Strategy.multi_worker_mirrored.value:
        return [*_mpirun(processes), sys.executable, *train]
    return [_horovodrun(), "-np", str(processes), "-H", f"localhost:{processes}", "--gloo", sys.executable, *train]


class LocalRunError(RuntimeError):
    """Why a local run cannot start; the message says what to do."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


@dataclass
class LocalRun:
    run: ScalingRun
    workdir: Path
    np_override: Optional[int] = None
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    status: ScalingRunStatus = field(default_factory=ScalingRunStatus)
    progress: Optional[dict] = None
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.json"

    @property
    def status_path(self) -> Path:
        return self.workdir / "status.json"

    def _set(self, phase: Phase, condition: Optional[Condition] = None) -> None:
        self.status.phase = phase.value
        if condition is not None:
            condition.last_transition_time = _now().isoformat()
            self.status.conditions = [c for c in self.status.conditions if c.type != condition.type] + [condition]
        self.write_status()

    def write_status(self) -> None:
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(self.status.model_dump_json(by_alias=True, exclude_none=True, indent=2))
        tmp.replace(self.status_path)

    def check_credentials(self) -> None:
        spec = self.run.spec
        if s3_fields(self.run) and not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
            raise LocalRunError(
                f"this run reads s3:// with the keys of Secret {spec.storage.credentials_secret!r}: locally, "
                "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead"
            )
        tracking = spec.tracking
        env = os.environ
        has_mlflow_credentials = env.get("MLFLOW_TRACKING_TOKEN") or (
            env.get("MLFLOW_TRACKING_USERNAME") and env.get("MLFLOW_TRACKING_PASSWORD"))
        if tracking and tracking.credentials_secret and not has_mlflow_credentials:
            raise LocalRunError(
                f"this run logs to MLflow with the credentials of Secret {tracking.credentials_secret!r}: locally, "
                "export MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, instead"
            )

    def start(self, stop_after: str = "training") -> int:
        self.check_credentials()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = build_trainer_config(self.run)
        if self.np_override:
            config["processes"] = self.np_override
        self.config_path.write_text(json.dumps(config, indent=2))
        self.status.start_time = _now()
        self._set(Phase.pending)
        if not self.preprocess():
            return 1
        if stop_after == "preprocessing":
            self.log("stopping after preprocessing (--stop-after preprocessing)")
            return 0
        return 0 if self.train() else 1

    def _env(self) -> dict[str, str]:
        """The pods' storage settings; the keys come from this environment instead of the Secret."""
        return {**os.environ, **{e["name"]: e["value"] for e in storage_env(self.run) if "value" in e}}

    def preprocess(self) -> bool:
        shards = self.run.spec.dataset.preprocessing.parallelism
        workers = max(1, (os.cpu_count() or 1) // shards)
        self._set(Phase.preprocessing, Condition(type="Preprocessed", status="Unknown", reason="Running",
                                                 message=f"{shards} shard processes"))
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--config", str(self.config_path),
                 "--shard-count", str(shards), "--shard-index", str(index), "--workers", str(workers)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self._env(),
            )
            for index in range(shards)
        ]
        relays = [threading.Thread(target=self._relay, args=(p.stderr,), daemon=True) for p in procs]
        for t in relays:
            t.start()
        summaries = []
        for proc in procs:
            out = proc.stdout.read()
            proc.wait()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            summaries.append((proc.returncode, json.loads(lines[-1]) if lines else {"error": "no summary"}))
        for t in relays:
            t.join()
        failed = [(i, s) for i, (code, s) in enumerate(summaries) if code != 0]
        if failed:
            message = f"{len(failed)} of {shards} shards failed; first: shard {failed[0][0]}: " \
                      f"{failed[0][1].get('error', 'see the log')}"
            self._set(Phase.failed, Condition(type="Failed", status="True", reason="PreprocessingFailed",
                                              message=message))
            self.log(f"preprocessing failed: {message}")
            return False
        dataset = next((s.get("dataset") or s for _, s in summaries if s.get("complete")), None)
        if dataset is None:
            self._set(Phase.failed, Condition(type="Failed", status="True", reason="PreprocessingIncomplete",
                                              message="all shards finished but no dataset manifest was written"))
            return False
        reused = all(s.get("reused") for _, s in summaries)
        self.status.preprocessing = PreprocessingStatus(
            reused=reused, fingerprint=dataset["fingerprint"], shards=shards, classes=dataset.get("classes"),
            images_written=sum(dataset["written"].values()), images_skipped=dataset["skipped"],
        )
        seconds = self.seconds["preprocessing"] = time.monotonic() - started
        reason = "DatasetReused" if reused else "Preprocessed"
        message = (f"{sum(dataset['written'].values())} images written ({dataset['written']['train']} train, "
                   f"{dataset['written']['validation']} validation), {dataset['skipped']} skipped, "
                   f"{seconds:.1f} s" + (" (same fingerprint: reused)" if reused else ""))
        self._set(Phase.preprocessing, Condition(type="Preprocessed", status="True", reason=reason, message=message))
        self.log(f"preprocessing done: {message}")
        return True

    def train(self) -> bool:
        command = training_command(self.run, self.np_override or total_processes(self.run), self.config_path)
        self._set(Phase.training, Condition(type="Trained", status="Unknown", reason="Running",
                                            message=" ".join(command[:4])))
        started = time.monotonic()
        result = subprocess.run(command, env=self._env())
        self.seconds["training"] = time.monotonic() - started
        self.progress = self._read_progress()
        progress = Progress.read(self.progress)
        if self.progress:
            mirrored = training_status(self.progress)
            self.status.training = TrainingStatus.model_validate(mirrored)
            self.status.model_uri = progress.model_uri
            bound = input_bound(self.run, mirrored.get("inputHistory"))
            if bound:  # as the operator sets it, from the same progress document
                self.status.conditions = [c for c in self.status.conditions if c.type != "InputBound"] + [Condition(
                    type="InputBound", status=bound[0], reason=bound[1], message=bound[2],
                    last_transition_time=_now().isoformat())]
        self.status.completion_time = _now()
        if result.returncode != 0:
            cause = progress.error or f"{Path(command[0]).name} exited {result.returncode}"
            self._set(Phase.failed, Condition(type="Failed", status="True", reason="TrainingFailed", message=cause))
            return False
        message = (f"{progress.epoch} epochs in {time.monotonic() - started:.0f} s, best epoch "
                   f"{progress.best_epoch}: val_accuracy {progress.best_metrics.get('val_accuracy')}")
        self._set(Phase.succeeded, Condition(type="Trained", status="True", reason="Trained", message=message))
        return True

    def _read_progress(self) -> Optional[dict]:
        """The trainer's progress document, read like the operator reads it (keys from the environment)."""
        storage = self.run.spec.storage
        try:
            return read_json(progress_uri(self.run), StorageTarget(storage.endpoint, storage.region, None))
        except StorageError:
            return None

    def _relay(self, stream) -> None:
        for line in stream:
            self.log("  " + line.rstrip())
