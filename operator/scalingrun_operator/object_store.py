"""The tools' own storage client: `report`, `logs`, `run --local` and the Python client read (and write) a user's
store with that user's keys, through a plain botocore client and its standard retries.

Not the operator's pull-mode client (pull/storage.py), whose budgets, address checks and circuit breakers bound
what tenants' stores can cost one operator serving them all: a tool serves one user, who chose the store. What a
tool reads is still capped (`max_bytes`), so a wrong URI cannot fill its memory. s3:// URIs go to the endpoint (path
style for a host:port store such as MinIO or SeaweedFS); absolute paths and file:// URIs are the local disk. Keys
are never logged, printed or kept beyond the client.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

DEFAULT_MAX_BYTES = 1024 * 1024  # a progress document of ~5,000 epochs; `logs` asks for more


class StorageError(RuntimeError):
    """A store could not be read or written; the message names the URI and the cause, never a key."""


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # never print the keys, even in a traceback's locals
        return "Credentials(***)"

    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.access_key}\0{self.secret_key}".encode()).hexdigest()[:16]


def secret_key_value(raw: bytes, where: str) -> str:
    """A key from a Secret as a request header may carry it: one line of printable ASCII (surrounding whitespace
    dropped). A PEM key or an INI file fails the signer with an error that quotes the header; refused here
    (ValueError), `where` named (the Secret and key), the value never. The operator's pull mode holds keys to this
    rule too (pull/secret_keys.py)."""
    try:
        value = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        value = None
    if not value or any(not 0x20 <= ord(ch) <= 0x7e for ch in value):
        what = "is empty" if value == "" else "holds control or non-ASCII characters (a line break?)"
        raise ValueError(f"{where} {what}: an S3 key is one line of printable ASCII; the value is not shown")
    return value


class Clients:
    """botocore S3 clients by endpoint, region, keys and timeout (one costs tens of milliseconds to make)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: Any = None
        self._clients: dict[tuple, Any] = {}

    def get(self, store: "Store") -> Any:
        import botocore.session
        from botocore.config import Config

        credentials = store.credentials
        key = (store.endpoint, store.region, credentials.fingerprint() if credentials else None, store.timeout,
               store.attempts)
        with self._lock:
            if key not in self._clients:
                if self._session is None:
                    self._session = botocore.session.get_session()
                config = Config(connect_timeout=store.timeout, read_timeout=store.timeout,
                                retries={"total_max_attempts": store.attempts, "mode": "standard"},
                                s3={"addressing_style": "path" if store.endpoint else "auto"})
                kwargs: dict[str, Any] = {"region_name": store.region, "config": config}
                if store.endpoint:
                    kwargs["endpoint_url"] = store.endpoint
                if credentials:  # else botocore's default chain: the environment's keys, a profile, a role
                    kwargs.update(aws_access_key_id=credentials.access_key,
                                  aws_secret_access_key=credentials.secret_key)
                self._clients[key] = self._session.create_client("s3", **kwargs)
            return self._clients[key]


@dataclass(frozen=True)
class Store:
    """Where a run's objects are and how to reach them; `clients`: whose client cache serves the calls."""

    endpoint: Optional[str]
    region: str
    credentials: Optional[Credentials] = None
    timeout: float = 10.0  # the longest wait of one connect or read
    attempts: int = 4  # botocore's standard retries (throttling, 5xx, a connection lost) included
    max_bytes: int = DEFAULT_MAX_BYTES  # a larger object is refused, not read
    clients: Clients = field(default_factory=Clients, compare=False, repr=False)


def split_s3(uri: str) -> tuple[str, str]:
    """An s3:// URI's (bucket, key)."""
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def local_path(uri: str) -> Path:
    """The file an absolute path or a file:// URI names."""
    return Path(urlparse(uri).path if uri.startswith("file://") else uri)


def _failed(what: str, uri: str, exc: Exception) -> StorageError:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        cause = f"{error.get('Code') or 'error'}: {error.get('Message') or exc}"
    elif isinstance(exc, OSError):
        cause = exc.strerror or str(exc)
    else:
        cause = f"{type(exc).__name__}: {exc}"
    return StorageError(f"cannot {what} {uri}: {cause}")


def _too_large(uri: str, size: int, store: Store) -> StorageError:
    return StorageError(f"cannot read {uri}: it is over {store.max_bytes} bytes ({size}); not read")


def read_bytes(uri: str, store: Store) -> Optional[bytes]:
    """The object's bytes (at most `store.max_bytes`), or None when it does not exist."""
    from botocore.exceptions import BotoCoreError, ClientError

    if not uri.startswith("s3://"):
        try:
            with local_path(uri).open("rb") as stream:
                data = stream.read(store.max_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _failed("read", uri, exc) from None
        if len(data) > store.max_bytes:
            raise _too_large(uri, len(data), store)
        return data
    bucket, key = split_s3(uri)
    try:
        response = store.clients.get(store).get_object(Bucket=bucket, Key=key)
        length, body = response.get("ContentLength"), response["Body"]
        try:
            if length is not None and length > store.max_bytes:
                raise _too_large(uri, length, store)
            data = body.read(store.max_bytes + 1)
        finally:
            body.close()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise _failed("read", uri, exc) from None
    except BotoCoreError as exc:
        raise _failed("read", uri, exc) from None
    if len(data) > store.max_bytes:
        raise _too_large(uri, len(data), store)
    return data


def read_json(uri: str, store: Store) -> Optional[dict[str, Any]]:
    """A JSON object document, or None when absent. A document that is not a JSON object is an error."""
    data = read_bytes(uri, store)
    return None if data is None else json_object(uri, data)


def json_object(uri: str, data: bytes, error: type[Exception] = StorageError) -> dict[str, Any]:
    """`data`, read from `uri`, as a JSON object; `error` (the reader's kind of StorageError) when it is not one."""
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise error(f"{uri} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise error(f"{uri} is not a JSON object")
    return document


def write_bytes(uri: str, store: Store, data: bytes) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    if not uri.startswith("s3://"):
        path = local_path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return
    bucket, key = split_s3(uri)
    try:
        store.clients.get(store).put_object(Bucket=bucket, Key=key, Body=data)
    except (ClientError, BotoCoreError) as exc:
        raise _failed("write", uri, exc) from None


def _listing(uri: str, store: Store, limit: int, folders: bool) -> list[str]:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3(uri)
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "PaginationConfig": {"MaxItems": limit}}
    if folders:
        request["Delimiter"] = "/"
    names: list[str] = []
    try:
        for page in store.clients.get(store).get_paginator("list_objects_v2").paginate(**request):
            if folders:
                names += [item["Prefix"][len(prefix):].rstrip("/") for item in page.get("CommonPrefixes", [])]
            else:
                names += [item["Key"][len(prefix):] for item in page.get("Contents", [])]
    except (ClientError, BotoCoreError) as exc:
        raise _failed("list", uri, exc) from None
    return sorted(n for n in names if n and "/" not in n)[:limit]


def list_names(uri: str, store: Store, limit: int = 1000) -> list[str]:
    """Names of the objects directly under the folder `uri` (non-recursive), at most `limit`."""
    if uri.startswith("s3://"):
        return _listing(uri, store, limit, folders=False)
    path = local_path(uri)
    return sorted(p.name for p in path.iterdir() if p.is_file())[:limit] if path.is_dir() else []


def list_folders(uri: str, store: Store, limit: int = 1000) -> list[str]:
    """Names of the folders directly under the folder `uri` (S3: the common prefixes), at most `limit`."""
    if uri.startswith("s3://"):
        return _listing(uri, store, limit, folders=True)
    path = local_path(uri)
    return sorted(p.name for p in path.iterdir() if p.is_dir())[:limit] if path.is_dir() else []
