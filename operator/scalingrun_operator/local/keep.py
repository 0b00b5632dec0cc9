"""What a local run made, copied out of a store that stops with it (the quick start's SeaweedFS) into the run's
workdir: the progress document, which is all `scalingrun report` draws from, and the model. `scalingrun report -f`
reads the copy when the store cannot be read (kept_progress)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from scalingrun_api.progress import PROGRESS_FILE, Progress

# Where local runs keep their workdirs by default: the quick start's (--state .scalingrun/quickstart) and
# `scalingrun run --local`'s.
DEFAULT_WORKDIRS = (Path(".scalingrun/quickstart/runs"), Path(".scalingrun/runs"))


@dataclass(frozen=True)
class Kept:
    progress: Optional[Path] = None
    model: Optional[Path] = None


def keep(progress_uri: str, workdir: Path, filesystem: Any) -> Kept:
    """Copies `progress_uri` (s3://) and the model it names from `filesystem` (pyarrow's, on the store) into
    `workdir` (progress.json, model/<its name>); what is not there is not copied."""
    from pyarrow import fs as pafs

    def path(uri: str) -> str:
        return uri[len("s3://"):]

    if filesystem.get_file_info(path(progress_uri)).type != pafs.FileType.File:
        return Kept()
    workdir.mkdir(parents=True, exist_ok=True)
    document = filesystem.open_input_stream(path(progress_uri)).read()
    progress = workdir / PROGRESS_FILE
    progress.write_bytes(document)
    model_uri = Progress.read(json.loads(document)).model_uri
    if not model_uri or not model_uri.startswith("s3://"):
        return Kept(progress)
    info = filesystem.get_file_info(path(model_uri))
    if info.type == pafs.FileType.NotFound:
        return Kept(progress)
    model = workdir / "model" / info.base_name
    model.parent.mkdir(parents=True, exist_ok=True)
    pafs.copy_files(path(model_uri), str(model.resolve()), source_filesystem=filesystem,
                    destination_filesystem=pafs.LocalFileSystem())
    return Kept(progress, model)


def kept_progress(name: str, workdir: Optional[Path] = None) -> Optional[Path]:
    """The progress document a local run of `name` kept: in `workdir` when given, else in the first default
    workdir that has one."""
    candidates = [workdir] if workdir else [folder / name for folder in DEFAULT_WORKDIRS]
    return next((found for found in (folder / PROGRESS_FILE for folder in candidates) if found.is_file()), None)
