"""The source tree of JPEGs (one folder per class) and every decision about one of its files: in the sample or
not, train or validation, which shard, where in it (a hash of its path and the seed, shards.py's layout); the
parameters and fingerprint that name a dataset, and the errors the user acts on."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Iterator, Optional

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


def list_classes(source: Location) -> list[str]:
    """Classes: the sorted names of the source's top folders (one non-recursive listing)."""
    info = source.fs.get_file_info(source.path)
    if info.type != pafs.FileType.Directory:
        raise SourceError(f"source {source.uri} does not exist or is not a folder")
    top = source.fs.get_file_info(pafs.FileSelector(source.path))
    classes = sorted(e.base_name for e in top
                     if e.type == pafs.FileType.Directory and not e.base_name.startswith((".", "_")))
    if not classes:
        raise SourceError(f"source {source.uri} has no class folders with files (expected SOURCE/<class>/<image>)")
    return classes


def iter_source(source: Location, classes: list[str]) -> Iterator[SourceFile]:
    """Every image file under the class folders, in the order of their paths, one class folder's listing in
    memory at a time (so memory is bounded by the largest class, not the tree)."""
    label_of = {name: index for index, name in enumerate(classes)}
    prefix = source.path.rstrip("/") + "/"
    # Folders in the order of "<name>/": then the concatenation is sorted by path ("a-b/x" < "a/x").
    for name in sorted(classes, key=lambda c: c + "/"):
        entries = source.fs.get_file_info(pafs.FileSelector(prefix + name, recursive=True))
        files = [SourceFile(e.path[len(prefix):], e.size, label_of[name]) for e in entries
                 if e.type == pafs.FileType.File and not e.base_name.startswith((".", "_"))]
        files.sort(key=lambda f: f.path)
        yield from files


class Fingerprint:
    """The dataset's fingerprint (parameters, classes, every file's path and size in path order), fed one file at a
    time; the same value as hashing the whole sorted listing at once."""

    def __init__(self, parameters: dict, classes: list[str]):
        self.digest = hashlib.sha256()
        self.digest.update(json.dumps(parameters, sort_keys=True).encode())
        self.digest.update(json.dumps(classes).encode())

    def add(self, f: SourceFile) -> None:
        self.digest.update(f"{f.path}\0{f.size}\n".encode())

    def hexdigest(self) -> str:
        return self.digest.hexdigest()[:24]


def fingerprint(params: Params, classes: list[str], files: list[SourceFile]) -> str:
    whole = Fingerprint(params.dataset_parameters(), classes)
    for f in files:
        whole.add(f)
    return whole.hexdigest()


def rows_per_group(expected_rows: int, shard_count: int, min_groups_per_split: int) -> int:
    """Rows per row group so that the split has >= min_groups_per_split groups across all shards."""
    groups_per_shard = max(1, math.ceil(min_groups_per_split / shard_count))
    return max(1, min(MAX_ROWS_PER_GROUP, expected_rows // groups_per_shard or 1))
