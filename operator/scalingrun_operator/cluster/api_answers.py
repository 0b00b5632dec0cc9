"""What the API server answers, read: the raw JSON of a response (no client models), a 404 as None, a connection
given back, an error's own words, a namespace being deleted, /version. Kube (k8s.py) makes the calls."""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Optional

from kubernetes.client.rest import ApiException


def raw_json(response: Any) -> dict[str, Any]:
    return json.loads(response.data)


def released(response: Any) -> None:
    """Reads an answer nobody needs to its end: a response left unread holds its connection until it is garbage,
    and is then closed, so the next request pays a new TLS handshake (one per Event posted, measured)."""
    response.read()
    response.release_conn()


def absent_is_none(call: Callable[[], Any]) -> Optional[dict[str, Any]]:
    try:
        return raw_json(call())
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def namespace_terminating(exc: ApiException) -> bool:
    """The API server refused a write because its namespace is being deleted (the object goes with it)."""
    return exc.status == 403 and "being terminated" in str(exc.body)


def api_message(exc: ApiException) -> str:
    """The API server's own words from an error (its Status message), else the HTTP reason."""
    try:
        message = json.loads(exc.body or b"{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or exc.reason or "no message")[:300]


def parse_version(info: dict[str, Any]) -> tuple[int, int, str]:
    """(major, minor, gitVersion) from /version; minor may read '20+' (vendor builds). Unknown: (0, 0)."""
    git = str(info.get("gitVersion") or "")
    numbers = [re.match(r"\d+", str(info.get(k) or "")) for k in ("major", "minor")]
    if all(numbers):
        return int(numbers[0].group()), int(numbers[1].group()), git
    found = re.match(r"v?(\d+)\.(\d+)", git)
    return (int(found.group(1)), int(found.group(2)), git) if found else (0, 0, git)
