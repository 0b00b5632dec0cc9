"""spec.dataset: where the images are (a JPEG tree to preprocess, or a Parquet table ready to read), where the
prepared Parquet goes, and how it is split."""

from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import Field

from .common import DATA_URI_PATTERN, MAX_INTEGER, ApiModel, Quantity


# Measured in docs/operations.md ("CPU requests and limits"): a CPU limit equal to the request cost a 2-worker
# run no images/s, so requests equal limits unless cpuLimit says otherwise.
CPU_LIMIT_DESCRIPTION = (
    "CPU limit, at least cpu: a CFS quota per 100 ms. Default: equal to cpu (with memory, Guaranteed QoS). "
    "Set it higher to let the pod use idle CPU beyond its request, e.g. the node's cores for a quota that "
    "never binds."
)


class Resources(ApiModel):
    """CPU and memory for each pod: requests equal limits (Guaranteed QoS), unless cpuLimit sets another CPU
    limit."""

    cpu: Optional[Quantity] = Field(None, description="CPU cores, e.g. 4 or 3500m: request, and limit unless "
                                   "cpuLimit is set.")
    memory: Optional[Quantity] = Field(None, description="Memory, e.g. 16Gi: request and limit.")
    cpu_limit: Optional[Quantity] = Field(None, description=CPU_LIMIT_DESCRIPTION)


class DatasetFormat(str, Enum):
    jpeg_tree = "jpeg-tree"
    parquet = "parquet"


# A Parquet column name the readers can use as a field name (Petastorm hands rows over as named tuples).
COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Columns(ApiModel):
    """The columns of a Parquet table (dataset.format parquet)."""

    image: str = Field(
        "image", max_length=255, pattern=COLUMN_PATTERN,
        description="Column of the images: binary, imageSize x imageSize x 3 uint8 RGB pixels, row-major "
        "(numpy's tobytes() of an (S, S, 3) uint8 array).")
    label: str = Field(
        "label", max_length=255, pattern=COLUMN_PATTERN, description="Column of the labels: integers 0 .. classes - 1.")


class Preprocessing(ApiModel):
    """The preprocessing Job that turns the JPEG tree into Parquet shards (with format parquet: the Job that checks
    the table instead; its resources and backoffLimit apply)."""

    parallelism: int = Field(
        4,
        ge=1,
        le=256,
        description="Number of shards processed in parallel (an Indexed Job with this many "
        "completions); each shard handles a deterministic share of the files.",
    )
    max_bad_fraction: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Fail when more than this fraction of the source files cannot be decoded; "
        "below it, bad files are skipped and counted.",
    )
    backoff_limit: int = Field(2, ge=0, le=20, description="Retries per shard before the Job fails.")
    resources: Resources = Field(
        default_factory=lambda: Resources(cpu=1, memory="2Gi"),
        description="Resources of each preprocessing pod.",
    )
    active_deadline_seconds: Optional[int] = Field(
        None, ge=1, le=MAX_INTEGER,
        description="Fail the preprocessing Job after this many seconds (the Job's activeDeadlineSeconds). "
        "Default: no deadline; a shard that stops beating is caught by its heartbeat instead.",
    )
    readers: Optional[int] = Field(
        None,
        ge=1,
        le=16384,
        description="Training processes the dataset is laid out for (>= 2 row groups per process and split); "
        "default and minimum: this run's processes. A ScalingSweep sets its largest point's, so that every "
        "point reads one dataset.",
    )


class Dataset(ApiModel):
    """Where the images are, where the prepared Parquet goes, and how it is split."""

    source: str = Field(
        ...,
        description="URI of a JPEG tree with one folder per class (s3://bucket/prefix or an "
        "absolute local path). Classes are the sorted folder names. With format parquet: the folder holding "
        "train/ and validation/ folders of Parquet files (and optionally _classes.json, the class names).",
        pattern=DATA_URI_PATTERN,
    )
    output: str = Field(
        ...,
        description="URI where the labelled Parquet shards (train/ and validation/) are written. With format "
        "parquet only the dataset manifest goes there (and the runs' checkpoints, by default).",
        pattern=DATA_URI_PATTERN,
    )
    format: DatasetFormat = Field(
        DatasetFormat.jpeg_tree,
        description="jpeg-tree: a preprocessing Job resizes the images into labelled Parquet shards. parquet: the "
        "source is already a Parquet table (e.g. written with pyarrow, or Delta Lake's Parquet files); a check Job "
        "verifies its columns and image shape instead of preprocessing.",
    )
    columns: Columns = Field(default_factory=Columns, description="Column names of a Parquet table (format "
                             "parquet; the preprocessing of a jpeg-tree writes image and label).")
    image_size: int = Field(
        299,
        ge=32,
        le=1024,
        description="Side of the square images: resized with aspect kept, padded to a square. With format "
        "parquet: the side the table's images have.",
    )
    validation_fraction: float = Field(
        0.1, gt=0, lt=1, description="Fraction of the images held out for validation."
    )
    sample_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Deterministic fraction of the source to use; start small, then grow.",
    )
    seed: int = Field(42, ge=0, le=MAX_INTEGER, description="Seed of the per-file split and sample.")
    preprocessing: Preprocessing = Field(
        default_factory=Preprocessing, description="The preprocessing Job."
    )


