"""Which object-storage endpoints a run may use: the operator's allow-list (SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS),
and without one, every endpoint but those inside the operator's own reach.

An operator rule, not the API's: admission and `scalingrun validate` accept any endpoint; the operator refuses a
run whose endpoint is off its list (decide, when the spec is accepted) and sends no request to one (storage).

Without an allow-list a run could make the operator, which serves every tenant, send requests to what only the
operator's pod can reach: the cloud's metadata service (link-local 169.254.0.0/16, fe80::/10, and the few
metadata addresses outside it), the pod itself (loopback), the API server and the cluster's Services. Those are
refused unless the operator is told to allow any endpoint (SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT). A literal
address is refused here, when the spec is read; a host name is resolved by storage (endpoint_guard), which
checks every address it resolves to and connects to the address it checked.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional, Union
from urllib.parse import urlparse

# The endpoint a run that names none (AWS S3) counts as.
AWS_S3_ENDPOINT = "https://s3.amazonaws.com"

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

# Cloud metadata services outside the link-local ranges: AWS's over IPv6, Alibaba Cloud's.
_METADATA = (ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200"))
# One message for every endpoint refused by address or not reached at all: a run must not learn which
# addresses and ports of the operator's network answer (a port scanner).
NOT_REACHABLE = "not reachable or not allowed"


@dataclass(frozen=True)
class EndpointPolicy:
    """The addresses a run's store may have, when no allow-list names the endpoints."""

    allow_any: bool = False  # SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT: addresses are not checked
    service_ranges: tuple[str, ...] = ()  # the cluster's Service CIDRs (SCALINGRUN_CLUSTER_SERVICE_RANGES)
    api_server: tuple[str, ...] = ()  # the API server's addresses (KUBERNETES_SERVICE_HOST)
    local_files: bool = False  # file:// and paths read this machine's disk: `scalingrun run --local` only

    @classmethod
    def anything(cls) -> "EndpointPolicy":
        """A local run's: its store and its files are the user's own."""
        return cls(allow_any=True, local_files=True)


def normalised_endpoint(url: Optional[str]) -> str:
    """scheme://host:port[/path] with the default port filled in, for comparing endpoints; None is AWS S3."""
    parsed = urlparse(url or AWS_S3_ENDPOINT)
    scheme = (parsed.scheme or "https").lower()
    port = parsed.port or (443 if scheme == "https" else 80)
    return f"{scheme}://{(parsed.hostname or '').lower()}:{port}{parsed.path.rstrip('/')}"


def _address(text: str) -> Optional[Address]:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])  # fe80::1%eth0: the zone does not matter
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
    return address


def address_class(text: str, policy: EndpointPolicy) -> Optional[str]:
    """What makes the address `text` one a run's store may not have under `policy` (e.g. 'link-local (cloud
    metadata)'); None when it may, or when `text` is not an address."""
    address = _address(text)
    if address is None or policy.allow_any:
        return None
    if address.is_link_local or address in _METADATA:
        return "link-local (cloud metadata)"
    if address.is_loopback:
        return "loopback (the operator's own pod)"
    if address.is_unspecified:
        return "unspecified (0.0.0.0 or ::, the operator's own pod)"
    if address.is_multicast:
        return "multicast"
    if any(_address(host) == address for host in policy.api_server):
        return "the Kubernetes API server"
    for cidr in policy.service_ranges:
        if address in ipaddress.ip_network(cidr, strict=False):
            return f"in the cluster's Service range {cidr}"
    return None


def endpoint_refusal(endpoint: Optional[str], allowed: tuple[str, ...],
                     policy: EndpointPolicy = EndpointPolicy(allow_any=True)) -> Optional[str]:
    """Why a run may not use `endpoint` (spec.storage.endpoint) under the allow-list `allowed`, or without one
    under `policy` (literal addresses and localhost; storage checks what a host name resolves to); None when it
    may."""
    if allowed:
        if normalised_endpoint(endpoint) in {normalised_endpoint(a) for a in allowed}:
            return None
        named = endpoint or f"none (AWS S3, which the allow-list names as {AWS_S3_ENDPOINT})"
        return (f"spec.storage.endpoint: {named} is not an endpoint this operator may use; allowed: "
                f"{', '.join(allowed)} (the operator's SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS, chart value "
                "operator.allowedStorageEndpoints): use one of them, or ask the cluster's administrators to add it")
    if endpoint is None or policy.allow_any:
        return None
    host = (urlparse(endpoint).hostname or "").lower().rstrip(".")
    why = address_class(host, policy) or (
        "loopback (the operator's own pod)" if host == "localhost" or host.endswith(".localhost") else None)
    if why is None:
        return None
    return (f"spec.storage.endpoint: {endpoint} is {why}, where this operator sends no request for a run; "
            "use the store's own address (a Service name such as http://minio.storage:9000), or ask the cluster's "
            "administrators to name it in the chart value operator.allowedStorageEndpoints")


def local_path_refusal(field: str, uri: Optional[str], policy: EndpointPolicy) -> Optional[str]:
    """Why the operator may not read `uri` (a spec field it reads documents from); None when it may."""
    if not uri or uri.startswith("s3://") or policy.local_files:
        return None
    return (f"{field}: {uri} is a path on the operator's own disk; in a cluster the operator reads documents only "
            "from s3:// (paths and file:// are for `scalingrun run --local`)")
