"""The plan: the source listed once, and every file's shard, split and place written down, so that each shard
reads only its own part (no shard lists the source).

The planner streams the listing one class folder at a time (source.iter_source) and keeps at most
PLAN_BUFFER_ROWS planned files in memory: whenever that many are buffered, each shard's share is written as the
next chunk of that shard. Decisions are source.assign's, as before the plan existed, so a file's split and shard
do not depend on the plan. The same tree gives the same chunks (flushes fall on the same files), so a retried
planner writes the same plan; the index is written last, and a shard trusts only an index with its plan id.

Who plans: shard 0 (or the one pod of --all-shards); with a plan id (the Job's uid in the cluster, one id per
local run) the other shards wait for the index carrying that id. Without one (a shard run by hand), each call
plans for itself.

Layout under OUTPUT/_plan/:
  index.json                          plan id, dataset fingerprint, parameters, classes, source files, and per
                                      shard: its fingerprint (its files, sizes and the parameters), chunks, rows
  shard-SSSSS-of-NNNNN/chunk-CCCCC.json  [split, place, path, size, label] of the shard's files, chunk by chunk
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ..core.dataset import SPLITS
from ..storage import Location
from .source import Fingerprint, Params, SourceError, SourceFile, assign, iter_source, list_classes

PLAN_FOLDER = "_plan"
PLAN_BUFFER_ROWS = 50_000  # planned files held before they are written out (about 10 MB of Python objects)
WAIT_POLL_SECONDS = 2.0


@dataclass(frozen=True)
class PlannedFile:
    split: str
    place: int
    path: str
    size: int
    label: int


@dataclass(frozen=True)
class ShardPlan:
    fingerprint: str  # changes only when the shard's own files (or the parameters, classes, shard count) change
    chunks: int
    rows: dict  # planned files per split


@dataclass(frozen=True)
class Plan:
    plan_id: Optional[str]
    fingerprint: str
    parameters: dict
    source: str
    classes: list
    source_files: int
    shards: list  # of ShardPlan

    def document(self) -> dict:
        return {"planId": self.plan_id, "fingerprint": self.fingerprint, "parameters": self.parameters,
                "source": self.source, "classes": self.classes, "sourceFiles": self.source_files,
                "shards": [{"fingerprint": s.fingerprint, "chunks": s.chunks, "rows": s.rows} for s in self.shards]}

    @classmethod
    def read(cls, document: dict) -> "Plan":
        return cls(document.get("planId"), document["fingerprint"], document["parameters"], document["source"],
                   document["classes"], document["sourceFiles"],
                   [ShardPlan(s["fingerprint"], s["chunks"], s["rows"]) for s in document["shards"]])


def read_json(location: Location) -> Optional[dict]:
    """The JSON document there, or None when there is none."""
    try:
        return json.loads(location.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as exc:
        if "NoSuchKey" in str(exc) or "not found" in str(exc).lower() or "Path does not exist" in str(exc):
            return None
        raise


def _shard_folder(output: Location, shard: int, shard_count: int) -> Location:
    return output.join(PLAN_FOLDER, f"shard-{shard:05d}-of-{shard_count:05d}")


def write_plan(params: Params, source: Location, output: Location, shard_count: int,
               plan_id: Optional[str]) -> Plan:
    """Lists the source once and writes the plan (chunks, then the index); returns it."""
    started = time.monotonic()
    classes = list_classes(source)
    parameters = params.dataset_parameters()
    whole = Fingerprint(parameters, classes)
    per_shard = [Fingerprint({**parameters, "shards": shard_count, "shard": i}, classes) for i in range(shard_count)]
    buffers: list[list] = [[] for _ in range(shard_count)]
    chunks = [0] * shard_count
    rows = [{split: 0 for split in SPLITS} for _ in range(shard_count)]
    buffered = listed = 0

    def flush() -> None:
        for shard, buffer in enumerate(buffers):
            if buffer:
                at = _shard_folder(output, shard, shard_count).join(f"chunk-{chunks[shard]:05d}.json")
                at.write_bytes_atomic(json.dumps(buffer, separators=(",", ":")).encode())
                chunks[shard] += 1
                buffer.clear()

    for f in iter_source(source, classes):
        listed += 1
        whole.add(f)
        a = assign(f.path, params.seed, params.sample_fraction, params.validation_fraction, shard_count)
        if a is None:
            continue
        per_shard[a.shard].add(f)
        buffers[a.shard].append([a.split, a.place, f.path, f.size, f.label])
        rows[a.shard][a.split] += 1
        buffered += 1
        if buffered >= PLAN_BUFFER_ROWS:
            flush()
            buffered = 0
    if not listed:
        raise SourceError(f"source {source.uri} has no class folders with files (expected SOURCE/<class>/<image>)")
    flush()
    plan = Plan(plan_id, whole.hexdigest(), parameters, params.source, classes, listed,
                [ShardPlan(per_shard[i].hexdigest(), chunks[i], rows[i]) for i in range(shard_count)])
    output.join(PLAN_FOLDER, "index.json").write_bytes_atomic(json.dumps(plan.document(), indent=1).encode())
    print(f"plan: {listed} files in {len(classes)} classes listed and planned into {shard_count} shards in "
          f"{time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return plan


def read_plan(output: Location, params: Params, shard_count: int, plan_id: Optional[str]) -> Optional[Plan]:
    """The plan of this id for these parameters and shard count; None when there is none (yet)."""
    document = read_json(output.join(PLAN_FOLDER, "index.json"))
    if document is None:
        return None
    plan = Plan.read(document)
    if (plan.plan_id != plan_id or plan.parameters != params.dataset_parameters() or plan.source != params.source
            or len(plan.shards) != shard_count):
        return None
    return plan


def obtain_plan(params: Params, source: Location, output: Location, shard_index: int, shard_count: int,
                plan_id: Optional[str], waiting: Callable[[], None] = lambda: None) -> Plan:
    """Shard 0 (or any shard without a plan id) plans, unless this id's plan is there already; the others wait
    for it, calling `waiting()` between looks (a heartbeat)."""
    if plan_id is None:
        return write_plan(params, source, output, shard_count, plan_id)
    found = read_plan(output, params, shard_count, plan_id)
    if found is not None:
        return found
    if shard_index == 0:
        return write_plan(params, source, output, shard_count, plan_id)
    print(f"shard {shard_index}/{shard_count}: waiting for shard 0's plan ({plan_id})", file=sys.stderr, flush=True)
    while found is None:  # bounded by the Job: shard 0 retries, or the Job fails and stops this pod
        waiting()
        time.sleep(WAIT_POLL_SECONDS)
        found = read_plan(output, params, shard_count, plan_id)
    return found


def shard_files(output: Location, plan: Plan, shard: int) -> dict[str, list[PlannedFile]]:
    """The shard's files per split, in the order they are written (by place, then path)."""
    shard_count = len(plan.shards)
    mine: dict[str, list[PlannedFile]] = {split: [] for split in SPLITS}
    for chunk in range(plan.shards[shard].chunks):
        at = _shard_folder(output, shard, shard_count).join(f"chunk-{chunk:05d}.json")
        for split, place, path, size, label in json.loads(at.read_bytes()):
            mine[split].append(PlannedFile(split, place, path, size, label))
    for files in mine.values():
        files.sort(key=lambda f: (f.place, f.path))
    return mine
