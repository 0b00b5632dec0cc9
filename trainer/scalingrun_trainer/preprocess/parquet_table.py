"""dataset.format parquet: a Parquet table written by another tool (pyarrow, Spark, Delta Lake's files) is checked
and described in the same manifest our preprocessing writes, so that the trainers, the SDK, the operator's status
and sweeps read it unchanged. Nothing is copied or rewritten.

Layout under SOURCE:
  train/**/*.parquet, validation/**/*.parquet   columns IMAGE (binary or fixed-size binary: imageSize x imageSize x 3
                                                uint8 RGB, row-major) and LABEL (an integer 0 .. classes - 1)
  _classes.json                                 optional: the class names, index = label (our preprocessing's file)
Files and folders whose name starts with "_" or "." (Delta Lake's _delta_log, Spark's _SUCCESS) are not read.

The check (`scalingrun-trainer inspect`, the Job in the preprocessing Job's place): every file's schema has both
columns with those types; each split's first row group holds images of exactly imageSize x imageSize x 3 bytes;
labels have no nulls and lie in 0 .. classes - 1; every split has a row group for each process (else training
could not shard it: an error) and at least 2 per process (else a warning: "at least as many partitions as GPUs",
with room to shuffle); training rows in class order are a warning too (the readers shuffle across a few row
groups at a time, so their batches would hold one or two classes). Then the dataset manifest (scalingrun_api.manifest, with
"dataRoot": SOURCE and "columns").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from scalingrun_api.manifest import (
    CLASSES_FILE, MANIFEST_FILE, TABLE_FORMAT, DatasetManifest, table_dataset_parameters,
)

from ..core.dataset import SPLITS
from ..storage import Location, open_location
from .source import PreprocessError, SourceError

LABEL_TYPES = (pa.int8(), pa.uint8(), pa.int16(), pa.int32(), pa.int64())  # what the readers take as labels
MIN_ROWS_TO_JUDGE_ORDER = 100  # fewer rows say little about their order


class TableError(PreprocessError):
    """The table does not fit the run; the message names the column (or file) and what to do."""

    exit_code = 5


@dataclass(frozen=True)
class TableParams:
    source: str
    output: str
    image_size: int
    image_column: str = "image"
    label_column: str = "label"
    readers: int = 1  # processes that will read it
    endpoint: Optional[str] = None
    region: Optional[str] = None

    def dataset_parameters(self) -> dict:
        """What the manifest is valid for (scalingrun_api.manifest, the operator's too)."""
        return table_dataset_parameters(image_size=self.image_size, image_column=self.image_column,
                                        label_column=self.label_column, readers=self.readers)


@dataclass
class SplitFacts:
    files: list[str] = field(default_factory=list)  # relative to the source
    sizes: list[int] = field(default_factory=list)
    rows: int = 0
    row_groups: int = 0
    max_label: int = -1
    label_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    neighbours: int = 0  # pairs of consecutive rows within a file
    same_label_neighbours: int = 0

    def share_of_neighbours_alike(self) -> tuple[float, float]:
        """Consecutive rows with the same label: the share in the files' order, and what a random order would give
        (the sum of the squared class shares)."""
        shares = self.label_counts / max(self.label_counts.sum(), 1)
        return self.same_label_neighbours / max(self.neighbours, 1), float(np.sum(shares ** 2))


def list_split(source: Location, split: str) -> tuple[list[str], list[int]]:
    """The split's Parquet files (relative paths, sorted) and their sizes."""
    folder = source.join(split)
    if folder.fs.get_file_info(folder.path).type != pafs.FileType.Directory:
        raise SourceError(f"{folder.uri} is not a folder: dataset.format parquet reads SOURCE/train/ and "
                          "SOURCE/validation/ (Parquet files in each)")
    prefix = source.path.rstrip("/") + "/"
    found = []
    for info in folder.fs.get_file_info(pafs.FileSelector(folder.path, recursive=True)):
        relative = info.path[len(prefix):]
        hidden = any(part.startswith(("_", ".")) for part in relative.split("/"))
        if info.type == pafs.FileType.File and relative.endswith(".parquet") and not hidden:
            found.append((relative, info.size))
    if not found:
        raise SourceError(f"{folder.uri} holds no *.parquet files")
    found.sort()
    return [f for f, _ in found], [s for _, s in found]


def _check_schema(schema: pa.Schema, uri: str, params: TableParams) -> None:
    names = schema.names
    for role, column in (("image", params.image_column), ("label", params.label_column)):
        if column not in names:
            raise TableError(f"spec.dataset.columns.{role}: column {column!r} is not in {uri} (its columns: "
                             f"{', '.join(names)}); name the {role} column in spec.dataset.columns.{role}")
    image_type = schema.field(params.image_column).type
    if not (pa.types.is_binary(image_type) or pa.types.is_fixed_size_binary(image_type)):
        raise TableError(f"spec.dataset.columns.image: column {params.image_column!r} in {uri} is {image_type}; it must "
                         f"be binary: the {params.image_size} x {params.image_size} x 3 uint8 RGB pixels of each image "
                         "(numpy: image.tobytes())")
    if pa.types.is_fixed_size_binary(image_type) and image_type.byte_width != params.image_size ** 2 * 3:
        raise TableError(_shape_message(params, uri, image_type.byte_width))
    label_type = schema.field(params.label_column).type
    if label_type not in LABEL_TYPES:
        raise TableError(f"spec.dataset.columns.label: column {params.label_column!r} in {uri} is {label_type}; it "
                         f"must be an integer class index ({', '.join(str(t) for t in LABEL_TYPES)})")


def _shape_message(params: TableParams, uri: str, length: int) -> str:
    side = int(round((length / 3) ** 0.5))
    looks = f" (that is {side} x {side} x 3)" if side * side * 3 == length else ""
    return (f"spec.dataset.columns.image: images in column {params.image_column!r} of {uri} have {length} bytes"
            f"{looks}; spec.dataset.imageSize {params.image_size} needs {params.image_size ** 2 * 3} "
            f"({params.image_size} x {params.image_size} x 3 uint8 RGB): set imageSize to the table's side")


def _inspect_file(location: Location, params: TableParams, facts: SplitFacts, first: bool) -> None:
    with location.fs.open_input_file(location.path) as f:
        parquet = pq.ParquetFile(f)
        _check_schema(parquet.schema_arrow, location.uri, params)
        metadata = parquet.metadata
        facts.rows += metadata.num_rows
        facts.row_groups += metadata.num_row_groups
        labels = parquet.read(columns=[params.label_column]).column(0)
        if labels.null_count:
            raise TableError(f"spec.dataset.columns.label: column {params.label_column!r} of {location.uri} has "
                             f"{labels.null_count} empty (null) labels; every row needs a class index")
        if len(labels):
            low, high = pc.min_max(labels).values()
            if low.as_py() < 0:
                raise TableError(f"spec.dataset.columns.label: column {params.label_column!r} of {location.uri} "
                                 f"has label {low.as_py()}; labels are class indexes 0 .. classes - 1")
            facts.max_label = max(facts.max_label, high.as_py())
            values = labels.to_numpy()
            counts = np.bincount(values, minlength=len(facts.label_counts))
            counts[:len(facts.label_counts)] += facts.label_counts
            facts.label_counts = counts
            facts.neighbours += len(values) - 1
            facts.same_label_neighbours += int(np.count_nonzero(values[1:] == values[:-1]))
        if first and metadata.num_row_groups and not pa.types.is_fixed_size_binary(
                parquet.schema_arrow.field(params.image_column).type):
            images = parquet.read_row_group(0, columns=[params.image_column]).column(0)
            lengths = pc.binary_length(images)
            wanted = params.image_size ** 2 * 3
            wrong = pc.filter(lengths, pc.not_equal(lengths, wanted))
            if len(wrong) or images.null_count:
                raise TableError(_shape_message(params, location.uri, wrong[0].as_py() if len(wrong) else 0))


def inspect_table(params: TableParams) -> DatasetManifest:
    """Checks the table; returns the dataset manifest (not yet written). Raises TableError/SourceError naming
    the column or file."""
    source = open_location(params.source, params.endpoint, params.region)
    facts = {split: SplitFacts() for split in SPLITS}
    for split in SPLITS:
        files, sizes = list_split(source, split)
        facts[split].files, facts[split].sizes = files, sizes
        for index, name in enumerate(files):
            _inspect_file(source.join(name), params, facts[split], first=index == 0)
        if facts[split].rows == 0:
            raise TableError(f"{source.join(split).uri} has no rows")
    count = max(f.max_label for f in facts.values()) + 1
    if count < 2:
        raise TableError(f"spec.dataset.columns.label: column {params.label_column!r} has only label 0: a classifier "
                         "needs at least 2 classes")
    classes = _classes(source, count)
    warnings = []
    for split in SPLITS:
        groups = facts[split].row_groups
        if groups < params.readers:
            raise TableError(f"{split}: {groups} row groups for {params.readers} processes, so some would get no "
                             f"data (Petastorm shards by row group): write the table with more, smaller row groups "
                             f"(pyarrow: pq.write_table(..., row_group_size=N)), at least {2 * params.readers}")
        if groups < 2 * params.readers:
            warnings.append(f"{split} has {groups} row groups for {params.readers} processes: fewer than 2 per "
                            "process leaves little to shuffle and to balance; write smaller row groups")
    alike, at_random = facts["train"].share_of_neighbours_alike()
    if facts["train"].neighbours >= MIN_ROWS_TO_JUDGE_ORDER and alike > (1 + at_random) / 2:
        warnings.append(f"train: {alike:.0%} of consecutive rows have the same label ({at_random:.0%} in a random "
                        "order): the rows look sorted by class, and the readers shuffle across a few row groups at "
                        "a time, so batches would hold one or two classes and train worse; write the rows in a "
                        "random order (pyarrow: table.take(numpy.random.default_rng(0).permutation(len(table))))")
    digest = hashlib.sha256(json.dumps(params.dataset_parameters(), sort_keys=True).encode())
    digest.update(json.dumps(classes).encode())
    for split in SPLITS:
        for name, size in zip(facts[split].files, facts[split].sizes):
            digest.update(f"{name}\0{size}\n".encode())
    return DatasetManifest(
        fingerprint=digest.hexdigest()[:24],
        parameters=params.dataset_parameters(),
        source=params.source,
        format=TABLE_FORMAT,
        data_root=params.source,
        columns={"image": params.image_column, "label": params.label_column},
        classes=classes,
        source_files=sum(len(f.files) for f in facts.values()),
        written={split: facts[split].rows for split in SPLITS},
        skipped=0,
        skipped_files=[],
        files={split: facts[split].files for split in SPLITS},
        row_groups={split: facts[split].row_groups for split in SPLITS},
        warnings=warnings,
    )


def _classes(source: Location, count: int) -> list[str]:
    """The names in SOURCE/_classes.json when there is one, else "0" .. "count - 1"."""
    at = source.join(CLASSES_FILE)
    if not at.exists():
        return [str(index) for index in range(count)]
    try:
        names = json.loads(at.read_bytes())
    except ValueError as exc:
        raise TableError(f"{at.uri} is not JSON ({exc}): it must be a list of class names, index = label") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TableError(f"{at.uri} must be a JSON list of class names (index = label)")
    if len(names) < count:
        raise TableError(f"spec.dataset.columns.label: the table has label {count - 1} but {at.uri} names only "
                         f"{len(names)} classes")
    return names


def forget_manifest(params: TableParams) -> None:
    """After a failed check: a manifest an earlier check wrote for this table no longer describes it."""
    at = open_location(params.output, params.endpoint, params.region).join(MANIFEST_FILE)
    try:
        manifest = DatasetManifest.read(json.loads(at.read_bytes()))
        if manifest is not None and manifest.source == params.source:
            at.fs.delete_file(at.path)
    except (FileNotFoundError, ValueError):
        pass


def write_manifest(params: TableParams, manifest: DatasetManifest) -> None:
    output = open_location(params.output, params.endpoint, params.region)
    output.join(CLASSES_FILE).write_bytes_atomic(json.dumps(manifest.classes).encode())
    output.join(MANIFEST_FILE).write_bytes_atomic(json.dumps(manifest.document(), indent=1).encode())


def summary(manifest: DatasetManifest) -> dict:
    """The JSON line the check prints last (the preprocessing's summary shape, for the local runner)."""
    return {"event": "inspect", "fingerprint": manifest.fingerprint, "classes": len(manifest.classes),
            "written": manifest.written, "skipped": 0, "rowGroups": manifest.row_groups,
            "warnings": manifest.warnings, "complete": True,
            "dataset": {"fingerprint": manifest.fingerprint, "classes": len(manifest.classes),
                        "written": manifest.written, "skipped": 0}}
