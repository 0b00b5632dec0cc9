"""The trainer's documents in storage, each read in one place: the dataset manifest (written by the
preprocessing), the progress document and the heartbeat (written by rank 0 of the training). The operator,
the local runner and `scalingrun report` all read them through here, with the storage layer's size cap.
"""

from __future__ import annotations

from typing import Any, Optional

from .storage import StorageTarget, read_json, read_json_versioned


def read_manifest(uri: str, target: StorageTarget) -> Optional[dict[str, Any]]:
    """The dataset manifest, or None when there is none yet; StorageError when it cannot be read."""
    return read_json(uri, target)


def read_progress(uri: str, target: StorageTarget, versioned: bool = False) -> tuple[Optional[dict[str, Any]],
                                                                                      Optional[str]]:
    """(the progress document or None when there is none yet, its version when `versioned`); StorageError when
    it cannot be read."""
    if versioned:
        return read_json_versioned(uri, target)
    return read_json(uri, target), None


def read_heartbeat(uri: str, target: StorageTarget) -> Optional[dict[str, Any]]:
    """The heartbeat document (scalingrun_api.heartbeat), or None when none was written yet; StorageError when it
    cannot be read (or is larger than the target's cap)."""
    return read_json(uri, target)
