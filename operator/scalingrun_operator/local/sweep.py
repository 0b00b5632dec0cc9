"""`scalingrun sweep --local`: a ScalingSweep's points on this machine, one after another, decided by the
operator's decide (decide.sweep).

Each point is the same child ScalingRun the operator would create, run by the local runner (N training
processes under the engine's launcher: horovodrun or mpirun). They share one preprocessed dataset: the first
point writes it, laid out for the largest point; the others find it there and reuse it. The sweep's status (its
rows, phase and recommendation) is the operator's, written to `<workdir>/status.json`. A point's progress is what its
processes pushed to its runner (as the operator's sweep reads its points' pushed progress), not read from storage.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from scalingrun_api.models import KIND, SWEEP_KIND, ScalingSweep, SweepPhase
from scalingrun_api.status_push import PROGRESS
from ..schema.sweep import Point, sweep_points
from ..schema.validation import parse_scalingrun
from ..clock import now
from ..decide.children import owner_reference
from ..decide.snapshot import Child, Create, Document, Read, Snapshot, look
from ..decide.sweep import decide_sweep, processes_text, workers_text
from .runner import SETTINGS, LocalRun


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def oversubscribed_note(processes: int, cores: int) -> str:
    return (f"note: {processes} processes on {cores} CPU cores: more processes than cores, so this point cannot "
            "scale and its speedup and efficiency show that (a correct answer for this machine, not the model's "
            "limit); run the sweep where each process has its own GPU or cores")


def shared_cores_note(processes: int, first: int, cores: int) -> str:
    return (f"note: {processes} CPU processes share this machine's {cores} cores, the same compute as the first "
            f"point's {first} (TensorFlow spreads one process over every core already): expect a speedup near 1 "
            "here, which is this machine's answer, not the model's limit; a clearly different figure means the "
            "machine's load changed between the points. On GPUs or more nodes each process brings its own.")


def core_note(point: Point, first: Point, cores: int) -> str:
    """What the output must say when a local point cannot scale for lack of cores ('' when it can)."""
    if point.processes > cores:
        return oversubscribed_note(point.processes, cores)
    if point.gpus_per_worker == 0 and point.processes > first.processes:
        return shared_cores_note(point.processes, first.processes, cores)
    return ""


@dataclass
class LocalSweep:
    sweep: ScalingSweep
    workdir: Path
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    rows: list[dict] = field(default_factory=list)
    recommendation: Optional[dict] = None
    notes: list[str] = field(default_factory=list)
    python_path: tuple[str, ...] = ()  # --python-path: handed to every point

    def __post_init__(self) -> None:
        meta = self.sweep.metadata
        self.body: dict[str, Any] = {
            "apiVersion": self.sweep.api_version, "kind": SWEEP_KIND,
            "metadata": {"name": meta.name, "namespace": meta.namespace or "default", "generation": 1,
                         "uid": f"local-{uuid.uuid4()}"},
            "spec": self.sweep.spec.model_dump(mode="json", by_alias=True, exclude_none=True), "status": {}}
        self.points: dict[str, LocalRun] = {}

    def start(self) -> int:
        """Runs the points decide starts, one at a time, until it starts none; 0 when the sweep Succeeded."""
        cores, points = usable_cores(), {p.name: p for p in sweep_points(self.sweep)}
        first = next(iter(points.values()))
        while True:
            decision = look(Snapshot(copy.deepcopy(self.body), now()), decide_sweep, self.read, SETTINGS)
            self.body["status"] = copy.deepcopy(dict(decision.desired))
            self.write_status()
            created = [a for a in decision.actions if isinstance(a, Create)]
            if not created:
                break
            point = points[created[0].obj["metadata"]["name"]]
            note = core_note(point, first, cores)
            if note:
                self.notes.append(note)
                self.log(note)
            self.log(f"== point {point.name}: {workers_text(point.workers)}, {processes_text(point.processes)} ==")
            run = parse_scalingrun(created[0].obj)
            local = self.points[point.name] = LocalRun(run, self.workdir / point.name, log=self.log,
                                                       python_path=self.python_path)
            local.body["metadata"]["ownerReferences"] = [owner_reference(self.body)]
            if local.start() != 0:
                self.log(f"point {point.name} failed ({local.status.phase})")
        status = self.body["status"]
        self.rows, self.recommendation = list(status.get("points") or []), status.get("recommendation")
        return 0 if status.get("phase") == SweepPhase.succeeded.value else 1

    def read(self, ask: Any) -> Any:
        if isinstance(ask, Child) and ask.kind == KIND:
            local = self.points.get(ask.name)
            return copy.deepcopy(local.body) if local else None
        if isinstance(ask, Document) and ask.what == PROGRESS:
            local = self.points.get(ask.run or "")
            return Read(local.progress if local else None)
        raise TypeError(f"a local sweep cannot read {ask!r}")

    def write_status(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "status.json").write_text(json.dumps(self.body["status"], indent=2))
