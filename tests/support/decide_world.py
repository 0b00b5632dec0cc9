"""A world for decide's table tests: the run, its children, pods and storage documents as plain data, and
the answers to decide's asks read from it. No cluster, no storage, no clock: decide needs none."""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Optional

from scalingrun_api.status_push import HEARTBEAT
from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders import build_config_map, build_mpijob, build_preprocess_job
from scalingrun_operator.decide import pinning
from scalingrun_operator.decide.preprocessing import dataset_parameters
from scalingrun_operator.decide.run import decide_run
from scalingrun_operator.documents import parse_heartbeat, parse_manifest, parse_progress
from scalingrun_operator.decide.snapshot import (
    MANIFEST, Child, Create, Decision, Delete, Document, Listing, Log, LogTail, Names, Nodes, NoticedNodes,
    Patch, PodList, Pods, Read, Server, ServerVersion, Settings, Snapshot, look,
)
from scalingrun_operator.decide.nodes import termination_notice

NS, NAME, UID = "ml", "demo", "run-uid"
NOW = dt.datetime(2026, 1, 1, 12, 10, tzinfo=dt.timezone.utc)
SPEC = {
    "storage": {"endpoint": "http://s3.example:8333", "credentialsSecret": "creds"},
    "dataset": {"source": "s3://data/raw", "output": "s3://data/parquet", "imageSize": 32,
                "preprocessing": {"parallelism": 2}},
    "training": {"maxEpochs": 5, "backoffLimit": 2, "maxInterruptions": 2},
    "workers": {"replicas": 2, "gpusPerWorker": 0},
}
RUN = parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
                        "metadata": {"name": NAME, "namespace": NS}, "spec": SPEC})
OWNER = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "name": NAME, "uid": UID, "controller": True,
         "blockOwnerDeletion": True}


def stamp(minutes_ago: float) -> str:
    return (NOW - dt.timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": stamp(10), "observedGeneration": 1}


def owned(obj: dict[str, Any], uid: str, owner: Optional[dict] = OWNER, **status: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"].update(uid=uid, resourceVersion="7", ownerReferences=[owner] if owner else [])
    if status:
        obj["status"] = status
    return obj


def config_map(**changes: Any) -> dict[str, Any]:
    return owned({**build_config_map(RUN, NS), **changes}, "cm-uid")


def job(*conditions: dict, succeeded: int = 0, failed: int = 0, indexed: bool = True, owner: Optional[dict] = OWNER,
        completion: Optional[str] = None, **changes: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"succeeded": succeeded, "failed": failed, "conditions": list(conditions)}
    if completion:
        status["completionTime"] = completion
    obj = owned(build_preprocess_job(RUN, NS, indexed=indexed), "job-uid", owner, **status)
    obj["metadata"].update(changes)
    return obj


def done(type_: str, reason: str = "", message: str = "", minutes_ago: float = 5) -> dict[str, Any]:
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": stamp(minutes_ago)}


def mpijob(*conditions: dict, uid: str = "mpi-1", suspend: bool = False, owner: Optional[dict] = OWNER,
           completion: Optional[str] = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if completion:
        status["completionTime"] = completion
    obj = owned(build_mpijob(RUN, NS), uid, owner, **status)
    obj["spec"]["runPolicy"]["suspend"] = suspend
    return obj


def manifest(**changes: Any) -> dict[str, Any]:
    return {"fingerprint": "f" * 16, "parameters": dataset_parameters(RUN), "source": SPEC["dataset"]["source"],
            "classes": ["a", "b", "c"], "shards": 2, "written": {"train": 40, "validation": 5}, "skipped": 1,
            **changes}


def progress(state: str = "running", epoch: int = 2, **changes: Any) -> dict[str, Any]:
    return {"state": state, "epoch": epoch, "maxEpochs": 5, "metrics": {"val_accuracy": 0.75},
            "bestEpoch": epoch, "bestMetrics": {"val_accuracy": 0.75}, "processes": 2, **changes}


def _merged(defaults: list[dict], given: tuple[dict, ...]) -> list[dict]:
    """The default conditions, each replaced by a given one of its type, then the other given ones."""
    by_type = {c["type"]: c for c in given}
    return [by_type.pop(c["type"], c) for c in defaults] + list(by_type.values())


def preprocessing_status(*conditions: dict) -> dict[str, Any]:
    return {"phase": "Preprocessing", "observedGeneration": 1, "startTime": stamp(10),
            "conditions": _merged([condition("Ready", "False", "Preprocessing", "Job demo-preprocess"),
                                   condition("Preprocessed", "Unknown", "Running",
                                             "Job demo-preprocess: 0 of 2 shards done")], conditions),
            "preprocessing": {"jobName": "demo-preprocess", "reused": False, "shards": 2}}


def training_status(*conditions: dict, pods: Optional[list] = None, restarts: int = 0, **training: Any) -> dict:
    return {"phase": "Training", "observedGeneration": 1, "startTime": stamp(10),
            "conditions": _merged([condition("Ready", "False", "Training", "MPIJob demo-train"),
                                   condition("Preprocessed", "True", "Preprocessed", "Job demo-preprocess: 45 images"),
                                   condition("Trained", "Unknown", "Running", "MPIJob demo-train: epoch 1 of 5")],
                                  conditions),
            "preprocessing": {"jobName": "demo-preprocess", "reused": False, "shards": 2},
            "training": {"mpiJobName": "demo-train", "processes": 2, "maxEpochs": 5, "mpiJobUid": "mpi-1",
                         "restarts": restarts, "workerPodsLost": restarts, "launcherRestarts": 0,
                         "pods": pods if pods is not None else [], **training}}


@dataclass
class World:
    """What exists: the run's children by kind, its pods, its documents; `storage_error` makes storage unreadable."""

    status: dict[str, Any] = field(default_factory=dict)
    children: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    deleted: dict[str, str] = field(default_factory=dict)
    manifest: Optional[dict[str, Any]] = None
    progress: Optional[dict[str, Any]] = None
    heartbeat: Optional[dict[str, Any]] = None
    shards: tuple[str, ...] = ()
    log: LogTail = LogTail("line 1\nline 2", "")
    server: Server = Server(1, 27, "v1.27.3")
    storage_error: str = ""
    spec: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(SPEC))
    pinned: bool = True  # status.pinnedSpec holds SPEC
    annotations: dict[str, str] = field(default_factory=dict)
    generation: int = 1
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    asks: list = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        status = copy.deepcopy(self.status)
        if self.pinned:
            status.setdefault(pinning.PINNED_FIELD, pinning.pin(SPEC))
        return {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
                "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": self.generation,
                             "resourceVersion": "42", "creationTimestamp": stamp(11),
                             "annotations": copy.deepcopy(self.annotations)},
                "spec": self.spec, "status": status}

    def read(self, ask: Any) -> Any:
        self.asks.append(ask)
        if isinstance(ask, Child):
            found = self.children.get(ask.kind)
            return copy.deepcopy(found) if found and found["metadata"]["name"] == ask.name else None
        if isinstance(ask, Pods):
            return PodList(tuple(copy.deepcopy(self.pods)), dict(self.deleted))
        if isinstance(ask, Document):
            if self.storage_error:
                return Read(error=self.storage_error)
            document = {MANIFEST: self.manifest, HEARTBEAT: self.heartbeat}.get(ask.what, self.progress)
            parse = {MANIFEST: parse_manifest, HEARTBEAT: parse_heartbeat}.get(ask.what, parse_progress)
            return Read(parse(copy.deepcopy(document)), "v1" if ask.versioned and document else None)
        if isinstance(ask, Listing):
            return Names(error=self.storage_error) if self.storage_error else Names(self.shards)
        if isinstance(ask, Log):
            return self.log
        if isinstance(ask, ServerVersion):
            return self.server
        if isinstance(ask, Nodes):
            return {name: copy.deepcopy(self.nodes.get(name)) for name in ask.names}
        if isinstance(ask, NoticedNodes):  # as the Node watch keeps them: the tainted ones only
            return {name: copy.deepcopy(node) for name, node in self.nodes.items() if termination_notice(node)}
        raise AssertionError(f"unexpected ask {ask!r}")

    def decide(self, settings: Settings = Settings(), now: dt.datetime = NOW) -> Decision:
        return look(Snapshot(self.body(), now), decide_run, self.read, settings)


def actions(decision: Decision) -> list[tuple[str, str]]:
    """('create' | 'adopt' | 'patch', kind) per action, in order."""
    out = []
    for action in decision.actions:
        if isinstance(action, Create):
            out.append(("create", action.obj["kind"]))
        elif isinstance(action, Patch):
            out.append(("adopt" if action.adopt else "patch", action.found["kind"]))
        elif isinstance(action, Delete):
            out.append(("delete", action.found["metadata"]["name"]))
    return out


def conditions(decision: Decision) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in decision.desired.get("conditions") or []}


def merge_patched(target: dict, patch: dict) -> dict:
    """RFC 7386: what the API server makes of a JSON merge patch (a status patch decide sends)."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patched(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
