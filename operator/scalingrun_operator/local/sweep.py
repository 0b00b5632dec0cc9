"""`scalingrun sweep --local`: a ScalingSweep's points on this machine, one after another.

Each point is the same child ScalingRun the operator would create, run by the local runner
(`horovodrun -np N`). They share one preprocessed dataset: the first point writes it, laid out for the
largest point; the others find the same fingerprint and reuse it. The table and the recommendation come
from the same pure functions as the operator's status.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from scalingrun_api.models import Phase, ScalingSweep
from ..api.validation import parse_scalingrun
from ..api.sweep import Point, build_point_run, sweep_points
from ..decide.progress import training_status
from ..decide.sweep import point_row, processes_text, scaling, workers_text
from .runner import LocalRun


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

    def start(self) -> int:
        cores = usable_cores()
        code = 0
        points = sweep_points(self.sweep)
        for point in points:
            run = parse_scalingrun(build_point_run(self.sweep, point))
            note = core_note(point, points[0], cores)
            if note:
                self.notes.append(note)
                self.log(note)
            self.log(f"== point {point.name}: {workers_text(point.workers)}, {processes_text(point.processes)} ==")
            local = LocalRun(run, self.workdir / point.name, log=self.log)
            code = local.start()
            phase = local.status.phase
            progress = local.progress if phase == Phase.succeeded.value else None
            self.rows.append(point_row(point, phase, training_status(local.progress), progress))
            if code != 0:
                self.log(f"point {point.name} failed ({phase}); no further point runs")
                break
        self.rows, self.recommendation = scaling(self.sweep, self.rows)
        return code
