"""What a failed storage call means: the errors a read raises (StorageError and its kinds), in words a store cannot
fill and that never quote the request, whether it is worth another try, and what to check when the answer is a
final no."""

from __future__ import annotations

from . import endpoint_guard
from ..schema.endpoints import NOT_REACHABLE
from .bounded_http import printable


class StorageError(RuntimeError):
    """Storage could not be read; the message names the URI and the cause, never a key."""

    reason = "StorageError"  # a condition's reason
    permanent = False  # the store answered, and no: the store works (its circuit breaker stays closed)
    summary = ""  # what the store did, naming no URI (for other runs on the same store)


class DocumentTooLarge(StorageError):
    """A document is over the operator's size cap: not read, not parsed."""

    reason = "DocumentTooLarge"


class StoreMisbehaved(StorageError):
    """The store did what no working store does; `reason` says which, the message what, never what it sent."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class EndpointNotAllowed(StorageError):
    """The run's endpoint is not on the operator's allow-list: no request is sent to it."""

    reason = "EndpointNotAllowed"


def too_large(uri: str, size: int, cap: int) -> DocumentTooLarge:
    """`uri` is `size` bytes (or more), over the operator's `cap` for one document."""
    return DocumentTooLarge(
        f"{uri} is {_size(size)}{'+' if size > cap else ''}, over the operator's limit of "
        f"{_size(cap)} for one document (SCALINGRUN_MAX_DOCUMENT_BYTES, chart value "
        "operator.maxDocumentBytes); it was not read. Check what writes it, or raise the limit together with the "
        "operator's memory limit")


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 1024:.0f} KiB" if size >= 1024 else f"{size} B"


def describe(exc: Exception) -> str:
    """What went wrong, in words the store cannot fill with more than a short line of printable text, and that
    never quote a request (botocore's texts can hold its signed header)."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{printable(error.get('Code') or 'error', 64)}: {printable(error.get('Message') or '', 200)}".strip()
    if not isinstance(exc, (ConnectionError, HTTPClientError)):
        return type(exc).__name__
    # Refused, timed out, unresolved, address refused: one answer, so that a run cannot map the operator's network.
    return f"the storage endpoint is {NOT_REACHABLE}"


# What to check when S3 refuses for good; {bucket} and {endpoint} are filled in.
PERMANENT_HINTS = {
    "InvalidAccessKeyId": "the store does not know the access key id: check the access key in the credentials "
                          "Secret (spec.storage.credentialsSecret) and that spec.storage.endpoint ({endpoint}) is "
                          "the store it belongs to",
    "SignatureDoesNotMatch": "the secret access key does not match the access key id: check the secret key in the "
                             "credentials Secret (spec.storage.credentialsSecret)",
    "AccessDenied": "these credentials may not use bucket {bucket}: check the user's permissions or the bucket "
                    "policy at {endpoint}",
    "NoSuchBucket": "bucket {bucket} does not exist at {endpoint}: create it, or fix the s3:// URI or "
                    "spec.storage.endpoint",
}
TRANSIENT_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling",
                    "ThrottlingException"}


def transient(exc: Exception) -> bool:
    """A 5xx answer, throttling or a timeout / dropped connection: worth another try."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return status >= 500 or status in (408, 429) or exc.response.get("Error", {}).get("Code") in TRANSIENT_CODES
    return isinstance(exc, (ConnectionError, HTTPClientError)) and not endpoint_guard.refused(exc)


def status_text(exc: Exception) -> str:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f" (HTTP {status})" if status else ""
    return ""
