"""The address a storage request goes to, checked where the connection is made.

api/endpoints.py refuses literal addresses in a spec; a host name can resolve anywhere, and resolve again
differently between a check and the connection (DNS rebinding). So a botocore client the operator makes for
a run connects through connection classes that resolve the host once, refuse it when any address it resolves
to is one the policy refuses, and connect to the address they checked: TLS still verifies the host name, the
request still names it.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from botocore.awsrequest import (
    AWSHTTPConnection, AWSHTTPConnectionPool, AWSHTTPSConnection, AWSHTTPSConnectionPool,
)
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError

from .api.endpoints import EndpointPolicy, address_class

log = logging.getLogger(__name__)


class AddressRefused(Exception):
    """The store's host resolved to an address the policy refuses; no connection was made."""


def checked_addresses(host: str, port: int, policy: EndpointPolicy) -> list[str]:
    """The addresses to connect to for `host`, in the resolver's order, once every one was allowed."""
    addresses = list(dict.fromkeys(info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))
    for address in addresses:
        why = address_class(address, policy)
        if why:
            # The operator's log (its administrators') says why; the run's status does not (endpoints.NOT_REACHABLE).
            log.warning("storage endpoint %s:%s refused: it resolves to %s, %s", host, port, address, why)
            raise AddressRefused(f"{host}:{port}")
    return addresses


class _Checked:
    policy: EndpointPolicy

    def _new_conn(self) -> Any:
        host = self._dns_host  # type: ignore[attr-defined]
        try:
            addresses = checked_addresses(host, self.port, self.policy)  # type: ignore[attr-defined]
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc  # type: ignore[attr-defined,arg-type]
        try:
            for index, address in enumerate(addresses):  # each in turn, as urllib3 would (IPv6, then IPv4)
                self._dns_host = address  # connect to what was checked, not to a second resolution
                try:
                    return super()._new_conn()  # type: ignore[misc]
                except (NewConnectionError, ConnectTimeoutError):
                    if index == len(addresses) - 1:
                        raise
        finally:
            self._dns_host = host
        raise AssertionError("getaddrinfo returned no address")  # it raises gaierror instead


def guard(client: Any, policy: EndpointPolicy, allowed: tuple[str, ...] = ()) -> Any:
    """`client` (botocore) with its connections checked under `policy`; unchanged when the policy allows any, or
    when an allow-list names the endpoints (the administrators' word: not checked by address)."""
    if policy.allow_any or allowed:
        return client
    http = type("CheckedHTTPConnection", (_Checked, AWSHTTPConnection), {"policy": policy})
    https = type("CheckedHTTPSConnection", (_Checked, AWSHTTPSConnection), {"policy": policy})
    pools = client._endpoint.http_session._pool_classes_by_scheme  # shared with its pool managers
    pools["http"] = type("CheckedHTTPConnectionPool", (AWSHTTPConnectionPool,), {"ConnectionCls": http})
    pools["https"] = type("CheckedHTTPSConnectionPool", (AWSHTTPSConnectionPool,), {"ConnectionCls": https})
    return client


def refused(exc: BaseException) -> bool:
    """Whether a botocore error is a refusal of this guard (botocore wraps it in HTTPClientError)."""
    return isinstance(getattr(exc, "kwargs", {}).get("error"), AddressRefused)
