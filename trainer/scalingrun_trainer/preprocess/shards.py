"""Preprocessing: a JPEG tree (one folder per class) -> labelled Parquet shards with a seeded split.

Every decision about a file (in the sample? train or validation? which shard? where in its shard?) is a hash
of its path and the seed, so the result is the same whatever the number of shards. Rows are written in that
seeded order, not the tree's: each row group then mixes the classes, and the readers' shuffling buffer, which
spans only a few row groups, draws batches of mixed classes (in the tree's order a batch held one or two).
Shard i of n writes only its own Parquet files, under a temporary name first, then a shard manifest; whichever
shard finds all n manifests checks the share of undecodable files over the whole dataset, writes the dataset
manifest (scalingrun_api.manifest, atomically) and removes files that an earlier run with other parameters left behind.
Readers take the file list from the manifest, so nothing is visible before it exists. A rerun with the same
fingerprint does nothing; a crashed shard can be rerun alone.

Layout under OUTPUT:
  train/part-SSSSS-of-NNNNN-<fp>.parquet, validation/...   columns image (binary, S x S x 3 uint8,
                                                           row-major), label (int32), path (string)
  _classes.json      class names, index = label
  (manifest)         counts, parameters, fingerprint, file lists (scalingrun_api.manifest.MANIFEST_FILE)
  _shards/           one manifest per finished shard
  _heartbeat/        shard-SSSSS.json: each shard's heartbeat while it runs (scalingrun_api.heartbeat; the shard
                     index as its rank, the images done as its step)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import posixpath
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from scalingrun_api.manifest import CLASSES_FILE, MANIFEST_FILE, DatasetManifest

from ..core.dataset import SPLITS
from ..core.heartbeat import HeartbeatWriter
from ..storage import Location, open_location
from .images import BadImage, scale_image
from .source import (Params, PreprocessError, SourceFile, TooManyBadFiles, assign, fingerprint, list_source,
                     rows_per_group)

SCHEMA = pa.schema([("image", pa.binary()), ("label", pa.int32()), ("path", pa.string())])


# --- decoding in worker processes ------------------------------------------------------------------

_worker_source: Optional[Location] = None


def _init_worker(source_uri: str, endpoint: Optional[str], region: Optional[str]) -> None:
    global _worker_source
    _worker_source = open_location(source_uri, endpoint, region)


def _decode(task: tuple[str, int]) -> tuple[str, Optional[bytes], Optional[str]]:
    path, side = task
    try:
        data = _worker_source.join(path).read_bytes()
        return path, scale_image(data, side), None
    except BadImage as exc:
        return path, None, str(exc)
    except OSError as exc:  # unreadable object: count it as bad, like an undecodable one
        return path, None, f"read failed: {exc}"


def _decoded(files: list[SourceFile], params: Params, workers: int) -> Iterator[tuple[str, Optional[bytes], Optional[str]]]:
    tasks = [(f.path, params.image_size) for f in files]
    init = (params.source, params.endpoint, params.region)
    if workers <= 1:
        _init_worker(*init)
        yield from map(_decode, tasks)
        return
    # spawn, not fork: the parent's S3 client threads must not be forked.
    with multiprocessing.get_context("spawn").Pool(workers, _init_worker, init) as pool:
        yield from pool.imap(_decode, tasks, chunksize=8)


# --- one shard -------------------------------------------------------------------------------------


@dataclass
class ShardResult:
    shard: int
    shards: int
    fingerprint: str
    written: dict = field(default_factory=lambda: {s: 0 for s in SPLITS})
    skipped: int = 0
    skipped_files: list = field(default_factory=list)
    files: dict = field(default_factory=lambda: {s: [] for s in SPLITS})
    seconds: float = 0.0


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


def process_shard(params: Params, shard_index: int, shard_count: int, workers: Optional[int] = None) -> dict:
    """Runs shard `shard_index` of `shard_count`; returns the JSON summary (also for a no-op rerun)."""
    if not 0 <= shard_index < shard_count:
        raise PreprocessError(f"shard index {shard_index} is outside 0..{shard_count - 1}")
    started = time.monotonic()
    source = open_location(params.source, params.endpoint, params.region)
    output = open_location(params.output, params.endpoint, params.region)
    classes, files = list_source(source)
    fp = fingerprint(params, classes, files)

    manifest = DatasetManifest.read(_read_json(output.join(MANIFEST_FILE)))
    if manifest and manifest.fingerprint == fp:
        return {**_summary_from_manifest(manifest), "shard": shard_index, "shards": shard_count, "reused": True}

    shard_manifest_at = output.join("_shards", f"shard-{shard_index:05d}-of-{shard_count:05d}.json")
    done = _read_json(shard_manifest_at)
    if done and done.get("fingerprint") == fp:
        result = done
        _progress(f"shard {shard_index}/{shard_count}: already done for fingerprint {fp}")
    else:
        result = asdict(_write_shard(params, source, output, classes, files, fp, shard_index, shard_count, workers))
        shard_manifest_at.write_bytes_atomic(json.dumps(result, indent=1).encode())
    result["seconds"] = round(time.monotonic() - started, 3)
    final = finalize(params, output, classes, files, fp, shard_count)
    return {
        "event": "preprocess",
        "shard": shard_index,
        "shards": shard_count,
        "fingerprint": fp,
        "reused": False,
        "written": result["written"],
        "skipped": result["skipped"],
        "skippedFiles": result["skipped_files"][:20],
        "seconds": result["seconds"],
        "imagesPerSecond": round(sum(result["written"].values()) / max(result["seconds"], 1e-9), 1),
        "complete": final is not None,
        **({"dataset": _summary_from_manifest(final)} if final else {}),
    }


def _write_shard(params: Params, source: Location, output: Location, classes: list[str],
                 files: list[SourceFile], fp: str, shard_index: int, shard_count: int,
                 workers: Optional[int]) -> ShardResult:
    mine: dict[str, list[tuple[int, SourceFile]]] = {s: [] for s in SPLITS}
    for f in files:
        a = assign(f.path, params.seed, params.sample_fraction, params.validation_fraction, shard_count)
        if a is not None and a.shard == shard_index:
            mine[a.split].append((a.place, f))
    for rows in mine.values():
        rows.sort(key=lambda placed: (placed[0], placed[1].path))
    result = ShardResult(shard_index, shard_count, fp)
    name = f"part-{shard_index:05d}-of-{shard_count:05d}-{fp[:12]}.parquet"
    writers = {
        split: _SplitWriter(
            output.join(split, name),
            rows_per_group(len(mine[split]), shard_count, 2 * params.max_readers),
        )
        for split in SPLITS
    }
    ordered = [(split, f) for split in SPLITS for _, f in mine[split]]
    total = len(ordered)
    workers = workers or os.cpu_count() or 1
    _progress(f"shard {shard_index}/{shard_count}: {total} of {len(files)} files, {len(classes)} classes, "
              f"{workers} processes")
    started = last_report = time.monotonic()
    heartbeat = HeartbeatWriter(output.join("_heartbeat", f"shard-{shard_index:05d}.json"), rank=shard_index)
    heartbeat.beat("preprocessing", step=0)
    try:
        for done, ((split, f), (path, image, error)) in enumerate(
            zip(ordered, _decoded([f for _, f in ordered], params, workers)), start=1
        ):
            assert path == f.path
            if image is None:
                result.skipped += 1
                result.skipped_files.append({"path": path, "reason": error})
            else:
                writers[split].add(image, f.label, path)
                result.written[split] += 1
            heartbeat.beat("preprocessing", step=done)
            now = time.monotonic()
            if now - last_report >= 2 or done == total:
                last_report = now
                _progress(f"shard {shard_index}/{shard_count}: {done}/{total} images "
                          f"({done / max(now - started, 1e-9):.0f} img/s), {result.skipped} skipped")
        for split, writer in writers.items():
            committed = writer.commit()
            if committed:
                result.files[split].append(f"{split}/{committed}")
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    return result


def finalize(params: Params, output: Location, classes: list[str], files: list[SourceFile], fp: str,
             shard_count: int) -> Optional[DatasetManifest]:
    """Writes the dataset manifest once every shard has finished; returns it, or None while shards remain."""
    shards = []
    for index in range(shard_count):
        done = _read_json(output.join("_shards", f"shard-{index:05d}-of-{shard_count:05d}.json"))
        if not done or done.get("fingerprint") != fp:
            return None
        shards.append(done)
    skipped = [x for d in shards for x in d["skipped_files"]]
    considered = sum(d["written"][s] for d in shards for s in SPLITS) + len(skipped)
    if considered and len(skipped) / considered > params.max_bad_fraction:
        # Judged on the whole dataset, not per shard; the shards stay done, so a rerun with a higher
        # maxBadFraction only repeats this step.
        raise TooManyBadFiles(
            f"{len(skipped)} of {considered} files could not be decoded (more than "
            f"maxBadFraction={params.max_bad_fraction}); no dataset was published. First: "
            + "; ".join(f"{x['path']}: {x['reason']}" for x in skipped[:3])
        )
    manifest = DatasetManifest(
        fingerprint=fp,
        parameters=params.dataset_parameters(),
        source=params.source,
        classes=classes,
        source_files=len(files),
        shards=shard_count,
        written={s: sum(d["written"][s] for d in shards) for s in SPLITS},
        skipped=len(skipped),
        skipped_files=skipped[:100],
        files={s: sorted(x for d in shards for x in d["files"][s]) for s in SPLITS},
    )
    output.join(CLASSES_FILE).write_bytes_atomic(json.dumps(classes).encode())
    output.join(MANIFEST_FILE).write_bytes_atomic(json.dumps(manifest.document(), indent=1).encode())
    _remove_stale(output, manifest)
    return manifest


def _remove_stale(output: Location, manifest: DatasetManifest) -> None:
    """Deletes Parquet files and shard manifests that are not part of this dataset."""
    keep = {posixpath.join(output.path, f) for s in SPLITS for f in manifest.files[s]}
    for folder in (*SPLITS, "_shards"):
        for info in _listing(output.join(folder)):
            if folder == "_shards":
                stale = f"-of-{manifest.shards:05d}.json" not in info.base_name
            else:
                stale = info.path not in keep and not info.base_name.startswith("_tmp-")
            if stale:
                output.fs.delete_file(info.path)


def _listing(location: Location) -> list[pafs.FileInfo]:
    if not location.exists():
        return []
    return [i for i in location.fs.get_file_info(pafs.FileSelector(location.path)) if i.type == pafs.FileType.File]


def _read_json(location: Location) -> Optional[dict]:
    try:
        return json.loads(location.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as exc:
        if "NoSuchKey" in str(exc) or "not found" in str(exc).lower() or "Path does not exist" in str(exc):
            return None
        raise


def _summary_from_manifest(manifest: DatasetManifest) -> dict:
    return {
        "event": "preprocess",
        "fingerprint": manifest.fingerprint,
        "classes": len(manifest.classes),
        "written": manifest.written,
        "skipped": manifest.skipped,
        "complete": True,
    }
