"""The operator's only object-storage client: small JSON documents and key listings.

The operator reads two documents (the dataset manifest and the trainer's progress) and, to explain a
failed preprocessing, lists shard manifests. botocore does that without TensorFlow or pyarrow in the
operator image. s3:// URIs use the run's endpoint, region and the keys from the run's Secret
(read through the Kubernetes API by the caller); absolute paths and file:// URIs read the
filesystem. Keys are passed straight to botocore: never logged, never stored in status or events.

Every S3 call goes through `retrying`: 5xx answers, throttling and timeouts are retried with
exponential backoff until the target's deadline; a permanent 4xx (unknown key, wrong secret, access
denied, no bucket) fails at once with what to check. botocore's own retries are off, so that the
deadline and the message are ours.

Bounded, because a run chooses its store and the operator serves every tenant from one pod: a document
is read only up to the target's `max_document_bytes` (1 MiB unless the operator is configured otherwise;
parsed JSON can take 20 times its size), a listing stops at `limit` names and at a few pages past what
those need, and with `allowed_endpoints` set no request goes to any other endpoint. bounded_http sends the
requests: a call cannot outlive `deadline`, an error answer or a listing page is read only up to its cap,
and an endpoint that keeps failing is not asked again until its backoff has passed (`Clients.guard`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from ..object_store import (  # noqa: F401 (Credentials: pull mode's keys are the tools' kind)
    Credentials, json_object, local_path, split_s3,
)
from ..schema.endpoints import EndpointPolicy, endpoint_refusal
from .bounded_http import Budget, Clients, Misbehaved
from .storage_failures import (  # noqa: F401 (DocumentTooLarge: what a read over the cap raises)
    PERMANENT_HINTS, DocumentTooLarge, EndpointNotAllowed, StorageError, StoreMisbehaved, describe, status_text,
    too_large, transient,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


# Big enough for a manifest of 20,000 classes and 256 shards (~0.5 MiB) and a progress document with about
# 5,000 epochs of history; small enough that the 12 reads the operator may run at once fit in its 512Mi
# limit beside its usual 200 MiB, whatever the documents hold (1 MiB of "[[],[],...]" parses into ~20 MiB).
DEFAULT_MAX_DOCUMENT_BYTES = 1024 * 1024
EXTRA_PAGES = 8  # pages a listing may take beyond what its limit needs (a store may answer short pages)


@dataclass(frozen=True)
class StorageTarget:
    """Where and how to reach a run's objects (`clients`: whose client cache serves the calls)."""

    endpoint: Optional[str]
    region: str
    credentials: Optional[Credentials]
    timeout: float = 10.0  # the longest wait of one socket operation (connect, a read)
    deadline: float = 30.0  # a call, its retries included, ends this long after it started (its budget)
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES  # a larger document is refused, not read
    allowed_endpoints: tuple[str, ...] = ()  # non-empty: the only endpoints requests may go to
    policy: EndpointPolicy = EndpointPolicy.anything()  # the operator's: store_source.target_of; tools': any
    clients: Clients = field(default_factory=Clients, compare=False, repr=False)


def _local_path(uri: str, target: StorageTarget) -> Path:
    if not target.policy.local_files:
        raise EndpointNotAllowed(f"cannot read {uri}: in a cluster the operator reads s3:// only, not its own disk")
    return local_path(uri)


def _client(target: StorageTarget) -> Any:
    """The client of the target's cache; none for an endpoint the allow-list or the policy refuses."""
    refusal = endpoint_refusal(target.endpoint, target.allowed_endpoints, target.policy)
    if refusal:
        raise EndpointNotAllowed(refusal)
    return target.clients.get(target)


def retrying(what: str, uri: str, target: StorageTarget, call: Callable[[], T]) -> T:
    """`call()` with retries of transient failures, all within `target.deadline`; StorageError otherwise.

    `call` raises botocore errors; a ClientError it wants to handle (NoSuchKey) it must handle itself. A store
    whose breaker is open fails at once; one with its share of calls in flight raises bounded_http.Busy."""
    endpoint, guard = (target.endpoint or "AWS S3"), target.clients.guard
    closed_in, last = guard.open_for(endpoint), guard.last_failure(endpoint)
    if closed_in and last:
        raise StoreMisbehaved(f"cannot {what} {uri}: the store at {endpoint} failed the operator's last requests "
                              f"({last[1]}); it is asked again in {closed_in:.0f} s", last[0])
    _client(target)  # made (tens of ms, seconds on a busy node) before the budget starts: not the store's time
    # Failures of the store's doing count (not the document's, run's or keys'), kept without a URI (tenants share).
    with guard.slot(endpoint, lambda exc: (exc.reason, exc.summary) if isinstance(exc, StoreMisbehaved) or (
            type(exc) is StorageError and not exc.permanent) else None, short=target.deadline < 5):
        return _attempts(what, uri, target, call)


def _attempts(what: str, uri: str, target: StorageTarget, call: Callable[[], T]) -> T:
    from botocore.exceptions import BotoCoreError, ClientError

    started, delay, attempts = time.monotonic(), 0.25, 0
    endpoint, budget = target.endpoint or "AWS S3", Budget(started + target.deadline, target.deadline,
                                                            target.timeout, target.max_document_bytes)

    def still_failing(exc: Exception, elapsed: float) -> StorageError:
        error = StorageError(
            f"cannot {what} {uri}: {describe(exc)}{status_text(exc)}, still failing after {attempts} "
            f"attempts in {elapsed:.1f} s (storage deadline {target.deadline:g} s); check that the "
            f"store at {endpoint} is up")
        error.summary = f"{type(exc).__name__}{status_text(exc)} for {elapsed:.0f} s"
        return error

    retried: Optional[Exception] = None  # the transient failure being retried, if any
    with target.clients.budgeted(budget):
        while True:
            attempts += 1
            try:
                return call()
            except Misbehaved as exc:
                if retried is not None and exc.reason == "StorageTooSlow":
                    # The budget ran out in a retry: the failure retried is the cause, not the last attempt's time.
                    raise still_failing(retried, time.monotonic() - started) from None
                error = StoreMisbehaved(f"cannot {what} {uri}: {exc}; check the store at {endpoint}", exc.reason)
                error.summary = str(exc)
                raise error from None
            except (ClientError, BotoCoreError) as exc:
                elapsed = time.monotonic() - started
                pause = delay / 2 + random.uniform(0, delay / 2)
                if not isinstance(exc, ClientError) and (not transient(exc) or elapsed + pause >= target.deadline):
                    # No attempt count or time: they would tell a refused port from a filtered one.
                    error = StorageError(f"cannot {what} {uri}: {describe(exc)}; check spec.storage.endpoint "
                                         f"({endpoint}) and that the store is up")
                    error.summary = describe(exc)
                    raise error from None
                if not transient(exc):
                    code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
                    hint = PERMANENT_HINTS.get(code or "", "not retried")
                    hint = hint.format(bucket=split_s3(uri)[0] if uri.startswith("s3://") else uri,
                                       endpoint=endpoint)
                    error = StorageError(f"cannot {what} {uri}: {describe(exc)}{status_text(exc)}; {hint}")
                    error.permanent = isinstance(exc, ClientError)  # the store answered: it works
                    error.summary = f"{type(exc).__name__}{status_text(exc)}"
                    raise error from None
                if elapsed + pause >= target.deadline:
                    raise still_failing(exc, elapsed) from None
                retried = exc
                log.info("%s %s failed (%s%s), attempt %d; retrying in %.2f s", what, uri, describe(exc),
                         status_text(exc), attempts, pause)
                time.sleep(pause)
                delay = min(delay * 2, 4.0)


def _read_capped(uri: str, stream: Any, length: Optional[int], target: StorageTarget) -> bytes:
    """At most `target.max_document_bytes` of `stream`; DocumentTooLarge (the stream closed) beyond that, by the
    announced length before any byte is read, or by what arrives (a length may be missing or wrong)."""
    cap = target.max_document_bytes
    try:
        if length is not None and length > cap:
            raise too_large(uri, length, cap)
        data = stream.read(cap + 1)
        if len(data) > cap:
            raise too_large(uri, len(data), cap)
        return data
    finally:
        stream.close()


def _get_object(uri: str, target: StorageTarget) -> tuple[Optional[bytes], Optional[str]]:
    """(the object's bytes, its ETag), or (None, None) when it does not exist. S3 only."""
    from botocore.exceptions import ClientError

    bucket, key = split_s3(uri)

    def get() -> tuple[Optional[bytes], Optional[str]]:
        try:
            response = _client(target).get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None, None
            raise
        # Inside the retry: a body cut short is tried again.
        return _read_capped(uri, response["Body"], response.get("ContentLength"), target), response.get("ETag")

    return retrying("read", uri, target, get)


def _read_file(uri: str, target: StorageTarget) -> Optional[bytes]:
    try:
        with _local_path(uri, target).open("rb") as stream:
            return _read_capped(uri, stream, os.fstat(stream.fileno()).st_size, target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from None


def read_bytes(uri: str, target: StorageTarget) -> Optional[bytes]:
    """The object's bytes (at most `target.max_document_bytes`), or None when it does not exist."""
    if uri.startswith("s3://"):
        return _get_object(uri, target)[0]
    return _read_file(uri, target)


def read_json(uri: str, target: StorageTarget) -> Optional[dict[str, Any]]:
    """A JSON object document, or None when absent. A document that is not a JSON object is an error."""
    data = read_bytes(uri, target)
    return None if data is None else json_object(uri, data, StorageError)


def _s3_listing(uri: str, target: StorageTarget, limit: int, names_of: Callable[[dict[str, Any], str], list[str]],
                **request: str) -> list[str]:
    """At most `limit` names of a paged S3 listing of the folder `uri` (`names_of(page, prefix)` reads a page), in
    pages of at most 1000 keys, stopped (StoreMisbehaved) past `EXTRA_PAGES` pages more than `limit` needs."""
    bucket, prefix = split_s3(uri)
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    page_size = min(limit, 1000)
    most_pages = -(-limit // page_size) + EXTRA_PAGES

    def listing() -> list[str]:
        from botocore.exceptions import PaginationError

        names: list[str] = []
        pages = _client(target).get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, PaginationConfig={"PageSize": page_size}, **request)
        try:
            for count, page in enumerate(pages, 1):
                names += names_of(page, prefix)
                if len(names) >= limit:
                    break
                if count >= most_pages and page.get("IsTruncated"):
                    raise Misbehaved("StorageListingEndless", f"the store answered {count} listing pages with "
                                                              f"{len(names)} keys and still more to come, where "
                                                              f"{limit} keys need at most {most_pages - EXTRA_PAGES}"
                                                              "; the listing was stopped")
        except PaginationError:
            raise Misbehaved("StorageListingEndless", "the store answered a listing page with the token it "
                                                      "was asked with; the listing was stopped") from None
        return names

    return retrying("list", uri, target, listing)


def list_names(uri: str, target: StorageTarget, limit: int = 1000) -> list[str]:
    """Names of the objects directly under the folder `uri` (non-recursive for local paths); at most `limit`,
    read in pages of at most 1000 keys (S3 allows 1024 bytes a key: one page is at most ~1.5 MB of XML), and
    at most `EXTRA_PAGES` pages more than `limit` needs: a store that answers page after page with a fresh
    token and no end is stopped, with StoreMisbehaved."""
    if uri.startswith("s3://"):
        names = _s3_listing(uri, target, limit,
                            lambda page, prefix: [item["Key"][len(prefix):] for item in page.get("Contents", [])])
        return sorted(n for n in names if n and "/" not in n)[:limit]
    path = _local_path(uri, target)
    if not path.is_dir():
        return []
    return sorted(p.name for p in path.iterdir() if p.is_file())[:limit]


def list_folders(uri: str, target: StorageTarget, limit: int = 1000) -> list[str]:
    """Names of the folders directly under the folder `uri` (S3: the common prefixes of a delimited listing), at
    most `limit`, in pages of at most 1000, stopped (StoreMisbehaved) past `EXTRA_PAGES` pages more than needed."""
    if not uri.startswith("s3://"):
        path = _local_path(uri, target)
        return sorted(p.name for p in path.iterdir() if p.is_dir())[:limit] if path.is_dir() else []
    names = _s3_listing(uri, target, limit, lambda page, prefix: [
        item["Prefix"][len(prefix):].rstrip("/") for item in page.get("CommonPrefixes", [])], Delimiter="/")
    return sorted(n for n in names if n)[:limit]


# --- versioned reads: the progress watcher's cheap check -----------------------------------------------


def _file_version(path: Path) -> Optional[str]:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from None
    return f"{stat.st_mtime_ns}-{stat.st_size}"


def read_json_versioned(uri: str, target: StorageTarget) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """read_json and the version it read (S3: the ETag; files: mtime and size); (None, None) when absent."""
    if not uri.startswith("s3://"):
        version = _file_version(_local_path(uri, target))  # before the read: a write in between costs a reconcile
        return read_json(uri, target), version
    data, etag = _get_object(uri, target)
    if data is None:
        return None, None
    return json_object(uri, data, StorageError), etag


# The watcher checks many runs in turn: a failing store gets a short retry, the next round tries again.
_CHECK_DEADLINE_SECONDS = 2.0


def changed_since(uri: str, target: StorageTarget, version: Optional[str]) -> tuple[bool, Optional[str]]:
    """(whether the object is no longer at `version`, its version now). S3: a GET with If-None-Match, whose 304
    answer has no body; a store that ignores the header costs a body, not a false change. Files: a stat."""
    if not uri.startswith("s3://"):
        now = _file_version(_local_path(uri, target))
        return now != version, now
    from botocore.exceptions import ClientError

    bucket, key = split_s3(uri)
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if version:
        kwargs["IfNoneMatch"] = version

    def check() -> tuple[bool, Optional[str]]:
        try:
            response = _client(target).get_object(**kwargs)
            response["Body"].close()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 304 or code in ("304", "NotModified"):
                return False, version
            if code in ("NoSuchKey", "404", "NotFound"):
                return version is not None, None
            raise
        etag = response.get("ETag")
        return etag != version, etag

    quick = dataclasses.replace(target, deadline=min(target.deadline, _CHECK_DEADLINE_SECONDS))
    return retrying("check", uri, quick, check)
