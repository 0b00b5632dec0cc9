"""The plan: the source listed once, and every file's shard, split and place written down, so that each shard
reads only its own part (no shard lists the source).

The planner streams the listing one class folder at a time (source.iter_source) and keeps at most
PLAN_BUFFER_ROWS planned files in memory: whenever that many are buffered, each shard's share is sorted into the
shard's order and written as the next chunk of that shard. A shard reads its chunks as one merged stream
(shard_stream: a k-way merge reading each chunk a block at a time), so its memory does not grow with its share
either. Decisions are source.assign's, as before the plan existed, so a file's split and shard
do not depend on the plan. The same tree gives the same chunks (flushes fall on the same files), so a retried
planner writes the same plan; the index is written last, and a shard trusts only an index with its plan id.

Who plans: shard 0 (or the one pod of --all-shards); with a plan id (the Job's uid in the cluster, one id per
local run) the other shards wait for the index carrying that id. Without one (a shard run by hand), each call
plans for itself.

Layout under OUTPUT/_plan/:
  index.json                          plan id, dataset fingerprint, parameters, classes, source files, and per
                                      shard: its fingerprint (its files, sizes and the parameters), chunks, rows
  shard-SSSSS-of-NNNNN/chunk-CCCCC.jsonl  [split, place, path, size, label] a line, sorted by (split, place, path)
"""

from __future__ import annotations

import heapq
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from scalingrun_api.manifest import shard_name

from ..core.dataset import SPLITS
from ..storage import Location, retrying
from .source import Fingerprint, Params, SourceError, SourceFile, assign, iter_source, list_classes

PLAN_FOLDER = "_plan"
PLAN_BUFFER_ROWS = 20_000  # planned files held before they are written out (about 7 MB of Python objects)
CHUNK_WRITERS = 8  # a flush writes one chunk per shard: this many at once
# What a shard holds of its chunks while it merges them: a block of each, this much in all (at least
# MIN_READ_BLOCK a chunk: a 14 M-image tree in 64 shards has 280 chunks a shard).
MERGE_READ_BYTES = 1 << 20
MIN_READ_BLOCK = 16 << 10
PLAN_FORMAT = 2  # 2: chunks are sorted JSON lines (1: one unsorted JSON array a chunk)
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
        return {"format": PLAN_FORMAT, "planId": self.plan_id, "fingerprint": self.fingerprint,
                "parameters": self.parameters, "source": self.source, "classes": self.classes,
                "sourceFiles": self.source_files,
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
    return output.join(PLAN_FOLDER, shard_name(shard, shard_count))


def _chunk(output: Location, shard: int, shard_count: int, chunk: int) -> Location:
    return _shard_folder(output, shard, shard_count).join(f"chunk-{chunk:05d}.jsonl")


def _order(split: str, place: int, path: str) -> tuple:
    """A shard's order: its train files, then its validation files, each by place (then path)."""
    return SPLITS.index(split), place, path


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

    def write_chunk(shard: int, planned: list) -> None:
        planned.sort(key=lambda row: _order(row[0], row[1], row[2]))
        lines = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in planned)
        _chunk(output, shard, shard_count, chunks[shard]).write_bytes_atomic(lines.encode())

    def flush() -> None:
        full = [shard for shard in range(shard_count) if buffers[shard]]
        list(writers.map(lambda shard: write_chunk(shard, buffers[shard]), full))
        for shard in full:
            chunks[shard] += 1
            buffers[shard] = []

    with ThreadPoolExecutor(CHUNK_WRITERS, thread_name_prefix="plan-chunks") as writers:
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
    if document.get("format") != PLAN_FORMAT:  # an older trainer's plan: planned again
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


def _chunk_rows(at: Location, block: int) -> Iterator[tuple]:
    """The chunk's rows in order, read a block at a time (each block retried on its own)."""
    handle = retrying("read", at.uri, lambda: at.fs.open_input_file(at.path))
    try:
        length, offset, rest = handle.size(), 0, b""
        while offset < length:
            data = retrying("read", at.uri, lambda: handle.read_at(min(block, length - offset), offset))
            offset += len(data)
            buffer, start = rest + data, 0
            end = buffer.find(b"\n")
            while end >= 0:  # line by line, without a list of the block's lines
                split, place, path, size, label = json.loads(buffer[start:end])
                yield _order(split, place, path), PlannedFile(split, place, path, size, label)
                start, end = end + 1, buffer.find(b"\n", end + 1)
            rest = buffer[start:]
        if rest.strip():
            raise ValueError(f"plan chunk {at.uri} ends without a newline: it was not written whole")
    finally:
        handle.close()


def shard_stream(output: Location, plan: Plan, shard: int) -> Iterator[PlannedFile]:
    """The shard's files in the order they are written (train, then validation; each by place, then path), merged
    from its sorted chunks: memory is a read block per chunk, whatever the shard's share of the tree."""
    shard_count, chunks = len(plan.shards), plan.shards[shard].chunks
    block = max(MIN_READ_BLOCK, MERGE_READ_BYTES // max(chunks, 1))
    streams = [_chunk_rows(_chunk(output, shard, shard_count, c), block) for c in range(chunks)]
    for _, planned in heapq.merge(*streams, key=lambda entry: entry[0]):
        yield planned
