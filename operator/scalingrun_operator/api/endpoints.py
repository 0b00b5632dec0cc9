"""Which object-storage endpoints a run may use: the operator's allow-list (SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS).

An operator rule, not the API's: admission and `scalingrun validate` accept any endpoint; the operator refuses a
run whose endpoint is off its list (decide, when the spec is accepted) and sends no request to one (storage).
"""

from __future__ import annotations

from typing import Optional
from urllib.parse import urlparse

# The endpoint a run that names none (AWS S3) counts as.
AWS_S3_ENDPOINT = "https://s3.amazonaws.com"


def normalised_endpoint(url: Optional[str]) -> str:
    """scheme://host:port[/path] with the default port filled in, for comparing endpoints; None is AWS S3."""
    parsed = urlparse(url or AWS_S3_ENDPOINT)
    scheme = (parsed.scheme or "https").lower()
    port = parsed.port or (443 if scheme == "https" else 80)
    return f"{scheme}://{(parsed.hostname or '').lower()}:{port}{parsed.path.rstrip('/')}"


def endpoint_refusal(endpoint: Optional[str], allowed: tuple[str, ...]) -> Optional[str]:
    """Why a run may not use `endpoint` (spec.storage.endpoint) under the allow-list `allowed`; None when it may."""
    if not allowed or normalised_endpoint(endpoint) in {normalised_endpoint(a) for a in allowed}:
        return None
    named = endpoint or f"none (AWS S3, which the allow-list names as {AWS_S3_ENDPOINT})"
    return (f"spec.storage.endpoint: {named} is not an endpoint this operator may use; allowed: "
            f"{', '.join(allowed)} (the operator's SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS, chart value "
            "operator.allowedStorageEndpoints): use one of them, or ask the cluster's administrators to add it")
