"""Object storage through pyarrow.fs: s3:// (any S3-compatible endpoint), file:// and local paths.

Credentials come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, set from a Secret);
they are never logged or written anywhere.

Reads and writes through a Location (progress, checkpoints, the model, manifests) retry 5xx answers,
throttling and network errors with exponential backoff until SCALINGRUN_STORAGE_DEADLINE_SECONDS
(default 120 s) after the first attempt; the AWS SDK inside pyarrow retries each request a few times
more. A permanent refusal (access denied, unknown key, bad signature, no bucket) fails at once with a
StorageError that names the URI and what to check.
"""

from __future__ import annotations

import logging
import os
import posixpath
import random
import re
import time
import uuid
from dataclasses import dataclass
from typing import Callable, TypeVar
from urllib.parse import urlparse

import pyarrow_hotfix  # noqa: F401  (CVE-2023-47248: pyarrow 10 must not unpickle extension types)
from pyarrow import fs as pafs

log = logging.getLogger(__name__)
T = TypeVar("T")
DEADLINE_VARIABLE = "SCALINGRUN_STORAGE_DEADLINE_SECONDS"
DEFAULT_DEADLINE_SECONDS = 120.0

# How the AWS SDK in pyarrow words its errors: "AWS Error UNKNOWN (HTTP status 503) during HeadObject ...",
# "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached".
_TRANSIENT = re.compile(r"HTTP status 5\d\d|HTTP status (408|429)|INTERNAL_FAILURE|SERVICE_UNAVAILABLE|SLOW_DOWN|"
                        r"THROTTLING|REQUEST_TIMEOUT|NETWORK_CONNECTION|REQUEST_EXPIRED")
_PERMANENT = {
    "INVALID_ACCESS_KEY_ID": "the store does not know the access key id: check AWS_ACCESS_KEY_ID (from "
                             "spec.storage.credentialsSecret) and that {endpoint} is the store it belongs to",
    "SIGNATURE_DOES_NOT_MATCH": "the secret key does not match the access key id: check AWS_SECRET_ACCESS_KEY "
                                "(from spec.storage.credentialsSecret)",
    "ACCESS_DENIED": "access to bucket {bucket} at {endpoint} was denied: check the keys AWS_ACCESS_KEY_ID / "
                     "AWS_SECRET_ACCESS_KEY (from spec.storage.credentialsSecret) and the user's permissions",
    "HTTP status 403": "access to bucket {bucket} at {endpoint} was denied: check the keys AWS_ACCESS_KEY_ID / "
                       "AWS_SECRET_ACCESS_KEY (from spec.storage.credentialsSecret) and the user's permissions",
    "NO_SUCH_BUCKET": "bucket {bucket} does not exist at {endpoint}: create it, or fix the URI or "
                      "spec.storage.endpoint",
}


class StorageError(OSError):
    """Storage refused for good, or stayed unavailable past the deadline; names the URI, never a key."""


def deadline_seconds() -> float:
    raw = os.environ.get(DEADLINE_VARIABLE, "")
    try:
        value = float(raw) if raw else DEFAULT_DEADLINE_SECONDS
    except ValueError:
        raise StorageError(f"{DEADLINE_VARIABLE}={raw!r} is not a number of seconds") from None
    return max(value, 0.0)


def retrying(what: str, uri: str, call: Callable[[], T], deadline: float | None = None) -> T:
    """`call()`, retried on transient S3 errors with backoff until `deadline` seconds have passed."""
    deadline = deadline_seconds() if deadline is None else deadline
    started, delay, attempts = time.monotonic(), 0.25, 0
    bucket = uri[len("s3://"):].split("/", 1)[0] if uri.startswith("s3://") else uri
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the S3 endpoint"
    while True:
        attempts += 1
        try:
            return call()
        except FileNotFoundError:
            raise
        except OSError as exc:
            message = str(exc)
            if not _TRANSIENT.search(message):
                hint = next((h for code, h in _PERMANENT.items() if code in message), None)
                if hint is None:
                    raise
                raise StorageError(f"cannot {what} {uri}: {message.strip()}; "
                                   + hint.format(bucket=bucket, endpoint=endpoint)) from None
            elapsed = time.monotonic() - started
            pause = delay / 2 + random.uniform(0, delay / 2)
            if elapsed + pause >= deadline:
                raise StorageError(f"cannot {what} {uri}: {message.strip()}; still failing after {attempts} attempts "
                                   f"in {elapsed:.1f} s ({DEADLINE_VARIABLE}={deadline:g}): check that {endpoint} "
                                   "is up") from None
            log.warning("%s %s failed (%s), attempt %d; retrying in %.2f s", what, uri, message.strip(), attempts,
                        pause)
            time.sleep(pause)
            delay = min(delay * 2, 8.0)


@dataclass(frozen=True)
class Location:
    """A filesystem and a path in it, with the URI it came from."""

    fs: pafs.FileSystem
    path: str
    uri: str

    def join(self, *parts: str) -> "Location":
        return Location(self.fs, posixpath.join(self.path, *parts), posixpath.join(self.uri, *parts))

    def exists(self) -> bool:
        return retrying("read", self.uri, lambda: self.fs.get_file_info(self.path).type != pafs.FileType.NotFound)

    def files(self, recursive: bool = False) -> list[pafs.FileInfo]:
        """The files in this folder (and below it, `recursive`); none when it does not exist."""
        if not self.exists():
            return []
        return [i for i in self.fs.get_file_info(pafs.FileSelector(self.path, recursive=recursive))
                if i.type == pafs.FileType.File]

    def read_bytes(self) -> bytes:
        def read() -> bytes:
            with self.fs.open_input_stream(self.path) as stream:
                return stream.read()

        return retrying("read", self.uri, read)

    def write_bytes_atomic(self, data: bytes, deadline: float | None = None) -> None:
        """Readers see the old file or the whole new one, never a partial write. `deadline`: how long transient
        errors are retried (default: SCALINGRUN_STORAGE_DEADLINE_SECONDS)."""
        parent = posixpath.dirname(self.path)
        tmp = posixpath.join(parent, f"_tmp-{uuid.uuid4().hex}-{posixpath.basename(self.path)}")

        def write() -> None:  # a retry rewrites the same temporary object
            self.fs.create_dir(parent, recursive=True)
            with self.fs.open_output_stream(tmp) as stream:
                stream.write(data)
            self.fs.move(tmp, self.path)

        retrying("write", self.uri, write, deadline)


def s3_filesystem(endpoint: str | None = None, region: str | None = None) -> pafs.S3FileSystem:
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL") or None
    # Timeouts, so that a hung connection becomes an error that `retrying` retries.
    options: dict = {"region": region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
                     "connect_timeout": 10, "request_timeout": 60}
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        options["endpoint_override"] = parsed.netloc
        options["scheme"] = parsed.scheme
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        options.update(access_key=key, secret_key=secret)
    return pafs.S3FileSystem(**options)


def s3fs_options(endpoint: str | None = None) -> dict:
    """storage_options for petastorm's s3fs reads of the Parquet shards: botocore's standard retries
    (5xx, throttling, timeouts; exponential backoff up to 20 s, about a minute in all) instead of
    s3fs's default of giving up after 5 attempts in a few seconds."""
    options: dict = {"config_kwargs": {"retries": {"max_attempts": 10, "mode": "standard"},
                                       "connect_timeout": 10, "read_timeout": 60}}
    if endpoint:
        options["client_kwargs"] = {"endpoint_url": endpoint}
    return options


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
