"""The status endpoint: HTTPS on its own port, where the runs' own processes push their progress and heartbeat.

One request validator for both sides: the operator serves it on its Service, and the local runner on 127.0.0.1 for
its run's processes (local/pushes.py). Only who may push differs, the Authenticator: the operator's reviews a pod's
projected ServiceAccount token (cluster/push_auth.py), the local runner's compares the run's random secret.

POST /v1/namespaces/{namespace}/scalingruns/{run}/{progress|heartbeat} with a bearer token and the
full state document (the JSON the trainer writes to storage). Refused, each counted by reason: a body over
MAX_BODY_BYTES (413), a namespace the operator does not watch (403), a token that is missing, invalid or not ours
(401), a run the operator does not know (404), a pod the run does not own or of another namespace (403), more than
the run's share of pushes (429), a body that is no JSON object (400), a document past a bound of its run (413), its
namespace or all namespaces (429; pushed.py; told to `on_full` too). A token no review vouched for yet passes
push_admission.py before its review: refused again from the cache when a review refused it (401), or turned away
while its source sends too many new tokens or holds its share of the line of reviews (429); a known pod's push is
reviewed apart, so a flood of bad tokens does not delay it.
Accepted pushes are kept (pushed.py) and told to `on_push` (the operator reconciles the run after a progress push).

It runs its own event loop in a thread of its own: a flood of pushes never waits on kopf's loop, nor kopf on it.
The serving certificate is read from files (the kubelet mounts its Secret; the operator needs no Secret RBAC) and
read again when they change, so a rotated certificate is served without a restart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from aiohttp import web

from scalingrun_api.status_push import MAX_BODY_BYTES, PUSHED_DOCUMENTS
from .push_admission import Buckets, NewTokenLine, RefusedTokens
from .pushed import Full, PushedDocuments

log = logging.getLogger(__name__)

CERT_CHECK_SECONDS = 10.0
# Per run: pushes a second, and the burst allowed (a run's rank 0 pushes a heartbeat every 30 s and progress per
# epoch; the preprocessing Job's indexes push at most once a second each).
PUSHES_PER_SECOND, PUSH_BURST = 5.0, 20
# Pushes are authorized in two pools: tokens a review vouched for before (the runs' pods, in steady state), and new
# tokens (a pod's first push, a rotated token, and every bad one). A flood of bad tokens reaches only the second, and
# only through push_admission.py (refused tokens kept, a bucket and a share of the line per source address), so
# neither the known pods' pushes nor the API server (TokenReviews) see the flood.
REVIEW_THREADS = 4  # known tokens: their pod checks, and a review when its cached answer expired
NEW_TOKEN_THREADS = 2  # new tokens: TokenReviews in flight at once
TOO_LARGE, RATE_LIMITED, BAD_DOCUMENT, NOT_WATCHED = "TooLarge", "RateLimited", "BadDocument", "NotWatched"
# Who-may-push refusals both authenticators give (the metric's label); push_auth.py adds the pod's own.
NO_TOKEN, INVALID_TOKEN, OTHER_RUN = "NoToken", "InvalidToken", "OtherRun"


@dataclass(frozen=True)
class Refused(Exception):
    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class Authenticator(Protocol):
    def authorize(self, authorization: Optional[str], namespace: str, run: str) -> Any:
        """Who pushes, when the Authorization header may push run `namespace/run`'s status; Refused otherwise."""

    def known(self, authorization: Optional[str]) -> bool:
        """Whether checking this header is cheap (a token vouched for before): it then skips the bounded line that
        new tokens wait in."""


def bearer_token(authorization: Optional[str]) -> str:
    """The token of an `Authorization: Bearer <token>` header; Refused (NoToken) without one."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, NO_TOKEN, "no bearer token")
    return token.strip()


def _file_state(*paths: str) -> tuple[Any, ...]:
    return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in map(os.stat, paths))


class StatusServer:
    def __init__(self, authenticator: Authenticator, pushed: PushedDocuments, cert_file: str, key_file: str,
                 port: int, host: str = "0.0.0.0", on_push: Optional[Callable[[str, str, str], None]] = None,
                 count_refused: Optional[Callable[[str], None]] = None,
                 count_accepted: Optional[Callable[[str], None]] = None,
                 on_full: Optional[Callable[[str, str, Full], None]] = None,
                 pushes_per_second: float = PUSHES_PER_SECOND, burst: int = PUSH_BURST,
                 watched: Callable[[str], bool] = lambda namespace: True):
        self.authenticator, self.pushed = authenticator, pushed
        self.cert_file, self.key_file, self.host, self.port = cert_file, key_file, host, port
        self.on_push = on_push or (lambda namespace, name, what: None)
        self.count_refused = count_refused or (lambda reason: None)
        self.count_accepted = count_accepted or (lambda what: None)
        self.on_full = on_full or (lambda namespace, name, full: None)  # in the server's loop: it must not wait
        self.buckets: Buckets[tuple[str, str]] = Buckets(pushes_per_second, burst)  # per run: forgotten with it
        self.new_tokens = NewTokenLine()  # changed in the server's loop only
        self.refused_tokens: RefusedTokens[Refused] = RefusedTokens()
        self.watched = watched
        self.ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ssl_context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.ssl_context.load_cert_chain(cert_file, key_file)
        self._cert_state = _file_state(cert_file, key_file)
        self._reviews = concurrent.futures.ThreadPoolExecutor(REVIEW_THREADS, thread_name_prefix="status-review")
        self._new_token_reviews = concurrent.futures.ThreadPoolExecutor(NEW_TOKEN_THREADS,
                                                                        thread_name_prefix="status-new-token")
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._runner: Optional[web.AppRunner] = None
        self._thread: Optional[threading.Thread] = None
        self._started = threading.Event()

    # --- life ---------------------------------------------------------------------------------------

    def start(self) -> int:
        """Serves in a thread of its own; returns the port bound (the one asked for, or a free one for 0)."""
        self._thread = threading.Thread(target=self._serve, name="status-server", daemon=True)
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("the status server did not start")
        return self.port

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._reviews.shutdown(wait=False, cancel_futures=True)
        self._new_token_reviews.shutdown(wait=False, cancel_futures=True)

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/namespaces/{namespace}/scalingruns/{run}/{what}", self._push)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        reload = self._loop.create_task(self._reload_certificate())
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            reload.cancel()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

    async def _reload_certificate(self) -> None:
        while True:
            await asyncio.sleep(CERT_CHECK_SECONDS)
            self.reload_certificate()

    def reload_certificate(self) -> bool:
        """Loads the certificate again when its files changed (the kubelet swaps a Secret's files at once);
        returns whether it did. New connections get the new one; a broken pair keeps the old one served."""
        try:
            state = _file_state(self.cert_file, self.key_file)
            if state == self._cert_state:
                return False
            self.ssl_context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            log.warning("status server: cannot load the serving certificate again (%s); the old one stays", exc)
            return False
        self._cert_state = state
        log.info("status server: serving certificate reloaded from %s", self.cert_file)
        return True

    # --- one push -----------------------------------------------------------------------------------

    def _refuse(self, status: int, reason: str, message: str, retry_after: Optional[int] = None) -> web.Response:
        self.count_refused(reason)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return web.json_response({"reason": reason, "message": message}, status=status, headers=headers)

    async def _push(self, request: web.Request) -> web.Response:
        namespace, run, what = (request.match_info[k] for k in ("namespace", "run", "what"))
        if what not in PUSHED_DOCUMENTS:
            return web.json_response({"message": f"no document {what!r}"}, status=404)
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return self._refuse(413, TOO_LARGE, f"a push is at most {MAX_BODY_BYTES} bytes")
        if not self.watched(namespace):
            return self._refuse(403, NOT_WATCHED, f"this operator runs no runs in namespace {namespace}")
        authorization = request.headers.get("Authorization")
        try:
            token = bearer_token(authorization)
        except Refused as refused:
            return self._refuse(refused.status, refused.reason, refused.message)
        known, source = self.authenticator.known(authorization), request.remote or ""
        if not known:  # cost after trust: what a new token may cost before its review (push_admission.py)
            refused_before = self.refused_tokens.get(token)
            if refused_before is not None:
                return self._refuse(refused_before.status, refused_before.reason, refused_before.message)
            busy = self.new_tokens.enter(source)
            if busy is not None:
                return self._refuse(429, busy.reason, busy.message, retry_after=busy.retry_after)
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._reviews if known else self._new_token_reviews, self.authenticator.authorize, authorization,
                namespace, run)
        except Refused as refused:
            if refused.status == 401:  # the token itself (invalid, another audience, its pod gone): kept a while
                self.refused_tokens.add(token, refused)
            return self._refuse(refused.status, refused.reason, refused.message)
        finally:
            if not known:
                self.new_tokens.leave(source)
        if not self.buckets.take((namespace, run)):
            return self._refuse(429, RATE_LIMITED, "too many pushes for this run; the newest one counts", retry_after=1)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(413, TOO_LARGE, f"a push is at most {MAX_BODY_BYTES} bytes")
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            document = None
        if not isinstance(document, dict):
            return self._refuse(400, BAD_DOCUMENT, f"the body is no JSON object of a {what} document")
        full = self.pushed.record(namespace, run, what, document, len(body))
        if full is not None:  # a bound of the run's, its namespace's or all namespaces' (pushed.py)
            self.on_full(namespace, run, full)
            return self._refuse(full.status, full.reason, full.message, retry_after=full.retry_after)
        self.count_accepted(what)
        self.on_push(namespace, run, what)
        return web.json_response({"accepted": what}, status=202)
