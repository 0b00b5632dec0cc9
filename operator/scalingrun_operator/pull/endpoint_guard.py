"""The address a storage request goes to, checked where the connection is made.

schema/endpoints.py refuses literal addresses in a spec; a host name can resolve anywhere, and resolve again
differently between a check and the connection (DNS rebinding). So the operator's storage requests
(bounded_http.Transport) connect through `open_connection`, which resolves the host once, refuses it when any
address it resolves to is one the policy refuses, and connects to the address it checked: TLS still verifies
the host name, the request still names it.
"""

from __future__ import annotations

import logging
import socket
from typing import Optional

from ..schema.endpoints import EndpointPolicy, address_class

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


def open_connection(host: str, port: int, policy: Optional[EndpointPolicy], timeout: float) -> socket.socket:
    """A connection to `host`: under `policy`, to an address it allows, resolved once and each address tried in
    turn (as urllib3 would: IPv6, then IPv4); with no policy (allow-any, or an allow-list: the administrators'
    word), as socket.create_connection. AddressRefused before any connection when an address is refused."""
    if policy is None:
        return socket.create_connection((host, port), timeout=timeout)
    addresses = checked_addresses(host, port, policy)
    for index, address in enumerate(addresses):
        try:
            return socket.create_connection((address, port), timeout=timeout)  # what was checked, not a new lookup
        except OSError:
            if index == len(addresses) - 1:
                raise
    raise AssertionError("getaddrinfo returned no address")  # it raises gaierror instead


def policy_for(policy: EndpointPolicy, allowed: tuple[str, ...]) -> Optional[EndpointPolicy]:
    """The policy connections are checked under: none when it allows any endpoint or an allow-list names them."""
    return None if policy.allow_any or allowed else policy


def refused(exc: BaseException) -> bool:
    """Whether a botocore error is a refusal of this guard (the Transport raises it as EndpointConnectionError)."""
    return isinstance(getattr(exc, "kwargs", {}).get("error"), AddressRefused)
