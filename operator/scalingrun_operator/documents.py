"""The trainer's documents, each parsed in one place: the dataset manifest (written by the preprocessing), the
progress document and the heartbeat (written by rank 0 of the training). Pushed, read from storage by pull mode
(pull/stored_documents.py) or by the tools, they become their models here (scalingrun_api: DatasetManifest,
Progress, Heartbeat), parsed leniently; nothing after this parses them again.
"""

from __future__ import annotations

from typing import Any, Optional

from scalingrun_api.heartbeat import Heartbeat
from scalingrun_api.manifest import DatasetManifest
from scalingrun_api.progress import Progress


def parse_manifest(document: Any) -> Optional[DatasetManifest]:
    """None when there is none (or it is no JSON object)."""
    return DatasetManifest.read(document)


def parse_progress(document: Any) -> Optional[Progress]:
    """None when there is none; a document with nothing valid is an empty Progress."""
    return None if document is None else Progress.read(document)


def parse_heartbeat(document: Any) -> Optional[Heartbeat]:
    """None when none was written yet."""
    return Heartbeat.read(document) if document else None
