"""botocore's HTTP sender for tenants' stores, bounded: a wall-clock budget per call, a cap per response.

botocore's own sender (urllib3) bounds each socket read by its read timeout, so a store that trickles
its headers or its body a byte at a time holds a request for as long as it likes; and it reads an error
body or a listing page whole, whatever its size. A run chooses its store and one operator serves every
tenant, so `Transport` replaces that sender (botocore's `before-send` event: a response returned stands in):

- every socket operation (connect, TLS handshake, send, each read of headers and body) waits at most
  until the call's deadline (`Budget`), so a call cannot outlive its budget however the store trickles;
- a response's body is read in chunks up to a cap that depends on what it is (`Budget.cap_for`): an
  error answer 64 KiB, a listing page 2 MiB, a document the caller's cap + 1; more is not read;
- redirects are not followed, no HTTP proxy is used: requests go to the endpoint the run names;
- `store_slots.Guard` keeps, per endpoint, how many calls are in flight and a circuit breaker.

A new connection per request: the operator reads a few small documents per run, not a stream of them."""

from __future__ import annotations

import http.client
import io
import os
import select
import socket
import ssl
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit

from . import endpoint_guard
from ..schema.endpoints import EndpointPolicy
from .store_slots import Guard

ERROR_BODY_CAP = 64 * 1024  # an S3 error document is well under 1 KiB
LISTING_PAGE_CAP = 2 * 1024 * 1024  # 1,000 keys of up to 1,024 bytes each, with their XML: ~1.5 MiB
_CHUNK = 64 * 1024
_REDIRECTS = (301, 302, 303, 307, 308)


class Misbehaved(Exception):
    """The store did something no working store does; `reason` names it for a condition. Never retried."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Budget:
    """One storage call: its deadline (time.monotonic()), the per-operation timeout, the cap of a document."""

    deadline: float
    seconds: float  # the whole budget, for messages
    timeout: float
    document_cap: int

    def left(self, what: str) -> float:
        """Seconds left; Misbehaved when none (`what` the store was doing)."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise too_slow(what, self.seconds)
        return remaining

    def wait(self, what: str) -> float:
        """How long one socket operation may wait: the timeout, or less when the budget ends sooner."""
        return min(self.timeout, self.left(what))

    def cap_for(self, operation: str, status: int) -> int:
        if status >= 300:
            return ERROR_BODY_CAP
        if operation == "ListObjectsV2":
            return LISTING_PAGE_CAP
        return self.document_cap + 1  # the caller reads one byte past its cap to tell "over" from "at"


def printable(text: Any, limit: int) -> str:
    """`text` as one line of printable ASCII of at most `limit` characters: what a store sent, safe to show."""
    text = "".join(ch if " " <= ch <= "~" else "?" for ch in str(text))
    return text if len(text) <= limit else text[:limit] + "..."


def too_slow(what: str, seconds: float) -> Misbehaved:
    why = "it is down or unreachable" if what == "connecting" else "it answered too slowly or trickled"
    return Misbehaved("StorageTooSlow", f"the store did not finish {what} within the operator's budget of "
                                        f"{seconds:g} s for one storage call ({why})")


def too_large(what: str, cap: int) -> Misbehaved:
    return Misbehaved("StorageAnswerTooLarge", f"the store's {what} is over the operator's cap of "
                                               f"{cap // 1024} KiB for it; not read")


class _Socket:
    """A connected socket whose every operation waits at most until the budget's deadline."""

    def __init__(self, sock: socket.socket, budget: Budget):
        self._sock, self._budget = sock, budget

    def sendall(self, data: Any) -> None:
        self._sock.settimeout(self._budget.wait("reading the request"))
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb", *_: Any, **__: Any) -> io.BufferedReader:
        return io.BufferedReader(_Reader(self._sock, self._budget), _CHUNK)

    def close(self) -> None:
        self._sock.close()


class _Reader(io.RawIOBase):
    def __init__(self, sock: socket.socket, budget: Budget):
        self._sock, self._budget = sock, budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._budget.wait("its answer"))
        try:
            return self._sock.recv_into(buffer)
        except socket.timeout:
            self._budget.left("its answer")  # the budget is spent: too slow, not a plain timeout
            raise


class _Body:
    """The response body as botocore reads it (`stream`, `read`, `close`), cut at `cap` bytes; the connection is
    closed at its end, at its cap, or on any failure."""

    def __init__(self, response: http.client.HTTPResponse, connection: http.client.HTTPConnection, cap: int,
                 what: str, budget: Budget):
        self._response, self._connection = response, connection
        self._cap, self._what, self._budget = cap, what, budget
        self._read = 0

    def read(self, amt: Optional[int] = None) -> bytes:
        if amt is None:
            return b"".join(self.stream())
        try:
            chunk = self._response.read(min(amt, self._cap + 1 - self._read))
        except Misbehaved:
            self.close()
            raise
        except (http.client.HTTPException, OSError) as exc:
            self.close()
            self._budget.left(self._what)
            raise _dropped(exc) from None
        self._read += len(chunk)
        if self._read > self._cap:
            self.close()
            raise too_large(self._what, self._cap)
        if not chunk:
            self.close()
        return chunk

    def stream(self, **_: Any):
        while True:
            chunk = self.read(_CHUNK)
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        self._response.close()
        self._connection.close()


def _dropped(exc: Exception) -> Exception:
    from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

    if isinstance(exc, socket.timeout):
        return ReadTimeoutError(endpoint_url="(store)", error=str(exc))
    return ConnectionClosedError(endpoint_url="(store)")


class Transport:
    """The `before-send` handler of one botocore client: sends the request itself, within the budget that
    `budget()` gives for the calling thread (no budget: the client's timeout from now)."""

    def __init__(self, timeout: float, budget: Any, policy: Optional[EndpointPolicy] = None):
        self.timeout, self._budget, self.policy = timeout, budget, policy

    def __call__(self, request: Any, event_name: str = "", **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse
        from botocore.exceptions import HTTPClientError

        budget = self._budget() or Budget(time.monotonic() + self.timeout, self.timeout, self.timeout, 2 ** 20)
        operation = event_name.rpartition(".")[2]
        url = urlsplit(request.url)
        sock = self._connect(url, budget)
        connection = http.client.HTTPConnection(url.hostname or "", url.port)
        connection.sock = sock  # type: ignore[assignment]
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        try:
            connection.request(request.method, path, body=request.body,
                               headers={k: v for k, v in request.headers.items()})
            response = connection.getresponse()
        except Misbehaved:
            connection.close()
            raise
        except ValueError:  # a header http.client will not send; its text quotes the header (the signature, a key)
            connection.close()
            raise HTTPClientError(error="a request header could not be sent") from None
        except (http.client.HTTPException, OSError) as exc:
            connection.close()
            budget.left("its answer")
            if isinstance(exc, (http.client.LineTooLong, http.client.HTTPException)) and \
                    not isinstance(exc, http.client.RemoteDisconnected):
                raise Misbehaved("StorageAnswerInvalid", "the store's answer is not valid HTTP (headers too "
                                                         "long, too many, or malformed)") from None
            raise _dropped(exc) from None
        if response.status in _REDIRECTS and response.getheader("Location"):
            response.close()
            connection.close()
            raise Misbehaved("StorageRedirected", f"the store answered with a redirect (HTTP {response.status}) to "
                                                  "another address; the operator does not follow redirects: set "
                                                  "spec.storage.endpoint to the store itself")
        what = "error answer" if response.status >= 300 else "listing page" if operation == "ListObjectsV2" \
            else "answer"
        body = _Body(response, connection, budget.cap_for(operation, response.status), what, budget)
        return AWSResponse(request.url, response.status, response.getheaders(), body)

    def _connect(self, url: Any, budget: Budget) -> _Socket:
        from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

        host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
        try:
            sock = endpoint_guard.open_connection(host, port, self.policy, budget.wait("connecting"))
        except endpoint_guard.AddressRefused as exc:
            raise EndpointConnectionError(endpoint_url=f"{url.scheme}://{url.netloc}", error=exc) from None
        except socket.timeout:
            budget.left("connecting")
            raise ConnectTimeoutError(endpoint_url=f"{url.scheme}://{url.netloc}") from None
        except OSError:
            raise EndpointConnectionError(endpoint_url=f"{url.scheme}://{url.netloc}") from None
        if url.scheme == "https":
            try:
                sock = _handshake(sock, host, budget)
            except ssl.SSLError as exc:
                sock.close()
                raise Misbehaved("StorageTLSFailed", f"TLS with the store failed: {exc.reason or 'handshake'}") \
                    from None
        return _Socket(sock, budget)


def _handshake(sock: socket.socket, host: str, budget: Budget) -> socket.socket:
    """TLS over `sock`, the handshake too within the budget (non-blocking: a trickled handshake is cut)."""
    from botocore.httpsession import get_cert_path

    context = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True))
    tls = context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    tls.setblocking(False)
    while True:
        try:
            tls.do_handshake()
            return tls
        except ssl.SSLWantReadError:
            ready = select.select([tls], [], [], budget.left("the TLS handshake"))[0]
        except ssl.SSLWantWriteError:
            ready = select.select([], [tls], [], budget.left("the TLS handshake"))[1]
        if not ready:
            tls.close()
            raise too_slow("the TLS handshake", budget.seconds)


class Clients:
    """botocore S3 clients by endpoint, region, keys and timeout (creating one costs tens of milliseconds and a
    few MB), each sending through a Transport, and the Guard of their endpoints: the operator keeps one of these
    for its lifetime."""

    def __init__(self, limit: int = 32, guard: Optional[Guard] = None):
        self.limit = limit
        self.guard = guard or Guard()  # calls in flight and the circuit breaker, per endpoint
        self._calls = threading.local()  # the Budget of the calling thread's storage call
        self._lock = threading.Lock()
        self._session: Any = None
        self._clients: "OrderedDict[tuple, Any]" = OrderedDict()

    def get(self, target: Any) -> Any:
        """The client of a storage.StorageTarget."""
        import botocore.session
        from botocore.config import Config

        key = (target.endpoint, target.region, target.credentials.fingerprint() if target.credentials else None,
               target.timeout, target.policy, target.allowed_endpoints)
        with self._lock:
            if key in self._clients:
                self._clients.move_to_end(key)
                return self._clients[key]
            if self._session is None:
                self._session = botocore.session.get_session()
            config = Config(
                connect_timeout=target.timeout, read_timeout=target.timeout,
                retries={"total_max_attempts": 1, "mode": "standard"},  # retried by `retrying`, to a deadline
                # S3-compatible stores behind a plain host:port (MinIO, SeaweedFS) need path-style URLs.
                s3={"addressing_style": "path" if target.endpoint else "auto"},
            )
            kwargs: dict[str, Any] = {"region_name": target.region, "config": config}
            if target.endpoint:
                kwargs["endpoint_url"] = target.endpoint
            if target.credentials:
                kwargs["aws_access_key_id"] = target.credentials.access_key
                kwargs["aws_secret_access_key"] = target.credentials.secret_key
            client = self._session.create_client("s3", **kwargs)
            policy = endpoint_guard.policy_for(target.policy, target.allowed_endpoints)
            client.meta.events.register_first("before-send.s3", Transport(target.timeout, self.budget, policy))
            self._clients[key] = client
            while len(self._clients) > self.limit:
                self._clients.popitem(last=False)
            return client

    def budget(self) -> Optional[Budget]:
        """The Budget of the storage call this thread is in, if any."""
        return getattr(self._calls, "budget", None)

    @contextmanager
    def budgeted(self, budget: Budget) -> Iterator[None]:
        """The calling thread's requests within `budget` until the block ends."""
        self._calls.budget = budget
        try:
            yield
        finally:
            self._calls.budget = None
