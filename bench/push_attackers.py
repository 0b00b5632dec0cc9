"""The attackers of the push bench's hostile phase (bench/push_scale.py; issue 51, item 8), each in a process of its
own, from a source address of its own (the status endpoint limits new tokens per address):
- garbage tokens: random tokens, and its neighbour's valid token with the signature changed, at the healthy runs'
  paths (each a new token to review, or one already refused);
- a valid token of its own pod (a pod of a run of its own): progress documents for hundreds of made-up run names,
  progress (an epoch no healthy run reaches) and heartbeats for a victim's name, a flood at its own run's path, and
  10 MiB bodies there.
Then `verdict` holds the attack's outcome against the operator's own counts: no push for a made-up or foreign name
accepted, no accepted push the healthy runs and the attacker's own run do not account for, the victim's status never
at the forged epoch. The pure parts (names, bodies, tallies, the verdict, the table) are tested in
tests/unit/bench/test_push_attackers.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing
import random
import secrets
import ssl
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

from scalingrun_api.models.common import quantity_value
from scalingrun_api.status_push import HEARTBEAT, PROGRESS, push_path
from tests.support.operator import progress

BIG_BODY_BYTES = 10 * 1024 * 1024
MADE_UP_NAMES = 500
GARBAGE, VALID = "garbage tokens", "valid token"  # the attackers
# What each kind of the valid-token attacker pushes for: a name of no run, a run not its own, its own run.
MADE_UP, VICTIM, OWN_FLOOD, OWN_BIG, BAD_TOKEN = "made-up names", "victim's name", "own run flood", "10 MiB", "bad token"
FOREIGN = (MADE_UP, VICTIM)  # kinds whose every push must be refused and nothing of them stored


@dataclass(frozen=True)
class Kind:
    """One kind of request an attacker sends, paced at `rate` a second with at most `in_flight` open: the paths it
    picks from at random, its token (None: a garbage one each time, or `spoiled` with its signature changed), its
    body ("progress", "forged": progress at `forged_epoch`, "heartbeat", "big")."""

    label: str
    paths: tuple[str, ...]
    bodies: tuple[str, ...]
    token: Optional[str]
    rate: float
    in_flight: int
    spoiled: Optional[str] = None


def made_up_names(count: int, seed: int = 0) -> list[str]:
    """`count` run names no run has (valid DNS labels, distinct): what an attacker guesses or invents."""
    rng = random.Random(seed)
    return [f"made-up-{i}-{rng.getrandbits(32):08x}" for i in range(count)]


def forged(token: str) -> str:
    header, payload, signature = token.split(".")
    return f"{header}.{payload}.{signature[::-1]}"


def random_token() -> str:
    part = lambda n: base64.urlsafe_b64encode(secrets.token_bytes(n)).decode().rstrip("=")  # noqa: E731
    return f"eyJhbGciOiJSUzI1NiJ9.{part(180)}.{part(256)}"


def body(kind: str, forged_epoch: int, max_epochs: int) -> bytes:
    if kind == "big":
        return b"{" + b" " * (BIG_BODY_BYTES - 2) + b"}"
    if kind == "heartbeat":
        return json.dumps({"phase": "training", "epoch": forged_epoch, "step": forged_epoch * 100,
                           "time": time.time(), "rank": 1}).encode()
    return json.dumps(progress("running", forged_epoch if kind == "forged" else 1, maxEpochs=max_epochs)).encode()


def plan(namespace: str, own_run: str, own_token: str, victims: list[str], victim: str, neighbour_token: str,
         rate: float, names: int = MADE_UP_NAMES) -> dict[str, list[Kind]]:
    """Each attacker's kinds (the garbage one spoils `neighbour_token`: a valid token of another pod)."""
    made_up = tuple(push_path(namespace, n, PROGRESS) for n in made_up_names(names))
    return {
        GARBAGE: [Kind(BAD_TOKEN, tuple(push_path(namespace, v, PROGRESS) for v in victims), ("progress",), None,
                       rate, 64, spoiled=forged(neighbour_token))],
        VALID: [Kind(MADE_UP, made_up, ("progress",), own_token, rate, 64),
                Kind(VICTIM, (push_path(namespace, victim, PROGRESS), push_path(namespace, victim, HEARTBEAT)),
                     ("forged", "heartbeat"), own_token, rate, 64),
                Kind(OWN_FLOOD, (push_path(namespace, own_run, PROGRESS),), ("progress",), own_token, rate, 64),
                Kind(OWN_BIG, (push_path(namespace, own_run, PROGRESS),), ("big",), own_token, rate, 4)]}


def attack(url: str, ca: str, source: str, kinds: list[Kind], seconds: float, forged_epoch: int, max_epochs: int,
           results: Any) -> None:
    """An attacker's process: sends its kinds for `seconds`, puts its counts ("<kind> <status>") into `results`."""
    results.put(asyncio.run(_attack(url, ca, source, kinds, seconds, forged_epoch, max_epochs)))


async def _attack(url: str, ca: str, source: str, kinds: list[Kind], seconds: float, forged_epoch: int,
                  max_epochs: int) -> dict:
    import aiohttp

    codes: Counter = Counter()
    end = time.monotonic() + seconds
    bodies = {b: body(b, forged_epoch, max_epochs) for k in kinds for b in k.bodies}
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=ca), limit=0, local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(kind: Kind) -> None:
            path, which = random.choice(kind.paths), random.choice(kind.bodies)
            token = kind.token or random.choice((random_token(), kind.spoiled or random_token()))
            if which == "forged" and path.endswith(HEARTBEAT):
                which = "heartbeat"
            try:
                async with session.post(url + path, data=bodies[which], headers={
                        "Authorization": f"Bearer {token}", "Content-Type": "application/json"}) as response:
                    await response.read()
                    codes[f"{kind.label} {response.status}"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                codes[f"{kind.label} {type(exc).__name__}"] += 1

        async def paced(kind: Kind) -> None:
            started, sent, running = time.monotonic(), 0, set()
            while time.monotonic() < end:
                if len(running) >= kind.in_flight:
                    _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    continue
                ahead = started + sent / kind.rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
                running.add(asyncio.ensure_future(one(kind)))
                sent += 1
            if running:
                await asyncio.wait(running)

        await asyncio.gather(*(paced(k) for k in kinds))
    return dict(codes)


class Attacker:
    """One attacker in a process of its own (spawned: the bench's threads and clients stay behind)."""

    def __init__(self, url: str, ca: str, source: str, kinds: list[Kind], seconds: float, forged_epoch: int,
                 max_epochs: int):
        context = multiprocessing.get_context("spawn")
        self.results = context.Queue()
        self.process = context.Process(target=attack, daemon=True, args=(
            url, ca, source, kinds, seconds, forged_epoch, max_epochs, self.results))
        self.process.start()

    def counts(self) -> dict:
        found = self.results.get(timeout=180)
        self.process.join(30)
        return found


def by_kind(counts: dict[str, int]) -> dict[str, Counter]:
    """`{"<kind> <answer>": n}` as {kind: Counter(answer: n)} (a kind's label may hold spaces, an answer not)."""
    found: dict[str, Counter] = {}
    for key, count in counts.items():
        kind, answer = key.rsplit(" ", 1)
        found.setdefault(kind, Counter())[answer] += count
    return found


@dataclass(frozen=True)
class Verdict:
    foreign_accepted: int  # pushes for a made-up or the victim's name the endpoint accepted (202)
    unaccounted: int  # accepted pushes (the operator's count) that neither the healthy runs nor the own run made
    victim_saw_forged: bool  # the victim's status ever showed the forged epoch

    @property
    def held(self) -> bool:
        return self.foreign_accepted == 0 and self.unaccounted == 0 and not self.victim_saw_forged


def verdict(attackers: dict[str, dict[str, int]], healthy_accepted: int, operator_accepted: float,
            victim_epoch: int, forged_epoch: int) -> Verdict:
    """The attack's outcome: `attackers` each one's counts, `healthy_accepted` the healthy pods' 202s,
    `operator_accepted` what the operator counted accepted (scalingrun_status_pushes_total) over the same phase."""
    kinds: dict[str, Counter] = {}
    for counts in attackers.values():
        for kind, answers in by_kind(counts).items():
            kinds.setdefault(kind, Counter()).update(answers)
    accepted = lambda kind: kinds.get(kind, Counter())["202"]  # noqa: E731
    own = accepted(OWN_FLOOD) + accepted(OWN_BIG)
    return Verdict(sum(accepted(k) for k in FOREIGN), round(operator_accepted) - healthy_accepted - own,
                   victim_epoch >= forged_epoch)


def limit_mib(values: dict[str, Any]) -> float:
    """The operator's memory limit in MiB from the chart's values."""
    return quantity_value(values["resources"]["limits"]["memory"]) / (1024 * 1024)


def table(without: dict[str, Any], beside: dict[str, Any], attackers: dict[str, dict[str, int]], seconds: float,
          outcome: Verdict, peak_rss_mib: float, limit: float) -> list[str]:
    """The hostile phase's figures as markdown lines: `without` and `beside` the phases' figures (lag_p50_s,
    lag_p95_s, post_p50_s, post_p95_s, missed, reports)."""
    lines = ["| healthy runs' pushes | without the attackers | beside them | beside / without |", "|---|---|---|---|"]
    for key, label in (("post_p50_s", "push answered (POST round trip), p50"),
                       ("post_p95_s", "push answered (POST round trip), p95"),
                       ("lag_p50_s", "report -> status epoch, p50"), ("lag_p95_s", "report -> status epoch, p95")):
        a, b = without.get(key), beside.get(key)
        ratio = f"{b / a:.2f}" if a and b is not None else "-"
        cell = lambda v: "-" if v is None else f"{v:.2f} s"  # noqa: E731
        lines.append(f"| {label} | {cell(a)} | {cell(b)} | {ratio} |")
    lines.append(f"| reports status did not show | {without['missed']} of {without['reports']} | "
                 f"{beside['missed']} of {beside['reports']} | |")
    lines += ["", "| attacker: kind | sent | a second | answers |", "|---|---|---|---|"]
    for attacker, counts in attackers.items():
        for kind, answers in sorted(by_kind(counts).items()):
            sent = sum(answers.values())
            spelled = ", ".join(f"{a} x {n}" for a, n in sorted(answers.items()))
            lines.append(f"| {attacker}: {kind} | {sent} | {sent / seconds:.1f} | {spelled} |")
    lines += ["", f"Pushes for a made-up or the victim's name accepted: {outcome.foreign_accepted}; accepted pushes "
                  f"the healthy runs and the attacker's own run do not account for: {outcome.unaccounted}; the "
                  f"victim's status at the forged epoch: {'yes' if outcome.victim_saw_forged else 'never'}. "
                  f"Operator's peak RSS {peak_rss_mib:.0f} MiB of its {limit:.0f} MiB limit "
                  f"({peak_rss_mib / limit:.0%})."]
    return lines
