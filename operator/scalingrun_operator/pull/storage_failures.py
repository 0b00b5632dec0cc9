"""What a failed storage call means: said in words a store cannot fill and that never quote the request, whether
it is worth another try, and what to check when the answer is a final no."""

from __future__ import annotations

from . import endpoint_guard
from ..schema.endpoints import NOT_REACHABLE
from .bounded_http import printable


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
