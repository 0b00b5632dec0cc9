"""`scalingrun run --local`: the same ScalingRun on one machine, without Kubernetes, decided by the same decide.

The local runner looks at the run as the operator does (observe -> decide -> act, decide.run), so its phases,
conditions and messages are the operator's. Its children are this machine's: the ConfigMap is the config
file in the workdir, the preprocessing Job and the MPIJob are processes (processes.py), and their status is
what those processes did, written as the Job controller and the MPI operator would write it. Status is
written to `<workdir>/status.json` after every look, in the shape of the ScalingRun's status. Credentials
come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), the local stand-in for the Secret.
Progress and heartbeat come as the operator's do with its status endpoint on: pushed by the run's processes, here
to 127.0.0.1 (pushes.py); the dataset manifest and the shard listings are read from storage (no pod here leaves a
termination message).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from scalingrun_api.models import API_VERSION, KIND, Phase, ScalingRun, ScalingRunStatus
from scalingrun_api.progress import Progress
from scalingrun_api.status_push import HEARTBEAT, PROGRESS, PUSHED_DOCUMENTS
from ..schema.endpoints import EndpointPolicy
from ..schema.validation import s3_fields
from ..builders.common import storage_env
from ..builders.config import CONFIG_KEY, total_processes
from ..builders.preprocess import is_parquet_table
from ..clock import now
from ..decide import pinning
from ..decide.children import owner_reference
from ..decide.run import decide_run
from ..decide.snapshot import (
    INDEXED_JOBS_SINCE, LOCAL, Child, Create, Decision, Document, Listing, Names, PodList, Pods, Read,
    NoticedNodes, Server, ServerVersion, Settings, Snapshot, look,
)
from ..decide.status import DATASET_REUSED, PREPROCESSED, TERMINAL, Event, get_condition, rfc3339
from ..documents import parse_manifest
from ..object_store import Clients, StorageError, Store, list_names, read_json
from .processes import Commands, LocalRunError, Shards, gpus_here, train_env, training_status
from .pushes import LocalPushes
from .training import StallWatch, TrainingProcess

__all__ = ["LocalRun", "LocalRunError"]

# Nothing here writes a document late (the processes have ended when they are judged): no grace to wait.
SETTINGS = Settings(completion_grace_seconds=0.0, where=LOCAL, endpoint_policy=EndpointPolicy.anything())


@dataclass
class LocalRun:
    run: ScalingRun
    workdir: Path
    np_override: Optional[int] = None
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    commands: Commands = field(default_factory=Commands)
    python_path: tuple[str, ...] = ()  # --python-path: folders with the user's packages (model.builder, command)
    poll_seconds: float = 5.0  # how often the pushed progress is looked at while training runs
    status: ScalingRunStatus = field(default_factory=ScalingRunStatus)
    progress: Optional[Progress] = None
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase
    events: list[Event] = field(default_factory=list)  # what the operator would post as Events, in order

    def __post_init__(self) -> None:
        if self.np_override:  # N processes here: N one-process workers, so that every figure derived agrees
            self.run = self.run.model_copy(deep=True)
            self.run.spec.workers.replicas = self.np_override
            self.run.spec.workers.gpus_per_worker = min(self.run.spec.workers.gpus_per_worker, 1)
        if self.run.spec.pod_overrides:  # said, not silently dropped: the same spec applied to a cluster uses them
            self.log(f"spec.podOverrides ({len(self.run.spec.pod_overrides)}) is not applied on one machine: it "
                     "adds to pods (labels, volumes, env, placement), and a local run starts processes; export "
                     "the variables it sets here if the training needs them")
        if self.run.spec.run_policy.kueue_queue_name:  # no Kueue on one machine to admit the jobs: they start at once
            self.run = self.run.model_copy(deep=True)
            self.run.spec.run_policy.kueue_queue_name = None
        meta = self.run.metadata
        self.body: dict[str, Any] = {
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": meta.name, "namespace": meta.namespace or "default", "generation": 1,
                         "uid": f"local-{uuid.uuid4()}", "creationTimestamp": rfc3339(now()),
                         "labels": dict(getattr(meta, "labels", None) or {})},
            "spec": self.run.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
            "status": {}}
        self.children: dict[tuple[str, str], dict[str, Any]] = {}  # as this machine's controllers show them
        self.clients = Clients()  # one botocore session for the run's reads
        # Where the run's processes push their progress and heartbeat (the operator's status endpoint, on loopback).
        self.pushes = LocalPushes(self.workdir / "status", self.body["metadata"]["namespace"], meta.name)
        self._shards: Optional[tuple[str, Shards]] = None
        self._training: Optional[tuple[str, TrainingProcess]] = None
        self._stall: Optional[StallWatch] = None
        self._training_start: Optional[tuple[list[str], dict[str, str], Path]] = None  # to start it again
        self.stall_restarts = 0

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.json"

    @property
    def status_path(self) -> Path:
        return self.workdir / "status.json"

    def check_credentials(self) -> None:
        spec = self.run.spec
        # With podIdentity the machine's own AWS credentials (its profile, SSO, a role) are what the pods' would be.
        if (s3_fields(self.run) and spec.storage.credentials_secret
                and not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"))):
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

    # --- the loop --------------------------------------------------------------------------------------

    def start(self, stop_after: str = "training") -> int:
        """Looks, acts and waits until the run has finished (0: Succeeded) or cannot go on (1)."""
        self.check_credentials()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pushes.start()
        try:
            # The image a run names by default (messages, config.json) is the CPU one unless this machine has GPUs.
            return self._loop(dataclasses.replace(SETTINGS, train=stop_after != "preprocessing",
                                                  gpu_images=gpus_here() > 0))
        finally:  # also on SIGTERM / SIGINT (signals.Stopped) and errors: nothing this run started outlives it
            self.stop_processes()
            self.pushes.stop()

    def _loop(self, settings: Settings) -> int:
        while True:
            decision = self.look(settings)
            phase = decision.phase
            if phase in TERMINAL:
                return 0 if phase == Phase.succeeded.value else 1
            if not settings.train and self._preprocessed():
                self.log("stopping after preprocessing (--stop-after preprocessing)")
                return 0
            if decision.again:
                continue
            if self._shards is not None:
                self._finish_preprocessing()
            elif self._training is not None:
                self._follow_training()
            else:
                self.log(f"the run cannot go on here: {self.body['status'].get('message') or phase}")
                return 1

    def look(self, settings: Settings = SETTINGS) -> Decision:
        """One look at the run: decide on what this machine shows, then act on it."""
        decision = look(Snapshot(copy.deepcopy(self.body), now()), decide_run, self.read, settings)
        self.act(decision)
        return decision

    def _preprocessed(self) -> bool:
        condition = get_condition(self.body["status"].get("conditions") or [], PREPROCESSED) or {}
        return condition.get("status") == "True"

    # --- observe -----------------------------------------------------------------------------------------

    def read(self, ask: Any) -> Any:
        if isinstance(ask, Child):
            found = self.children.get((ask.kind, ask.name))
            return copy.deepcopy(found) if found else None
        if isinstance(ask, Pods):
            return PodList()  # processes, not pods: nothing to diagnose or count
        if isinstance(ask, NoticedNodes):
            return {}  # one machine, no Nodes: no termination notice but its own SIGTERM
        if isinstance(ask, ServerVersion):
            return Server(*INDEXED_JOBS_SINCE, "this machine")  # shards run side by side, as in an Indexed Job
        if isinstance(ask, Document) and ask.what in PUSHED_DOCUMENTS:  # as pushed, as the operator's are
            read = Read(self.pushes.get(ask.what))
            if ask.what == PROGRESS and read.document is not None:
                self.progress = read.document
            return read
        # The keys come from the environment.
        store = Store(ask.store.endpoint, ask.store.region, clients=self.clients)
        try:
            if isinstance(ask, Document):
                return Read(parse_manifest(read_json(ask.uri, store)))
            if isinstance(ask, Listing):
                return Names(tuple(list_names(ask.uri, store)))
        except StorageError as exc:
            return Names(error=str(exc)) if isinstance(ask, Listing) else Read(error=str(exc))
        raise TypeError(f"a local run cannot read {ask!r}")

    # --- act ---------------------------------------------------------------------------------------------

    def act(self, decision: Decision) -> None:
        if decision.drop_pin_annotation:
            self.body["metadata"].get("annotations", {}).pop(pinning.PINNED_ANNOTATION, None)
        status = copy.deepcopy(dict(decision.desired))
        for action in decision.actions:
            if isinstance(action, Create):
                uid = self._create(action.obj)
                if action.uid_at:
                    section, key = action.uid_at
                    status[section] = {**(status.get(section) or {}), key: uid}
            if action.event is not None:
                self._event(action.event)
        before = get_condition(self.body["status"].get("conditions") or [], PREPROCESSED) or {}
        self.body["status"] = status
        after = get_condition(status.get("conditions") or [], PREPROCESSED) or {}
        if after.get("status") == "True" and before.get("status") != "True":
            reused = " (same fingerprint: reused)" if after.get("reason") == DATASET_REUSED else ""
            self.log(f"preprocessing done: {after.get('message')}{reused}")
        for event in decision.events:
            self._event(event)
        self.write_status()

    def _event(self, event: Event) -> None:
        self.events.append(event)
        self.log(f"{event.reason}: {event.message}")

    def _create(self, obj: dict[str, Any]) -> str:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.update(uid=f"local-{uuid.uuid4()}", ownerReferences=[owner_reference(self.body)])
        self.children[(obj["kind"], meta["name"])] = obj
        if obj["kind"] == "ConfigMap":
            config = json.loads(obj["data"][CONFIG_KEY])
            config["image"] = f"this machine's environment ({sys.executable})"  # what errors say lacks a package
            self.config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
        elif obj["kind"] == "Job" and is_parquet_table(self.run):
            self.log(f"checking the Parquet table at {self.run.spec.dataset.source}")
            self._shards = (meta["name"], Shards.start([self.commands.inspect(self.config_path)], self._env(),
                                                       self.log))
            self.seconds["started"] = time.monotonic()
        elif obj["kind"] == "Job":
            shards = obj["spec"]["completions"]
            workers = max(1, (os.cpu_count() or 1) // shards)
            plan_id = uuid.uuid4().hex
            commands = [self.commands.preprocess(self.config_path, shards, index, workers, plan_id)
                        for index in range(shards)]
            self.log(f"preprocessing: {shards} shard processes")
            self._shards = (meta["name"], Shards.start(commands, self._env(), self.log))
            self.seconds["started"] = time.monotonic()
        elif obj["kind"] == "MPIJob":
            command = self.commands.train(self.run, total_processes(self.run), self.config_path)
            self.log("training: " + " ".join(command[:4] if not self.run.spec.training.command else command))
            env = {**self._env(), **train_env(self.run, self.config_path)}
            self._training_start = (command, env, self.workdir / "logs" / meta["name"])
            self._training = (meta["name"], self._start_training())
            obj["status"] = training_status(None, rfc3339(now()))
            self.seconds["started"] = time.monotonic()
        return meta["uid"]

    def _env(self) -> dict[str, str]:
        """The pods' storage settings; the keys come from this environment instead of the Secret. --python-path
        goes first on PYTHONPATH, as the user's image would have the package."""
        env = {**os.environ, **{e["name"]: e["value"] for e in storage_env(self.run) if "value" in e},
               **self.pushes.environment()}
        paths = [str(Path(p).resolve()) for p in self.python_path] + [p for p in [env.get("PYTHONPATH")] if p]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    # --- waiting for the processes --------------------------------------------------------------------------

    def _finish_preprocessing(self) -> None:
        name, shards = self._shards
        self.children[("Job", name)]["status"] = shards.finish(rfc3339(now()))
        self.seconds["preprocessing"] = time.monotonic() - self.seconds.pop("started")
        self._shards = None

    def _follow_training(self) -> None:
        """Waits for the training, looking at its progress document and heartbeat meanwhile. A rank that fails
        ends the training (mpirun stops the others); no heartbeat for the stall timeout stops it here."""
        name, training = self._training
        code = training.wait(timeout=self.poll_seconds)
        if code is None:
            stalled = self._stall.stalled(self.pushes.get(HEARTBEAT)) if self._stall else None
            status = self._stalled(name, training, stalled) if stalled is not None else None
            if status is None:
                return  # still training (or again): the next look reads the progress so far
        else:
            status = training_status(code, rfc3339(now()), message=training.failure_message(code) if code else None)
        self.children[("MPIJob", name)]["status"] = status
        self.seconds["training"] = time.monotonic() - self.seconds.pop("started")
        self._training = None

    def _start_training(self) -> TrainingProcess:
        command, env, logs = self._training_start
        shutil.rmtree(logs, ignore_errors=True)  # an earlier attempt's rank logs would be quoted as this one's
        self._stall = StallWatch(self.run.spec.training.stall_timeout)
        return TrainingProcess.start(command, env, logs)

    def _stalled(self, name: str, training: TrainingProcess, stalled: str) -> Optional[dict]:
        """Stops the ranks; onStall restart starts the training again (it resumes from its last checkpoint), at most
        maxInterruptions times; otherwise the MPIJob status that fails the run as Stalled."""
        training.stop()
        spec = self.run.spec.training
        if spec.on_stall == "restart" and self.stall_restarts < spec.max_interruptions:
            self.stall_restarts += 1
            self.log(f"Stalled: {stalled}; the ranks were stopped and start again (onStall restart, "
                     f"{self.stall_restarts} of maxInterruptions {spec.max_interruptions}), from the last checkpoint")
            self._training = (name, self._start_training())
            return None
        why = "onStall is fail" if spec.on_stall != "restart" else f"maxInterruptions ({spec.max_interruptions}) used up"
        message = f"{stalled}; the ranks were stopped ({why}): run it again to resume from its last checkpoint"
        self.log(f"Stalled: {message}")
        return training_status(1, rfc3339(now()), reason="Stalled", message=message)

    def stop_processes(self) -> None:
        """Stops what is still running: the preprocessing's shards, mpirun and every rank."""
        if self._shards is not None:
            stopped = self._shards[1].stop()
            self._shards = None
            self.log(f"stopped the preprocessing ({stopped} processes)")
        if self._training is not None:
            stopped = self._training[1].stop()
            self._training = None
            self.log(f"stopped the training: the launcher and its ranks ({stopped} processes)")

    def write_status(self) -> None:
        status = self.body["status"]
        self.status = ScalingRunStatus.model_validate(status)
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=2))
        tmp.replace(self.status_path)

