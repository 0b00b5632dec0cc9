"""Preprocessing: a JPEG tree (one folder per class) -> labelled Parquet shards with a seeded split.

Every decision about a file (in the sample? train or validation? which shard? where in its shard?) is a hash
of its path and the seed, so the result is the same whatever the number of shards. Rows are written in that
seeded order, not the tree's: each row group then mixes the classes, and the readers' shuffling buffer, which
spans only a few row groups, draws batches of mixed classes (in the tree's order a batch held one or two).
The source is listed once, by the planner (plan.py); shard i of n reads only its part of the plan. It writes its
files a part at a time (ROW_GROUPS_PER_PART row groups each), each under a temporary name first, then moved into
place and recorded under _parts/: a retried shard keeps the parts recorded and does the rest. When done, it
writes a shard manifest with its shard fingerprint (its own files, their sizes, the parameters); a shard whose
fingerprint has not changed since (a grown tree, whose new files fell in other shards) is kept as it is.
Whichever shard finds all n manifests publishes the dataset (publish.py: the dataset manifest, the stale files
removed). A rerun with the same fingerprint does nothing.

Layout under OUTPUT:
  train/part-SSSSS-of-NNNNN-<shard fp>-KKKKK.parquet, validation/...   columns image (binary, S x S x 3
                     uint8, row-major), label (int32), path (string); K: the part
  _plan/             the plan (plan.py)
  _classes.json      class names, index = label
  (manifest)         counts, parameters, fingerprint, file lists (scalingrun_api.manifest.MANIFEST_FILE)
  _shards/           one manifest per finished shard
  _parts/            shard-SSSSS-of-NNNNN-<shard fp>/<split>-KKKKK.json: the parts a running shard committed
  _heartbeat/        shard-SSSSS.json: each shard's heartbeat while it runs (scalingrun_api.heartbeat; the shard
                     index as its rank, the images done as its step)
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from scalingrun_api.manifest import MANIFEST_FILE, SHARDS_FOLDER, DatasetManifest, shard_name

from ..core.dataset import SPLITS
from ..core.heartbeat import HeartbeatWriter
from ..storage import Location, open_location
from .decoding import FETCH_AHEAD, decode_files
from .plan import Plan, PlannedFile, obtain_plan, read_json, shard_stream
from .publish import dataset_summary, finalize
from .source import Params, PreprocessError, rows_per_group

SCHEMA = pa.schema([("image", pa.binary()), ("label", pa.int32()), ("path", pa.string())])


# --- one shard -------------------------------------------------------------------------------------


# A shard commits its work a part at a time (a Parquet file of this many row groups): a retried pod redoes only
# the part it was in.
ROW_GROUPS_PER_PART = 4


@dataclass
class ShardResult:
    shard: int
    shards: int
    fingerprint: str  # the dataset's when the shard was made (another one later: the shard was reused)
    shard_fingerprint: str
    written: dict = field(default_factory=lambda: {s: 0 for s in SPLITS})
    skipped: int = 0
    skipped_files: list = field(default_factory=list)
    files: dict = field(default_factory=lambda: {s: [] for s in SPLITS})
    parts_resumed: int = 0
    seconds: float = 0.0

    def add(self, split: str, part_record: dict) -> None:
        self.written[split] += part_record["written"]
        self.skipped += len(part_record["skipped_files"])
        self.skipped_files += part_record["skipped_files"]
        if part_record["file"]:
            self.files[split].append(part_record["file"])


class _SplitWriter:
    """Streams rows into one Parquet file under a temporary name; commit() moves it into place."""

    def __init__(self, target: Location, rows_per_group: int):
        self.target = target
        # A unique temporary name: a retried shard pod may overlap with one the Job thinks is gone.
        tmp_name = f"_tmp-{uuid.uuid4().hex[:12]}-{posixpath.basename(target.path)}"
        self.tmp = target.fs, posixpath.join(posixpath.dirname(target.path), tmp_name)
        self.rows_per_group = rows_per_group
        self.buffer: list[tuple[bytes, int, str]] = []
        self.writer: Optional[pq.ParquetWriter] = None
        self.stream = None
        self.rows = 0

    def add(self, image: bytes, label: int, path: str) -> None:
        self.buffer.append((image, label, path))
        if len(self.buffer) >= self.rows_per_group:
            self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        if self.writer is None:
            fs, tmp = self.tmp
            fs.create_dir(posixpath.dirname(tmp), recursive=True)
            self.stream = fs.open_output_stream(tmp)
            self.writer = pq.ParquetWriter(self.stream, SCHEMA, compression="snappy")
        images, labels, paths = zip(*self.buffer)
        table = pa.table([pa.array(images, pa.binary()), pa.array(labels, pa.int32()), pa.array(paths)], schema=SCHEMA)
        self.writer.write_table(table, row_group_size=len(self.buffer))
        self.rows += len(self.buffer)
        self.buffer = []

    def commit(self) -> Optional[str]:
        self._flush()
        if self.writer is None:
            return None
        self.writer.close()
        self.stream.close()
        fs, tmp = self.tmp
        fs.move(tmp, self.target.path)
        return posixpath.basename(self.target.path)

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.stream.close()
            fs, tmp = self.tmp
            fs.delete_file(tmp)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def process_shard(params: Params, shard_index: int, shard_count: int, workers: Optional[int] = None,
                  plan_id: Optional[str] = None, plan: Optional[Plan] = None, fetch_ahead: int = FETCH_AHEAD) -> dict:
    """Runs shard `shard_index` of `shard_count` from the plan (made or awaited here unless given); returns the
    JSON summary (also for a no-op rerun)."""
    if not 0 <= shard_index < shard_count:
        raise PreprocessError(f"shard index {shard_index} is outside 0..{shard_count - 1}")
    started = time.monotonic()
    source = open_location(params.source, params.endpoint, params.region)
    output = open_location(params.output, params.endpoint, params.region)
    heartbeat = HeartbeatWriter(output.join("_heartbeat", f"shard-{shard_index:05d}.json"), rank=shard_index)
    if plan is None:
        plan = obtain_plan(params, source, output, shard_index, shard_count, plan_id,
                           waiting=lambda: heartbeat.beat("preprocessing", step=0))
    fp = plan.fingerprint

    manifest = DatasetManifest.read(read_json(output.join(MANIFEST_FILE)))
    if manifest and manifest.fingerprint == fp:
        return {**dataset_summary(manifest), "shard": shard_index, "shards": shard_count, "reused": True}

    shard_manifest_at = output.join(SHARDS_FOLDER, f"{shard_name(shard_index, shard_count)}.json")
    done = read_json(shard_manifest_at)
    shard_fp = plan.shards[shard_index].fingerprint
    if done and done.get("shard_fingerprint") == shard_fp:
        result = done
        _progress(f"shard {shard_index}/{shard_count}: already done for fingerprint {shard_fp} (its files unchanged)")
    else:
        result = asdict(_write_shard(params, output, plan, shard_index, workers, heartbeat, fetch_ahead))
        shard_manifest_at.write_bytes_atomic(json.dumps(result, indent=1).encode())
        for record in _parts_folder(output, shard_index, shard_count, shard_fp).files():
            output.fs.delete_file(record.path)  # the shard manifest says it all now
    result["seconds"] = round(time.monotonic() - started, 3)
    final = finalize(params, output, plan)
    return {
        "event": "preprocess",
        "shard": shard_index,
        "shards": shard_count,
        "fingerprint": fp,
        "reused": False,
        "shardReused": result is done,
        "partsResumed": 0 if result is done else result["parts_resumed"],
        "written": result["written"],
        "skipped": result["skipped"],
        "skippedFiles": result["skipped_files"][:20],
        "seconds": result["seconds"],
        "imagesPerSecond": round(sum(result["written"].values()) / max(result["seconds"], 1e-9), 1),
        "complete": final is not None,
        **({"dataset": dataset_summary(final)} if final else {}),
    }


@dataclass(frozen=True)
class _Part:
    """A run of the shard's files (whole row groups) written and committed as one Parquet file."""

    split: str
    index: int
    count: int  # its files
    rows_per_group: int


def _parts(rows: dict, shard_count: int, min_groups_per_split: int) -> list[_Part]:
    """The shard's parts in its order, cut from its planned rows per split."""
    parts = []
    for split in SPLITS:
        group = rows_per_group(rows[split], shard_count, min_groups_per_split)
        size = group * ROW_GROUPS_PER_PART
        parts += [_Part(split, k, min(size, rows[split] - start), group)
                  for k, start in enumerate(range(0, rows[split], size))]
    return parts


def _files_of(parts: list[_Part], todo: set, stream: Iterator[PlannedFile]) -> Iterator[PlannedFile]:
    """The files of the parts to do, from the shard's stream (those of committed parts are read past)."""
    for part in parts:
        for _ in range(part.count):
            planned = next(stream)
            assert planned.split == part.split, "the plan's rows disagree with its chunks"
            if part in todo:
                yield planned


def _parts_folder(output: Location, shard: int, shard_count: int, shard_fp: str) -> Location:
    return output.join("_parts", f"{shard_name(shard, shard_count)}-{shard_fp[:12]}")


def _write_shard(params: Params, output: Location, plan: Plan, shard_index: int, workers: Optional[int],
                 heartbeat: HeartbeatWriter, fetch_ahead: int) -> ShardResult:
    shard_count = len(plan.shards)
    shard_fp = plan.shards[shard_index].fingerprint
    parts = _parts(plan.shards[shard_index].rows, shard_count, 2 * params.max_readers)
    records = _parts_folder(output, shard_index, shard_count, shard_fp)
    result = ShardResult(shard_index, shard_count, plan.fingerprint, shard_fp)
    todo = []
    for part in parts:
        record = read_json(records.join(f"{part.split}-{part.index:05d}.json"))
        if record is None:
            todo.append(part)
        else:  # committed by an earlier attempt: kept, not redone
            result.add(part.split, record)
            result.parts_resumed += 1
    total = sum(p.count for p in parts)
    workers = workers or os.cpu_count() or 1
    _progress(f"shard {shard_index}/{shard_count}: {total} of {plan.source_files} files, {len(plan.classes)} "
              f"classes, {len(parts)} parts ({result.parts_resumed} committed before), {workers} processes")
    started = last_report = time.monotonic()
    done = total - sum(p.count for p in todo)
    heartbeat.beat("preprocessing", step=done)
    decoded = decode_files(_files_of(parts, set(todo), shard_stream(output, plan, shard_index)), params, workers,
                           fetch_ahead)
    for part in todo:
        name = f"part-{shard_index:05d}-of-{shard_count:05d}-{shard_fp[:12]}-{part.index:05d}.parquet"
        writer = _SplitWriter(output.join(part.split, name), part.rows_per_group)
        record = {"written": 0, "skipped_files": [], "file": None}
        try:
            for _ in range(part.count):
                planned, image, error = next(decoded)
                assert planned.split == part.split
                if image is None:
                    record["skipped_files"].append({"path": planned.path, "reason": error})
                else:
                    writer.add(image, planned.label, planned.path)
                    record["written"] += 1
                done += 1
                heartbeat.beat("preprocessing", step=done)
                now = time.monotonic()
                if now - last_report >= 2 or done == total:
                    last_report = now
                    _progress(f"shard {shard_index}/{shard_count}: {done}/{total} images "
                              f"({done / max(now - started, 1e-9):.0f} img/s)")
            committed = writer.commit()
        except BaseException:
            writer.abort()
            decoded.close()
            raise
        record["file"] = f"{part.split}/{committed}" if committed else None
        records.join(f"{part.split}-{part.index:05d}.json").write_bytes_atomic(json.dumps(record).encode())
        result.add(part.split, record)
        _progress(f"shard {shard_index}/{shard_count}: committed {part.split} part {part.index}")
    return result
