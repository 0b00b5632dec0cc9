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
- `Guard` keeps, per endpoint, how many calls are in flight (at most `per_endpoint`) and a circuit
  breaker: a store that failed its last calls is not asked again until its backoff has passed.

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
from typing import Any, Callable, Iterator, Optional
from urllib.parse import urlsplit

ERROR_BODY_CAP = 64 * 1024  # an S3 error document is well under 1 KiB
LISTING_PAGE_CAP = 2 * 1024 * 1024  # 1,000 keys of up to 1,024 bytes each, with their XML: ~1.5 MiB
_CHUNK = 64 * 1024
_REDIRECTS = (301, 302, 303, 307, 308)


class Misbehaved(Exception):
    """The store did something no working store does; `reason` names it for a condition. Never retried."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Busy(Exception):
    """The endpoint has its share of calls in flight already: try again shortly (`delay`), nothing is wrong."""

    def __init__(self, message: str, delay: float):
        super().__init__(message)
        self.delay = delay


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

    def __init__(self, timeout: float, budget: Any):
        self.timeout, self._budget = timeout, budget

    def __call__(self, request: Any, event_name: str = "", **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

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
            sock = socket.create_connection((host, port), timeout=budget.wait("connecting"))
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


class Guard:
    """Per endpoint: calls in flight (at most `per_endpoint`, half the operator's handler threads: a store that
    holds its calls cannot hold them all; a call waits up to `wait` seconds for a slot, far longer than a healthy
    store's answers take) and a circuit breaker.

    After `threshold` failures in a row (the store misbehaved, could not be reached or timed out) the
    endpoint is open: calls fail at once with the last failure, for `base` seconds, doubling with each
    failure after that up to `longest`. One success closes it. A failure is kept as (reason, summary), the
    summary naming no URI: tenants may share a store, and one's conditions must not show another's paths."""

    def __init__(self, per_endpoint: int = 4, threshold: int = 2, base: float = 5.0, longest: float = 300.0,
                 wait: float = 0.5):
        self.per_endpoint, self.threshold, self.base, self.longest, self.wait = (
            per_endpoint, threshold, base, longest, wait)
        self._lock = threading.Condition()
        self._in_flight: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self._open_until: dict[str, float] = {}
        self._last: dict[str, tuple[str, str]] = {}

    def open_for(self, endpoint: str) -> float:
        """Seconds until the endpoint may be asked again (0: it may be now)."""
        with self._lock:
            return max(0.0, self._open_until.get(endpoint, 0.0) - time.monotonic())

    def last_failure(self, endpoint: str) -> Optional[tuple[str, str]]:
        with self._lock:
            return self._last.get(endpoint)

    def enter(self, endpoint: str) -> None:
        """Takes a slot; Busy when none frees within `wait` seconds. The caller checks `open_for` first."""
        deadline = time.monotonic() + self.wait
        with self._lock:
            while self._in_flight.get(endpoint, 0) >= self.per_endpoint:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Busy(f"the operator has {self.per_endpoint} requests to {endpoint} in flight already",
                               delay=1.0)
                self._lock.wait(left)
            self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1

    @contextmanager
    def slot(self, endpoint: str, judge: Callable[[Exception], Optional[tuple[str, str]]],
             short: bool = False) -> Iterator[None]:
        """A slot for one call to `endpoint`; an exception that `judge` turns into (reason, summary) is a failure
        of the store, any other is not. `short`: a budget too short to call the store slow (a busy node can
        make a healthy store miss a 2 s check): running out of it is not a failure."""
        self.enter(endpoint)
        failure = None
        try:
            yield
        except Exception as exc:
            failure = judge(exc)
            if short and failure and failure[0] == "StorageTooSlow":
                failure = None
            raise
        finally:
            self.leave(endpoint, failure)

    def leave(self, endpoint: str, failure: Optional[tuple[str, str]]) -> None:
        with self._lock:
            self._in_flight[endpoint] -= 1
            if not self._in_flight[endpoint]:
                del self._in_flight[endpoint]
            if failure is None:
                for table in (self._failures, self._open_until, self._last):
                    table.pop(endpoint, None)
            else:
                count = self._failures[endpoint] = self._failures.get(endpoint, 0) + 1
                self._last[endpoint] = failure
                if count >= self.threshold:
                    backoff = min(self.longest, self.base * 2 ** (count - self.threshold))
                    self._open_until[endpoint] = time.monotonic() + backoff
            self._lock.notify_all()


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
               target.timeout)
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
            client.meta.events.register_first("before-send.s3", Transport(target.timeout, self.budget))
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
