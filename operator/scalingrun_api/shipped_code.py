"""A directory shipped with a function (`HorovodRunner(code_dir=...)`): the team's modules the function imports by
name, packed by the client into the payload (so the payload's digest covers them) and unpacked by every rank into a
folder of its own, first on sys.path. Both sides import this.

The archive is a gzipped tar made the same way for the same files (sorted, no owner, no time), so the digest only
changes with the code. Only regular files and folders go in; `__pycache__`, `.git` and compiled files are left out;
a symlink, or a tree over the caps, is refused with its path. Unpacking takes only relative paths inside the target.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path, PurePosixPath

MAX_CODE_BYTES = 32 * 1024 * 1024  # the files, before compression (the whole payload has its own cap)
MAX_CODE_FILES = 2000
LEFT_OUT_DIRS = frozenset({"__pycache__", ".git", ".ipynb_checkpoints"})
LEFT_OUT_SUFFIXES = (".pyc", ".pyo")


class ShippedCodeError(ValueError):
    """A directory that cannot be shipped or an archive that cannot be unpacked: the message says which path and why."""


def _files(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in LEFT_OUT_DIRS)
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_symlink():
                raise ShippedCodeError(f"code_dir {root}: {path.relative_to(root)} is a symlink: ship the file itself")
            if not name.endswith(LEFT_OUT_SUFFIXES) and path.is_file():
                found.append(path)
        for name in dirs:
            if (Path(folder) / name).is_symlink():
                raise ShippedCodeError(f"code_dir {root}: {(Path(folder) / name).relative_to(root)} is a symlink: "
                                       "ship the folder itself")
    return found


def pack_directory(directory: str | os.PathLike) -> bytes:
    """The directory's files as a gzipped tar, the same bytes for the same files; ShippedCodeError when it is not a
    directory, holds a symlink, or is over MAX_CODE_FILES files or MAX_CODE_BYTES bytes."""
    root = Path(directory).resolve()
    if not root.is_dir():
        raise ShippedCodeError(f"code_dir {directory}: not a directory")
    files = _files(root)
    if len(files) > MAX_CODE_FILES:
        raise ShippedCodeError(f"code_dir {directory}: {len(files)} files, over the cap of {MAX_CODE_FILES}: ship the "
                               "code, and pass data by path or URI")
    total = sum(path.stat().st_size for path in files)
    if total > MAX_CODE_BYTES:
        raise ShippedCodeError(f"code_dir {directory}: {total:,} bytes, over the cap of {MAX_CODE_BYTES:,}: ship the "
                               "code, and pass data by path or URI")
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in files:
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def unpack_directory(data: bytes, target: Path) -> None:
    """The archive's files under `target` (made if need be); ShippedCodeError on any member that is not a regular
    file with a relative path inside it, or past the caps."""
    target.mkdir(parents=True, exist_ok=True)
    total = count = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive:
            name = PurePosixPath(member.name)
            if not member.isfile() or name.is_absolute() or ".." in name.parts or not name.parts:
                raise ShippedCodeError(f"shipped code: member {member.name!r} refused (only files at relative paths)")
            count, total = count + 1, total + member.size
            if count > MAX_CODE_FILES or total > MAX_CODE_BYTES:
                raise ShippedCodeError(f"shipped code: over the caps ({MAX_CODE_FILES} files, {MAX_CODE_BYTES:,} bytes)")
            path = target.joinpath(*name.parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            path.write_bytes(source.read() if source else b"")
