"""The trainer's documents in storage, each read and parsed in one place: the dataset manifest (written by the
preprocessing), the progress document and the heartbeat (written by rank 0 of the training). The operator,
the local runner and `scalingrun report` all read them through here, with the storage layer's size cap, and get
their models (scalingrun_api: DatasetManifest, Progress, Heartbeat), parsed leniently; nothing after this
parses them again.
"""

from __future__ import annotations

from typing import Any, Optional

from scalingrun_api.heartbeat import Heartbeat
from scalingrun_api.manifest import DatasetManifest
from scalingrun_api.progress import Progress
from .storage import StorageTarget, read_json, read_json_versioned


def parse_manifest(document: Any) -> Optional[DatasetManifest]:
    """None when there is none (or it is no JSON object)."""
    return DatasetManifest.read(document)


def parse_progress(document: Any) -> Optional[Progress]:
    """None when there is none; a document with nothing valid is an empty Progress."""
    return None if document is None else Progress.read(document)


def parse_heartbeat(document: Any) -> Optional[Heartbeat]:
    """None when none was written yet."""
    return Heartbeat.read(document) if document else None


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
