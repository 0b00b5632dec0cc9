"""The trainer's documents read from a store, with the storage layer's size cap, as their models (documents.py
parses them): the dataset manifest, the progress document and the heartbeat."""

from __future__ import annotations

from typing import Optional

from scalingrun_api.heartbeat import Heartbeat
from scalingrun_api.manifest import DatasetManifest
from scalingrun_api.progress import Progress
from ..documents import parse_heartbeat, parse_manifest, parse_progress
from .storage import StorageTarget, read_json, read_json_versioned


def read_manifest(uri: str, target: StorageTarget) -> Optional[DatasetManifest]:
    """The dataset manifest (see parse_manifest); StorageError when it cannot be read."""
    return parse_manifest(read_json(uri, target))


def read_progress(uri: str, target: StorageTarget, versioned: bool = False) -> tuple[Optional[Progress],
                                                                                      Optional[str]]:
    """(the progress document (see parse_progress), its version when `versioned`); StorageError when it cannot be
    read."""
    document, version = read_json_versioned(uri, target) if versioned else (read_json(uri, target), None)
    return parse_progress(document), version


def read_heartbeat(uri: str, target: StorageTarget) -> Optional[Heartbeat]:
    """The heartbeat (scalingrun_api.heartbeat; see parse_heartbeat); StorageError when it cannot be read (or is
    larger than the target's cap)."""
    return parse_heartbeat(read_json(uri, target))
