"""Pushes rank 0's progress and heartbeat documents to the operator's status endpoint, beside their write to storage.

The operator mounts into the run's pods a projected ServiceAccount token, the endpoint's URL and CA bundle
(scalingrun_api.status_push, STATUS_DIR) and names the run's push path (STATUS_PATH_VARIABLE). Where any of it is
missing (an older operator) `status_pusher()` is None and nothing is pushed; it is looked for again
every LOOK_AGAIN_SECONDS, so a run made in pull mode starts pushing once the operator's endpoint is turned on.

Never in the training step's way: `push` only replaces the pending document of its kind (a push is a full state
document, so the newest one is all that counts: a bounded queue of one per kind) and a daemon thread sends it.
When the operator is away the thread backs off (up to MAX_BACKOFF_SECONDS); a refusal that no retry can change
(401, 403, 400, 413) drops that document and is said once. Storage stays the durable record, but in push mode the
operator learns how a training ended only from its last push: the end of training waits for it to be sent through
an operator's failover (FINAL_FLUSH_SECONDS), and the wait cuts any backoff short.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Callable, Optional

from scalingrun_api.status_push import (
    CA_FILE, STATUS_DIR, STATUS_DIR_VARIABLE, STATUS_PATH_VARIABLE, TOKEN_FILE, URL_FILE,
)

TIMEOUT_SECONDS = 10.0
FIRST_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS = 1.0, 60.0
# How long the end of training waits for its last document to be sent: through a leader's failover on a busy node
# (the Lease's 15 s, the standby's start and its Service endpoint; a minute and more at the e2e's load, where 5 s lost
# the final epochs and the run Succeeded showing an older one). Only a run whose operator stays away waits it all.
FINAL_FLUSH_SECONDS = 120.0
FLUSH_RETRY_SECONDS = 2.0  # the backoff while a flush waits: the end of training is no time to wait a minute


class StatusPusher:
    def __init__(self, base_url: str, path: str, ca_file: Path, token_file: Path,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)):
        self.base_url, self.path, self.ca_file, self.token_file, self.log = base_url, path, ca_file, token_file, log
        self.sent = 0
        self._pending: dict[str, bytes] = {}
        self._sending = 0
        self._flushing = 0
        self._said: set[str] = set()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._send_forever, name="status-push", daemon=True)
        self._thread.start()

    def push(self, what: str, document: dict) -> None:
        """Queues `document` (progress or heartbeat) in place of any of its kind not sent yet; returns at once."""
        body = json.dumps(document).encode()
        with self._changed:
            self._pending[what] = body
            self._changed.notify_all()

    def flush(self, timeout: float) -> bool:
        """Waits until nothing is pending or being sent (or `timeout`); whether it all went."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._flushing += 1
            self._changed.notify_all()  # a sender in backoff tries again now
            try:
                while self._pending or self._sending:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._changed.wait(left)
                return True
            finally:
                self._flushing -= 1

    def _send_forever(self) -> None:
        backoff = 0.0
        while True:
            with self._changed:
                while not self._pending:
                    self._changed.wait()
                what, body = next(iter(self._pending.items()))
                del self._pending[what]
                self._sending += 1
            try:
                retry_after = self._send(what, body)
            finally:
                with self._changed:
                    self._sending -= 1
                    if retry_after is not None:
                        self._pending.setdefault(what, body)  # unless a newer one came meanwhile
                    self._changed.notify_all()
            if retry_after is None:
                backoff = 0.0
                continue
            backoff = min(MAX_BACKOFF_SECONDS, max(FIRST_BACKOFF_SECONDS, backoff * 2, retry_after))
            self._back_off(backoff)

    def _back_off(self, seconds: float) -> None:
        """Waits `seconds` before the next try; at most FLUSH_RETRY_SECONDS once a flush waits."""
        started = time.monotonic()
        with self._changed:
            while True:
                wait = min(seconds, FLUSH_RETRY_SECONDS) if self._flushing else seconds
                left = started + wait - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(left)  # a flush (or a push) wakes it to look again

    def _send(self, what: str, body: bytes) -> Optional[float]:
        """Sends one document; None when done with it (sent, or refused for good), else seconds to wait before
        trying again."""
        url = urllib.parse.urlsplit(self.base_url)
        try:
            token = self.token_file.read_text().strip()  # the kubelet rotates it: read it each time
            context = ssl.create_default_context(cafile=str(self.ca_file))
            connection = http.client.HTTPSConnection(url.hostname, url.port or 443, timeout=TIMEOUT_SECONDS,
                                                     context=context)
            try:
                connection.request("POST", f"{self.path}/{what}", body=body, headers={
                    "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
            finally:
                connection.close()
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            self._say_once("away", f"scalingrun-trainer: the operator's status endpoint {self.base_url} does not "
                                   f"answer ({type(exc).__name__}: {exc}); trying again with backoff, training goes on")
            return FIRST_BACKOFF_SECONDS
        if response.status < 300:
            self.sent += 1
            return None
        if response.status == 429 or response.status >= 500:
            return float(response.getheader("Retry-After") or FIRST_BACKOFF_SECONDS)
        self._say_once(f"refused-{response.status}", f"scalingrun-trainer: the operator refused a {what} push "
                                                     f"(HTTP {response.status}); storage still has the document")
        return None

    def _say_once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.log(line)


def _find_pusher() -> Optional[StatusPusher]:
    """A pusher from what the operator mounted and set; None when something is missing."""
    directory = Path(os.environ.get(STATUS_DIR_VARIABLE, STATUS_DIR))
    path = os.environ.get(STATUS_PATH_VARIABLE, "")
    try:
        base_url = (directory / URL_FILE).read_text().strip()
    except OSError:
        return None
    if not path or not base_url or not (directory / TOKEN_FILE).is_file() or not (directory / CA_FILE).is_file():
        return None
    return StatusPusher(base_url, path, directory / CA_FILE, directory / TOKEN_FILE)


class PusherOnceFound:
    """This process's pusher, kept once found. While something is missing it is looked for again, at most every
    LOOK_AGAIN_SECONDS: a pod made while the operator ran without its status endpoint (pull mode) mounts the
    endpoint's ConfigMap optional and finds it absent; after a `helm upgrade` to the push path the operator writes
    it and the kubelet fills the mounted files in, so a run in flight starts pushing then (docs/install.md,
    "Upgrade")."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self.cache_clear()

    def cache_clear(self) -> None:
        """Forgets the pusher and when it was looked for (tests)."""
        self._found: Optional[StatusPusher] = None
        self._looked: Optional[float] = None

    def __call__(self) -> Optional[StatusPusher]:
        with self._lock:
            now = self.clock()
            if self._found is None and (self._looked is None or now - self._looked >= LOOK_AGAIN_SECONDS):
                self._looked = now
                self._found = _find_pusher()
            return self._found


LOOK_AGAIN_SECONDS = 30.0
status_pusher = PusherOnceFound()
