"""The dataset manifest, `<dataset.output>/_manifest.json`: the preprocessing (scalingrun_trainer.preprocess) or a
Parquet table's check (scalingrun_trainer.preprocess.parquet_table) writes it last, once the dataset is complete; the trainer
opens the dataset from it, and the operator decides from it whether a dataset can be reused and mirrors it into
status.preprocessing.

Its keys are the fields of `DatasetManifest` (camelCase on the wire) and are written nowhere else: writers fill the
model and write `document()`; readers call `DatasetManifest.read(document)`, which keeps every valid field and
leaves out a value of the wrong type (the field keeps its default), so that one junk value never hides the rest.

Its `parameters` (what a dataset's content depends on, and so whether one can be reused) are defined here once, by
`image_dataset_parameters` and `table_dataset_parameters`: the trainer's preprocessing records them, the operator and
the local runner compare a run's against them. A change of the content's layout bumps its format version here.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from .models.dataset import DatasetFormat

MANIFEST_FILE = "_manifest.json"
CLASSES_FILE = "_classes.json"  # the class names alone, beside the manifest

IMAGES_FORMAT_VERSION = 2  # a preprocessed JPEG tree; 2: rows in a seeded order within each shard (1: in path order)
TABLE_FORMAT = DatasetFormat.parquet.value  # a Parquet table the user brings
TABLE_FORMAT_VERSION = 1  # of a Parquet table's manifest parameters
ROW_GROUPS_PER_READER = 2  # petastorm shards by row group: each split gets at least 2 per training process
SHARDS_FOLDER = "_shards"  # under the dataset's output: one manifest per finished shard, <shard_name>.json


def shard_name(index: int, count: int) -> str:
    """Shard `index` of a `count`-shard preprocessing, as its files are named (its manifest, plan and parts); every
    name of that preprocessing ends with shard_count_suffix(count)."""
    return f"shard-{index:05d}{shard_count_suffix(count)}"


def shard_count_suffix(count: int) -> str:
    """The end of every shard name of a `count`-shard preprocessing: files of another count are another dataset's."""
    return f"-of-{count:05d}"


def is_shard_manifest(name: str, count: int) -> bool:
    """Whether the file `name` in SHARDS_FOLDER is the manifest of a shard of a `count`-shard preprocessing."""
    return name.startswith("shard-") and name.endswith(f"{shard_count_suffix(count)}.json")


def image_dataset_parameters(*, image_size: int, validation_fraction: float, sample_fraction: float, seed: int,
                             readers: int) -> dict[str, Any]:
    """The parameters of a dataset preprocessed from a JPEG tree: what determines its content (not where it is read
    from), and the row groups its `readers` training processes need."""
    return {
        "formatVersion": IMAGES_FORMAT_VERSION,
        "imageSize": image_size,
        "validationFraction": validation_fraction,
        "sampleFraction": sample_fraction,
        "seed": seed,
        "minRowGroupsPerSplit": ROW_GROUPS_PER_READER * readers,
    }


def table_dataset_parameters(*, image_size: int, image_column: str, label_column: str,
                             readers: int) -> dict[str, Any]:
    """The parameters a Parquet table's check records: what its manifest is valid for."""
    return {"formatVersion": TABLE_FORMAT_VERSION, "format": TABLE_FORMAT, "imageSize": image_size,
            "columns": {"image": image_column, "label": label_column},
            "minRowGroupsPerSplit": ROW_GROUPS_PER_READER * readers}


class DatasetManifest(BaseModel):
    """_manifest.json. `parameters` are what the content depends on (`image_dataset_parameters` or
    `table_dataset_parameters` above); `files` the Parquet files of each split,
    relative to the dataset (or to `dataRoot`, a Parquet table's own location)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    fingerprint: Optional[str] = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    source: Optional[str] = None
    # A Parquet table's (dataset.format parquet): its format, where its files are, and its columns.
    format: Optional[str] = None
    data_root: Optional[str] = None
    columns: Optional[dict[str, str]] = None
    classes: list[str] = Field(default_factory=list)
    class_count: Optional[int] = None  # only in a Job's termination message, where `classes` may not fit
    source_files: Optional[int] = None
    shards: Optional[int] = None  # the preprocessing's shards (none for a Parquet table)
    shards_reused: Optional[int] = None  # of those, kept from an earlier dataset (their files did not change)
    written: dict[str, int] = Field(default_factory=dict)  # rows per split
    skipped: int = 0  # undecodable source files
    skipped_files: list[dict[str, Any]] = Field(default_factory=list)
    files: dict[str, list[str]] = Field(default_factory=dict)
    row_groups: Optional[dict[str, int]] = None  # a Parquet table's, per split
    warnings: Optional[list[str]] = None  # a Parquet table's row groups or row order

    @classmethod
    def read(cls, document: Any) -> Optional["DatasetManifest"]:
        """The manifest in a JSON document: every valid field, nothing else; None when it is not a JSON object."""
        if not isinstance(document, dict):
            return None
        values = dict(document)
        while True:
            try:
                return cls.model_validate(values)
            except ValidationError as exc:  # left out, field by field (every field has a default)
                refused = {error["loc"][0] for error in exc.errors() if error["loc"]}
                values = {key: value for key, value in values.items() if key not in refused}

    def document(self) -> dict[str, Any]:
        """The JSON document the writers write: the fields they set."""
        return self.model_dump(by_alias=True, exclude_none=True)

    def number_of_classes(self) -> int:
        return len(self.classes) if self.classes or self.class_count is None else self.class_count


# The preprocessing and check Jobs' pods end with their dataset's manifest in their termination message (what a
# container writes to /dev/termination-log; the kubelet keeps at most 4096 bytes of it in the pod's status): the
# operator reads it from the pod, not from storage (docs/security.md, "The push path"). Only what the operator
# uses goes in: no file lists; the class names only when they fit.
TERMINATION_MESSAGE_KEY = "scalingrunManifest"
TERMINATION_MESSAGE_BYTES = 4096


def manifest_termination_message(manifest: DatasetManifest) -> str:
    """The JSON a finished preprocessing or check pod leaves as its termination message: the class names given
    as a count when they do not fit, then the warnings left out too when those do not."""
    summary = {k: v for k, v in manifest.document().items() if k not in ("files", "skippedFiles")}
    shorter = ({}, {"classes": [], "classCount": len(manifest.classes)},
               {"classes": [], "classCount": len(manifest.classes), "warnings": None})
    for changes in shorter:
        text = json.dumps({TERMINATION_MESSAGE_KEY: {k: v for k, v in {**summary, **changes}.items()
                                                     if v is not None}}, separators=(",", ":"))
        if len(text.encode()) <= TERMINATION_MESSAGE_BYTES:
            break
    return text


def manifest_from_termination_message(message: Optional[str]) -> Optional[DatasetManifest]:
    """The manifest a finished pod left (manifest_termination_message); None when its message holds none."""
    try:
        document = json.loads(message or "")
    except ValueError:
        return None
    return DatasetManifest.read(document.get(TERMINATION_MESSAGE_KEY)) if isinstance(document, dict) else None
