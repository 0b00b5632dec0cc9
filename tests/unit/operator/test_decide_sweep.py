"""decide_sweep as a table: the sweep's last status and its points' ScalingRuns (and progress documents) in, the
points to create, the rows, the phase and the recommendation out."""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pytest

from scalingrun_operator.schema.sweep import build_point_run, sweep_points
from scalingrun_operator.schema.validation import parse_scalingsweep
from scalingrun_operator.decide.snapshot import Child, Create, Document, Read, Settings, Snapshot, look
from scalingrun_operator.decide.sweep import decide_sweep
from scalingrun_operator.documents import parse_progress

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
SWEEP = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingSweep",
         "metadata": {"name": "scale", "namespace": "ml", "uid": "sweep-uid", "generation": 1, "resourceVersion": "3"},
         "spec": {"workers": [1, 2, 4], "template": {
             "storage": {"endpoint": "http://s3.example:8333", "credentialsSecret": "creds"},
             "dataset": {"source": "s3://data/raw", "output": "s3://data/parquet"},
             "workers": {"gpusPerWorker": 0}}}}
PARSED = parse_scalingsweep(SWEEP)
POINTS = sweep_points(PARSED)
SWEEP_REF = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingSweep", "name": "scale", "uid": "sweep-uid",
             "controller": True}
OTHER_REF = {**SWEEP_REF, "name": "other", "uid": "other-uid"}


def point(index: int, phase: Optional[str] = None, preprocessed: bool = False, owner: Optional[dict] = SWEEP_REF,
          seconds_per_epoch: float = 10.0, accuracy: float = 0.8) -> dict[str, Any]:
    run = build_point_run(PARSED, POINTS[index], "ml")
    run["metadata"].update(uid=f"p{index}", ownerReferences=[owner] if owner else [])
    conditions = [{"type": "Preprocessed", "status": "True" if preprocessed else "Unknown", "reason": "x"}]
    run["status"] = {"phase": phase, "conditions": conditions,
                     "training": {"epoch": 2, "bestMetrics": {"val_accuracy": accuracy}}} if phase else {}
    run["_seconds"] = seconds_per_epoch
    return run


@dataclass
class World:
    points: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(SWEEP["spec"]))

    def read(self, ask: Any) -> Any:
        if isinstance(ask, Child):
            found = copy.deepcopy(self.points.get(ask.name))
            if found:
                found.pop("_seconds")
            return found
        if isinstance(ask, Document):
            name = ask.uri.split("/runs/")[1].split("/")[0]
            seconds = self.points[name]["_seconds"]
            return Read(parse_progress({"state": "succeeded", "epoch": 2, "elapsedSeconds": 2 * seconds,
                                        "history": [{"imagesPerSecond": 100.0}]}))
        raise AssertionError(ask)

    def decide(self):
        body = {**copy.deepcopy(SWEEP), "spec": self.spec, "status": copy.deepcopy(self.status)}
        return look(Snapshot(body, NOW), decide_sweep, self.read, Settings())


@dataclass
class Row:
    name: str
    world: Callable[[], World]
    phase: str
    actions: list[tuple[str, str]]
    message: str
    events: list[str] = field(default_factory=list)
    check: Optional[Callable[[Any], Any]] = None


def _actions(decision) -> list[tuple[str, str]]:
    return [("create" if isinstance(a, Create) else "adopt" if a.adopt else "patch",
             (a.obj if isinstance(a, Create) else a.found)["metadata"]["name"]) for a in decision.actions]


def _points(**points: dict) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in points.values()}


ROWS = [
    Row("a new sweep creates its first point alone", World, "Running", [("create", "scale-w1")],
        "running: scale-w1 (created)", ["Running"],
        check=lambda d: d.actions[0].event.reason == "PointCreated"),
    Row("the others wait for the first point's dataset",
        lambda: World(_points(a=point(0, "Preprocessing"))), "Running", [], "running: scale-w1 (Preprocessing)",
        ["Running"]),
    Row("one point at a time by default: the next waits while the first trains",
        lambda: World(_points(a=point(0, "Training", preprocessed=True))), "Running", [],
        "running: scale-w1 (Training)", ["Running"]),
    Row("with maxParallel 2 the next point starts once the first one's dataset is there",
        lambda: World(_points(a=point(0, "Training", preprocessed=True)),
                      spec={**copy.deepcopy(SWEEP["spec"]), "maxParallel": 2}),
        "Running", [("create", "scale-w2")], "running: scale-w1 (Training), scale-w2 (created)", ["Running"]),
    Row("a finished point lets the next one start",
        lambda: World(_points(a=point(0, "Succeeded", preprocessed=True))), "Running", [("create", "scale-w2")],
        "running: scale-w2 (created)", ["Running"]),
    Row("a failed point stops the sweep and says which",
        lambda: World(_points(a=point(0, "Succeeded", True), b=point(1, "Failed", True))), "Failed", [],
        "point scale-w2 (2 workers) failed", ["Failed"],
        check=lambda d: {c["type"]: c["reason"] for c in d.desired["conditions"]}["Failed"] == "PointFailed"),
    Row("every point done: the table, speedup, efficiency and the recommendation",
        lambda: World(_points(a=point(0, "Succeeded", True, seconds_per_epoch=10.0),
                              b=point(1, "Succeeded", True, seconds_per_epoch=5.5),
                              c=point(2, "Succeeded", True, seconds_per_epoch=5.0))),
        "Succeeded", [], "all 3 points succeeded; recommended: 2 workers (2 processes)", ["Succeeded"],
        check=lambda d: ([r["speedup"] for r in d.desired["points"]] == [1.0, 1.818, 2.0]
                         and d.desired["recommendation"]["run"] == "scale-w2"
                         and "4 workers: efficiency 0.50 < 0.7" in d.desired["recommendation"]["message"])),
    Row("an invalid sweep fails naming the field",
        lambda: World(spec={**copy.deepcopy(SWEEP["spec"]), "workers": [2, 2]}), "Failed", [],
        "InvalidSpec: spec.workers: worker counts must be unique", ["Failed"]),
    Row("a point's name held by a run the sweep does not control is left alone, and said",
        lambda: World(_points(a=point(0, "Training", owner=OTHER_REF))), "Pending", [],
        "creating the first point", ["ChildConflict", "Pending"],
        check=lambda d: {c["type"]: c["message"] for c in d.desired["conditions"]}["ChildConflict"].startswith(
            "ScalingRun scale-w1 already exists in namespace ml and belongs to ScalingSweep other")
        and d.recheck_in == 10),
    Row("an orphaned point with the sweep's labels is adopted",
        lambda: World(_points(a=point(0, "Preprocessing", owner=None))), "Running", [("adopt", "scale-w1")],
        "running: scale-w1 (Preprocessing)", ["Running"]),
    Row("a finished sweep is left as it is",
        lambda: World(status={"phase": "Succeeded", "observedGeneration": 1}), "Succeeded", [], "",
        check=lambda d: d.status is None),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_decide_sweep(row: Row):
    decision = row.world().decide()
    assert decision.phase == row.phase
    assert _actions(decision) == row.actions
    assert row.message in (decision.desired.get("message") or ""), decision.desired.get("message")
    assert [e.reason for e in decision.events] == row.events
    if row.check:
        assert row.check(decision)
