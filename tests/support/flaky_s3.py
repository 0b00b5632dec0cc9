"""An S3 proxy that fails (or only counts) requests, in front of a real SeaweedFS."""

from __future__ import annotations

import http.client
import http.server
import threading
import time
from typing import Optional
from urllib.parse import urlparse


ERROR_500 = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
             b"<Message>We encountered an internal error. Please try again.</Message></Error>")


class FlakyS3:
    """Answers the first `fail` requests with HTTP 500 (all of them when `fail` is None), or holds the
    first `hang` requests for `hang_seconds` before forwarding; forwards the rest to `upstream`
    unchanged (the Host header too, so SigV4 signatures stay valid). Counts every request. After `hold()`,
    no request is answered any more."""

    def __init__(self, upstream: str, fail: Optional[int] = 0, hang: int = 0, hang_seconds: float = 0.0):
        self.upstream = urlparse(upstream)
        self.fail, self.hang, self.hang_seconds = fail, hang, hang_seconds
        self.requests: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        self._holding, self._closed = threading.Event(), threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def handle_any(self) -> None:
                if proxy._holding.is_set():
                    proxy._closed.wait()  # unanswered until the proxy closes
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    number = len(proxy.requests) + 1
                    failing = proxy.fail is None or number <= proxy.fail
                    proxy.requests.append((self.command, self.path, 500 if failing else 0))
                if failing:
                    self.send_response(500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(ERROR_500)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(ERROR_500)
                    return
                if number <= proxy.hang:
                    time.sleep(proxy.hang_seconds)
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                upstream.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                answer = upstream.getresponse()
                data = answer.read()
                upstream.close()
                with proxy._lock:
                    proxy.requests[number - 1] = (self.command, self.path, answer.status)
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # A HEAD answer carries the object's length, not its own (empty) body's.
                length = answer.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def statuses(self) -> list[int]:
        return [status for _, _, status in self.requests]

    def hold(self) -> None:
        """From now on every request, on a connection old or new, waits unanswered until close(): a store that
        accepts and never answers (its pod on a lost node), so each read waits out its deadline."""
        self._holding.set()

    def close(self) -> None:
        self._closed.set()
        self.server.shutdown()
        self.server.server_close()
