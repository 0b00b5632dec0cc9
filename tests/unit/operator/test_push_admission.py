"""Cost after trust (issue 51): what a token no review vouched for may cost before its review. A refused token is
refused again without a review, a source address that floods new tokens is turned away at its bucket and its share
of the line, and the others' first pushes are still reviewed; known tokens pass none of it.

The server is the real one on 127.0.0.1 (HTTPS), with an Authenticator of the test's own that counts its reviews;
the sources are loopback addresses of their own (127.0.0.2, 127.0.0.3), which Linux routes to 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import pytest

from scalingrun_api.progress import Progress
from scalingrun_api.status_push import PROGRESS, push_path
from scalingrun_operator.push_admission import (
    NEW_TOKENS_WAITING, REVIEWS_BUSY, SOURCE_SHARE, TOO_MANY_NEW_TOKENS, Buckets, NewTokenLine, RefusedTokens,
)
from scalingrun_operator.pushed import PushedDocuments
from scalingrun_operator.status_server import INVALID_TOKEN, Refused, StatusServer, bearer_token
from tests.support.tls import write_serving_certificate

SOURCE_A, SOURCE_B = "127.0.0.2", "127.0.0.3"
PATH = push_path("ns", "alpha", PROGRESS)
BODY = json.dumps(Progress(epoch=1).document()).encode()


class CountingAuthenticator:
    """Vouches for the tokens in `valid`, counting every review; `gate` holds new tokens' reviews while clear."""

    def __init__(self, *valid: str):
        self.valid, self.vouched, self.reviews = set(valid), set(), Counter()
        self.gate, self._lock = threading.Event(), threading.Lock()
        self.gate.set()

    def known(self, authorization: Optional[str]) -> bool:
        return bearer_token(authorization) in self.vouched

    def authorize(self, authorization: Optional[str], namespace: str, run: str) -> str:
        token = bearer_token(authorization)
        if token in self.vouched:
            return token
        with self._lock:
            self.reviews[token] += 1
        self.gate.wait(60)
        if token not in self.valid:
            raise Refused(401, INVALID_TOKEN, "the token is not valid")
        self.vouched.add(token)
        return token


@pytest.fixture
def serve(tmp_path):
    write_serving_certificate(tmp_path / "tls")
    servers = []

    def start(authenticator: CountingAuthenticator) -> StatusServer:
        refusals: Counter[str] = Counter()
        server = StatusServer(authenticator, PushedDocuments(), str(tmp_path / "tls/tls.crt"),
                              str(tmp_path / "tls/tls.key"), port=0, host="127.0.0.1",
                              count_refused=lambda reason: refusals.update([reason]))
        server.refusals, server.ca = refusals, str(tmp_path / "tls/ca.crt")
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


def push(server: StatusServer, token: str, source: str = "127.0.0.1") -> tuple[int, Optional[str], Optional[str]]:
    """(the status, the reason, Retry-After) of one push of `token` from the address `source`."""
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=60, source_address=(source, 0),
                                             context=ssl.create_default_context(cafile=server.ca))
    try:
        connection.request("POST", PATH, body=BODY, headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        answer = json.loads(response.read() or b"{}")
        return response.status, answer.get("reason"), response.getheader("Retry-After")
    finally:
        connection.close()


def wait_for(condition) -> None:
    deadline = time.monotonic() + 60
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition()


def test_the_same_garbage_token_pushed_twice_costs_one_review(serve):
    server = serve(CountingAuthenticator())
    assert push(server, "garbage") == (401, INVALID_TOKEN, None)
    assert push(server, "garbage", SOURCE_A) == (401, INVALID_TOKEN, None)  # from anywhere: kept by the token
    assert server.authenticator.reviews == {"garbage": 1}
    assert server.refusals[INVALID_TOKEN] == 2


def test_a_valid_token_is_unaffected_by_anothers_refusal(serve):
    server = serve(CountingAuthenticator("good"))
    assert push(server, "garbage")[0] == 401
    assert push(server, "good")[0] == 202
    assert push(server, "garbage")[0] == 401 and push(server, "good")[0] == 202
    assert server.authenticator.reviews == {"garbage": 1, "good": 1}  # the second "good": known, no review


def test_a_source_flooding_new_tokens_is_turned_away_at_its_bucket_and_the_others_are_reviewed(serve):
    server = serve(CountingAuthenticator("b-token"))
    server.new_tokens = NewTokenLine(rate=1.0, burst=3, clock=lambda: 0.0)  # no time passes: no refill
    answers = [push(server, f"a-garbage-{i}", SOURCE_A) for i in range(5)]
    assert answers == [(401, INVALID_TOKEN, None)] * 3 + [(429, TOO_MANY_NEW_TOKENS, "1")] * 2
    assert push(server, "b-token", SOURCE_B) == (202, None, None)
    assert sum(server.authenticator.reviews.values()) == 4  # A's burst and B's one: A's flood past it cost nothing
    assert server.authenticator.reviews["b-token"] == 1


def test_one_source_holds_at_most_its_share_of_the_review_line(serve):
    server = serve(CountingAuthenticator("b-token"))
    authenticator, share = server.authenticator, NEW_TOKENS_WAITING // SOURCE_SHARE
    authenticator.gate.clear()  # the reviews hang, as on a slow API server
    with ThreadPoolExecutor(share + 1) as pool:
        flood = [pool.submit(push, server, f"a-garbage-{i}", SOURCE_A) for i in range(share)]
        wait_for(lambda: server.new_tokens.held(SOURCE_A) == share)
        assert push(server, "a-one-more", SOURCE_A) == (429, REVIEWS_BUSY, "1")  # at once, not reviewed
        valid = pool.submit(push, server, "b-token", SOURCE_B)
        wait_for(lambda: server.new_tokens.held(SOURCE_B) == 1)  # B is in the line beside A's share
        assert server.new_tokens.waiting == share + 1 < NEW_TOKENS_WAITING
        authenticator.gate.set()
        assert valid.result() == (202, None, None)
        assert [future.result() for future in flood] == [(401, INVALID_TOKEN, None)] * share
    assert "a-one-more" not in authenticator.reviews and authenticator.reviews["b-token"] == 1
    assert server.new_tokens.waiting == 0 and server.new_tokens.held(SOURCE_A) == 0


def test_a_known_token_passes_no_gate(serve):
    server = serve(CountingAuthenticator("good"))
    assert push(server, "good", SOURCE_A)[0] == 202
    server.new_tokens = NewTokenLine(burst=1, clock=lambda: 0.0)
    assert push(server, "other-garbage", SOURCE_A)[0] == 401  # A's bucket spent
    assert push(server, "more-garbage", SOURCE_A)[1] == TOO_MANY_NEW_TOKENS
    assert [push(server, "good", SOURCE_A)[0] for _ in range(3)] == [202] * 3


def test_refused_tokens_are_kept_a_while_and_bounded():
    now = [0.0]
    refused: RefusedTokens[str] = RefusedTokens(kept=2, ttl=60.0, clock=lambda: now[0])
    refused.add("token-a", "InvalidToken")
    refused.add("token-b", "PodGone")
    assert [refused.get(f"token-{t}") for t in "abc"] == ["InvalidToken", "PodGone", None]
    assert "token-a" not in str(refused._refused)  # kept by the token's hash, not the token
    refused.add("token-c", "InvalidToken")  # past the bound: the oldest goes
    assert refused.get("token-a") is None and len(refused) == 2
    now[0] = 60.0  # past the TTL: reviewed again
    assert refused.get("token-b") is None and refused.get("token-c") is None and len(refused) == 0


def test_a_sources_bucket_refills_and_the_buckets_are_bounded():
    now = [0.0]
    buckets: Buckets[str] = Buckets(rate=0.5, burst=1, clock=lambda: now[0], kept=2)
    assert (buckets.wait("a"), buckets.wait("a")) == (0, 2)  # empty: one token in 2 s at 0.5 a second
    now[0] = 2.0
    assert buckets.take("a") and not buckets.take("a")
    buckets.take("b")
    buckets.take("c")  # past the bound: "a", the least recently used, goes and comes back full
    assert buckets.take("a")


def test_the_line_is_shared_out_and_bounded_in_all():
    line = NewTokenLine(waiting=4, share=2, burst=10, clock=lambda: 0.0)
    assert line.enter("a") is None and line.enter("a") is None
    assert line.enter("a").reason == REVIEWS_BUSY and line.held("a") == 2  # its share: 4 // 2
    assert line.enter("b") is None and line.enter("c") is None
    assert line.enter("d").reason == REVIEWS_BUSY  # the line is full: 4
    line.leave("a")
    assert line.enter("d") is None and line.waiting == 4
