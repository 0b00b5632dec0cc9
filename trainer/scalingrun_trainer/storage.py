"""Object storage through pyarrow.fs: s3:// (any S3-compatible endpoint), file:// and local paths.

Credentials come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, set from a Secret);
they are never logged or written anywhere.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow_hotfix  # noqa: F401  (CVE-2023-47248: pyarrow 10 must not unpickle extension types)
from pyarrow import fs as pafs


@dataclass(frozen=True)
class Location:
    """A filesystem and a path in it, with the URI it came from."""

    fs: pafs.FileSystem
    path: str
    uri: str

    def join(self, *parts: str) -> "Location":
        return Location(self.fs, posixpath.join(self.path, *parts), posixpath.join(self.uri, *parts))

    def exists(self) -> bool:
        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path) as stream:
            return stream.read()

    def write_bytes_atomic(self, data: bytes) -> None:
        """Readers see the old file or the whole new one, never a partial write."""
        parent = posixpath.dirname(self.path)
        tmp = posixpath.join(parent, f"_tmp-{uuid.uuid4().hex}-{posixpath.basename(self.path)}")
        self.fs.create_dir(parent, recursive=True)
        with self.fs.open_output_stream(tmp) as stream:
            stream.write(data)
        self.fs.move(tmp, self.path)


def s3_filesystem(endpoint: str | None = None, region: str | None = None) -> pafs.S3FileSystem:
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL") or None
    options: dict = {"region": region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"}
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        options["endpoint_override"] = parsed.netloc
        options["scheme"] = parsed.scheme
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        options.update(access_key=key, secret_key=secret)
    return pafs.S3FileSystem(**options)


def open_location(uri: str, endpoint: str | None = None, region: str | None = None) -> Location:
    uri = uri.rstrip("/") or "/"
    if uri.startswith("s3://"):
        return Location(s3_filesystem(endpoint, region), uri[len("s3://"):], uri)
    if uri.startswith("file://"):
        path = urlparse(uri).path
    elif uri.startswith("/"):
        path = uri
    else:
        raise ValueError(f"unsupported URI {uri!r}: use s3://bucket/prefix, file:///path or /path")
    return Location(pafs.LocalFileSystem(), path, uri)
