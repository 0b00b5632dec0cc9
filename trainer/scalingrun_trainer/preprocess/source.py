"""The source tree of JPEGs (one folder per class) and every decision about one of its files: in the sample or
not, train or validation, which shard, where in it (a hash of its path and the seed, shards.py's layout); the
parameters and fingerprint that name a dataset, and the errors the user acts on."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Optional

from pyarrow import fs as pafs

from scalingrun_api.manifest import image_dataset_parameters

from ..storage import Location

# 256 rows of 299 x 299 x 3 are about 70 MB: small enough to stream, large enough to read fast.
MAX_ROWS_PER_GROUP = 256


class PreprocessError(RuntimeError):
    """A failure the user must act on; the message says what and how."""

    exit_code = 1


class SourceError(PreprocessError):
    exit_code = 4


class TooManyBadFiles(PreprocessError):
    exit_code = 3


@dataclass(frozen=True)
class Params:
    source: str
    output: str
    image_size: int = 299
    validation_fraction: float = 0.1
    sample_fraction: float = 1.0
    seed: int = 42
    max_bad_fraction: float = 0.05
    # Training processes (of any engine) that will read the dataset: each split gets >= 2 row groups per process.
    max_readers: int = 1
    endpoint: Optional[str] = None
    region: Optional[str] = None

    def dataset_parameters(self) -> dict:
        """What determines the content of the dataset (scalingrun_api.manifest, the operator's too)."""
        return image_dataset_parameters(image_size=self.image_size, validation_fraction=self.validation_fraction,
                                        sample_fraction=self.sample_fraction, seed=self.seed,
                                        readers=self.max_readers)


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the source: <class>/<...>/<file>
    size: int
    label: int


@dataclass
class Assignment:
    split: str
    shard: int
    place: int  # the row's position in its shard: rows are written by increasing place


def assign(path: str, seed: int, sample_fraction: float, validation_fraction: float,
           shard_count: int) -> Optional[Assignment]:
    """Deterministic per-file decisions from a hash of (seed, path); None = not in the sample."""
    digest = hashlib.sha256(f"{seed}\0{path}".encode()).digest()
    unit = lambda chunk: int.from_bytes(chunk, "big") / 2**64  # noqa: E731
    if unit(digest[0:8]) >= sample_fraction:
        return None
    split = "validation" if unit(digest[8:16]) < validation_fraction else "train"
    return Assignment(split, int.from_bytes(digest[16:24], "big") % shard_count, int.from_bytes(digest[24:32], "big"))


def list_source(source: Location) -> tuple[list[str], list[SourceFile]]:
    """Classes (sorted folder names) and every image file under them."""
    info = source.fs.get_file_info(source.path)
    if info.type != pafs.FileType.Directory:
        raise SourceError(f"source {source.uri} does not exist or is not a folder")
    entries = source.fs.get_file_info(pafs.FileSelector(source.path, recursive=True))
    prefix = source.path.rstrip("/") + "/"
    classes = sorted(
        e.path[len(prefix):] for e in entries
        if e.type == pafs.FileType.Directory and "/" not in e.path[len(prefix):]
        and not e.base_name.startswith((".", "_"))
    )
    label_of = {name: index for index, name in enumerate(classes)}
    files = []
    for e in entries:
        relative = e.path[len(prefix):]
        top = relative.split("/", 1)[0]
        if e.type != pafs.FileType.File or top not in label_of or "/" not in relative:
            continue
        if e.base_name.startswith((".", "_")):
            continue
        files.append(SourceFile(relative, e.size, label_of[top]))
    files.sort(key=lambda f: f.path)
    if not classes or not files:
        raise SourceError(f"source {source.uri} has no class folders with files (expected SOURCE/<class>/<image>)")
    return classes, files


def fingerprint(params: Params, classes: list[str], files: list[SourceFile]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(params.dataset_parameters(), sort_keys=True).encode())
    digest.update(json.dumps(classes).encode())
    for f in files:
        digest.update(f"{f.path}\0{f.size}\n".encode())
    return digest.hexdigest()[:24]


def rows_per_group(expected_rows: int, shard_count: int, min_groups_per_split: int) -> int:
    """Rows per row group so that the split has >= min_groups_per_split groups across all shards."""
    groups_per_shard = max(1, math.ceil(min_groups_per_split / shard_count))
    return max(1, min(MAX_ROWS_PER_GROUP, expected_rows // groups_per_shard or 1))
