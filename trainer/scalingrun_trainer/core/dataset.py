"""The preprocessed Parquet dataset and the rules every engine's reader follows.

Petastorm readers shard by row group: the row groups are shuffled with one seed, the same on every rank, and then
split into disjoint shards (cur_shard = rank, shard_count = readers), so every rank reads a random, disjoint share.
Training readers loop forever (`num_epochs=None`; the engine counts `steps_per_epoch` batches): a Petastorm bug
drops rows from shuffled finite readers. Validation is read completely, unshuffled, once per epoch.
"""

from __future__ import annotations

import json
import posixpath
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import pyarrow.parquet as pq

from ..preprocess import SPLITS
from ..storage import Location, open_location, s3fs_options


class DatasetError(RuntimeError):
    """The dataset cannot be used as configured; the message says why and what to do."""


@dataclass(frozen=True)
class Dataset:
    uri: str
    classes: list[str]
    rows: dict[str, int]
    files: dict[str, list[str]]
    row_groups: dict[str, int]
    image_size: int
    fingerprint: str
    endpoint: Optional[str] = None

    def urls(self, split: str) -> list[str]:
        base = self.uri.rstrip("/")
        if base.startswith("/"):
            base = "file://" + base
        return [posixpath.join(base, name) for name in self.files[split]]

    def storage_options(self) -> Optional[dict]:
        """Petastorm's s3fs options; keys (and, without an endpoint, AWS_ENDPOINT_URL) come from the environment."""
        if not self.uri.startswith("s3://"):
            return None
        return s3fs_options(self.endpoint)


def open_dataset(uri: str, endpoint: Optional[str] = None, region: Optional[str] = None) -> Dataset:
    """Reads the manifest the preprocessing wrote, and counts row groups for sharding."""
    root = open_location(uri, endpoint, region)
    manifest_at = root.join("_manifest.json")
    try:
        manifest = json.loads(manifest_at.read_bytes())
    except (FileNotFoundError, OSError) as exc:
        raise DatasetError(f"no dataset manifest at {manifest_at.uri} ({type(exc).__name__}): "
                           "run the preprocessing first") from None
    row_groups = {split: sum(_row_groups(root.join(name)) for name in manifest["files"][split]) for split in SPLITS}
    return Dataset(uri=uri, classes=manifest["classes"], rows=manifest["written"], files=manifest["files"],
                   row_groups=row_groups, image_size=manifest["parameters"]["imageSize"],
                   fingerprint=manifest["fingerprint"], endpoint=endpoint)


def _row_groups(location: Location) -> int:
    with location.fs.open_input_file(location.path) as f:
        return pq.ParquetFile(f).metadata.num_row_groups


def check_shardable(dataset: Dataset, readers: int) -> None:
    """Petastorm shards by row group: every reader (one per process) needs at least one of each split."""
    for split in SPLITS:
        if dataset.row_groups[split] < readers:
            raise DatasetError(
                f"{split} has {dataset.row_groups[split]} row groups for {readers} processes, so some "
                f"would get no data: preprocess again for {readers} readers (it writes >= 2 row groups "
                "per reader when there are enough rows) or use fewer processes"
            )


def open_reader(dataset: Dataset, split: str, *, shard: int, shards: int, seed: int, reader_threads: int,
                in_order: bool = False, **petastorm_options: Any):
    """A Petastorm batch reader of (image, label) over `split`, shard `shard` of `shards`, by the module's rules;
    in_order: the shard once, unshuffled, whatever the split (the feature cache's pass; the shard is the same, since
    the seed alone decides it); `petastorm_options` are the engine's own (results_queue_size, transform_spec)."""
    from petastorm import make_batch_reader

    # petastorm 0.13 on pyarrow 10 warns about deprecated pyarrow APIs on every reader.
    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")
    endless = split == "train" and not in_order
    return make_batch_reader(
        dataset.urls(split), schema_fields=["image", "label"], cur_shard=shard, shard_count=shards,
        # The same seed on every rank: row groups are shuffled identically, then split into disjoint shards.
        seed=seed, shuffle_row_groups=endless, num_epochs=None if endless else 1,
        workers_count=reader_threads, storage_options=dataset.storage_options(), **petastorm_options,
    )
