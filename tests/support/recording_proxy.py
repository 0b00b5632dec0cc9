"""A recording reverse proxy between a client (the operator) and a real API server, for tests.

The client talks plain HTTP to 127.0.0.1:<port>; the proxy forwards each request unchanged (method,
path, headers with the client's bearer token, body) to the API server over TLS and streams the answer
back, watches included. The API server authenticates and authorizes the client itself: the proxy adds
no credentials. For each request it records what the API server's authorizer sees (the verb, API
group, resource, subresource, namespace and name, by Kubernetes' RequestInfo rules) and the status
code of the answer.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from dataclasses import dataclass
from typing import Optional
from urllib.parse import parse_qs, urlsplit

import aiohttp
from aiohttp import web

# Not forwarded: they describe one connection, not the request (RFC 9110, 7.6.1).
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host"}
# k8s.io/apiserver/pkg/endpoints/request/requestinfo.go
_SPECIAL_VERBS = {"proxy", "watch"}
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}  # Go's strconv.ParseBool


@dataclass(frozen=True)
class Request:
    """One request as the API server's authorizer sees it, and its answer."""

    method: str
    path: str
    verb: str
    group: str = ""
    resource: str = ""  # "" for a non-resource URL (/version, discovery)
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    status: int = 0
    query: str = ""  # the query string as sent (labelSelector, watch, ...)

    @property
    def is_resource(self) -> bool:
        return bool(self.resource)

    @property
    def grant(self) -> tuple[str, str, str]:
        """(verb, group, resource[/subresource]): what an RBAC rule must allow for it."""
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return self.verb, self.group, resource


def request_info(method: str, raw_path: str) -> Request:
    """Kubernetes' RequestInfo for a request line (method, path with query)."""
    split = urlsplit(raw_path)
    parts = [p for p in split.path.strip("/").split("/") if p]
    verb = method.lower()
    non_resource = Request(method, split.path, verb, query=split.query)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return non_resource
        group, parts = parts[0], parts[1:]
    parts = parts[1:]  # the version
    if parts[0] in _SPECIAL_VERBS:
        verb, parts = parts[0], parts[1:]
    else:
        verb = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}.get(method, "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        query = parse_qs(split.query)
        verb = "watch" if (query.get("watch") or [""])[0] in _TRUE else "list"
    if not name and verb == "delete":
        verb = "deletecollection"
    return Request(method, split.path, verb, group, resource, subresource, namespace, name, query=split.query)


class RecordingProxy:
    """Serves on 127.0.0.1 in a thread of its own; `requests` lists every request answered so far."""

    def __init__(self, upstream: str, ca_file: str):
        self.upstream = upstream.rstrip("/")
        self.ca_file = ca_file
        self.url = ""
        self._requests: list[Request] = []
        self._guard = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread: Optional[threading.Thread] = None
        self._runner: Optional[web.AppRunner] = None
        self._session: Optional[aiohttp.ClientSession] = None
        self._handlers: set[asyncio.Task] = set()

    @property
    def requests(self) -> list[Request]:
        with self._guard:
            return list(self._requests)

    def start(self) -> "RecordingProxy":
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._open())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="recording-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the recording proxy did not start within 30 s")
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._thread = None

    async def _open(self) -> None:
        context = ssl.create_default_context(cafile=self.ca_file)
        # Bytes pass through as the API server sent them (gzip included): the client decodes them.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _close(self) -> None:
        for task in list(self._handlers):  # watches still open
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._session:
            await self._session.close()
        if self._runner:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            return await self._relay(request)
        finally:
            self._handlers.discard(task)

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}}
        info = request_info(request.method, request.raw_path)
        assert self._session is not None
        async with self._session.request(request.method, self.upstream + request.raw_path, headers=headers,
                                         data=body or None, allow_redirects=False) as upstream:
            with self._guard:
                self._requests.append(Request(**{**info.__dict__, "status": upstream.status}))
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionResetError, aiohttp.ClientConnectionError):
                pass  # the client went away (a watch it ended): nothing more to send
            return response
