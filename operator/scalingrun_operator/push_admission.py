"""What a push may cost before a review vouches for its token: cost after trust, never before (issue 51).

A token no review vouched for yet (a pod's first push, a rotated token, and every bad one) costs a review: a
TokenReview on the API server, in a pool of a few threads. Before that cost, status_server.py asks this module:
- a token a review refused is refused again from `RefusedTokens` (401, the same reason), without a review, for
  REFUSAL_TTL_SECONDS (at most REFUSALS_KEPT, by the token's SHA-256, the oldest dropped first);
- a source address (the peer's IP: a pod's) takes from a bucket of its own, NEW_TOKENS_PER_SECOND with bursts of
  NEW_TOKEN_BURST; once it is empty the source's new tokens are refused at once (429 `TooManyNewTokens`,
  Retry-After), so a pod that floods garbage costs the API server that rate, no more;
- the line of new tokens being reviewed (or waiting for a thread) holds NEW_TOKENS_WAITING, of which one source holds
  at most a SOURCE_SHARE-th (429 `ReviewsBusy` beyond either), so one source cannot fill the line for the others.
Tokens a review vouched for (`Authenticator.known`) pass none of this: the runs' pods in steady state are unaffected.
Used in the server's event loop only (no locks).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Optional, TypeVar

NEW_TOKENS_WAITING = 32  # new tokens being reviewed or waiting for a thread, at most
SOURCE_SHARE = 4  # one source address holds at most NEW_TOKENS_WAITING // SOURCE_SHARE of them
# Per source address: new tokens a second, and the burst allowed (a pod pushes with a new token at its start and
# when the kubelet rotates it, about hourly; pods on the host's network share their node's address).
NEW_TOKENS_PER_SECOND, NEW_TOKEN_BURST = 1.0, 16
SOURCES_KEPT = 4096  # the buckets of this many source addresses, the least recently seen dropped first
REFUSAL_TTL_SECONDS = 60.0
REFUSALS_KEPT = 4096
REVIEWS_BUSY, TOO_MANY_NEW_TOKENS = "ReviewsBusy", "TooManyNewTokens"

Key = TypeVar("Key", bound=Hashable)
Answer = TypeVar("Answer")


@dataclass(frozen=True)
class Busy:
    """A new token turned away before its review (429): try again after `retry_after` seconds."""
    reason: str
    message: str
    retry_after: int


class Buckets(Generic[Key]):
    """A token bucket per key (a run, a source address), at most `kept` of them: the least recently used goes
    first, and comes back full."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 kept: Optional[int] = None):
        self.rate, self.burst, self.kept, self._clock = rate, burst, kept, clock
        self._buckets: OrderedDict[Key, tuple[float, float]] = OrderedDict()

    def take(self, key: Key) -> bool:
        return self.wait(key) == 0

    def wait(self, key: Key) -> int:
        """Takes one from `key`'s bucket and returns 0; when it is empty, the seconds until it holds one again."""
        now = self._clock()
        tokens, then = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        taken = tokens >= 1
        self._buckets[key] = (tokens - 1 if taken else tokens, now)
        self._buckets.move_to_end(key)
        while self.kept is not None and len(self._buckets) > self.kept:
            self._buckets.popitem(last=False)
        return 0 if taken else max(1, math.ceil((1 - tokens) / self.rate))

    def forget(self, key: Key) -> None:
        self._buckets.pop(key, None)


class RefusedTokens(Generic[Answer]):
    """The answers a review gave to tokens it refused, by the token's SHA-256, each for `ttl` seconds."""

    def __init__(self, kept: int = REFUSALS_KEPT, ttl: float = REFUSAL_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.kept, self.ttl, self._clock = kept, ttl, clock
        self._refused: OrderedDict[str, tuple[float, Answer]] = OrderedDict()

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def get(self, token: str) -> Optional[Answer]:
        key = self._key(token)
        kept = self._refused.get(key)
        if kept is None:
            return None
        if kept[0] <= self._clock():
            del self._refused[key]
            return None
        return kept[1]

    def add(self, token: str, answer: Answer) -> None:
        key = self._key(token)
        self._refused[key] = (self._clock() + self.ttl, answer)
        self._refused.move_to_end(key)
        while len(self._refused) > self.kept:
            self._refused.popitem(last=False)

    def __len__(self) -> int:
        return len(self._refused)


class NewTokenLine:
    """The line new tokens wait in for their review: bounded in all and per source, and rate-limited per source."""

    def __init__(self, waiting: int = NEW_TOKENS_WAITING, share: int = SOURCE_SHARE,
                 rate: float = NEW_TOKENS_PER_SECOND, burst: int = NEW_TOKEN_BURST, kept: int = SOURCES_KEPT,
                 clock: Callable[[], float] = time.monotonic):
        self.limit, self.per_source = waiting, max(1, waiting // share)
        self.buckets: Buckets[str] = Buckets(rate, burst, clock, kept=kept)
        self.waiting = 0
        self._by_source: Counter[str] = Counter()

    def enter(self, source: str) -> Optional[Busy]:
        """Takes a place in the line for `source`'s new token (None), or says why not; a place taken is left with
        `leave`. A source at its share, or the line full, takes nothing from the source's bucket."""
        if self.waiting >= self.limit:
            return Busy(REVIEWS_BUSY, "too many new tokens are being reviewed; try again", 1)
        if self._by_source[source] >= self.per_source:
            return Busy(REVIEWS_BUSY, "too many of this address's new tokens are being reviewed; try again", 1)
        wait = self.buckets.wait(source)
        if wait:
            return Busy(TOO_MANY_NEW_TOKENS, "too many new tokens from this address; try again", wait)
        self.waiting += 1
        self._by_source[source] += 1
        return None

    def leave(self, source: str) -> None:
        self.waiting -= 1
        self._by_source[source] -= 1
        if not self._by_source[source]:
            del self._by_source[source]

    def held(self, source: str) -> int:
        """The places `source` holds now."""
        return self._by_source[source]
