"""The newest document each run's pods pushed (progress, heartbeat), kept in memory for the reconcile, bounded per
tenant.

A push is a full state document, so only the newest counts. With the status endpoint on, observe answers decide's
progress and heartbeat asks from here alone (the operator reads no storage); storage stays the trainer's durable
record for resume and reports. Without the endpoint nothing is pushed, and observe reads storage.

What the pods of one namespace (a tenant) may make the operator hold is bounded (`Bounds`): per run and per namespace
its documents, their bytes as pushed, their history entries (what a document's parsed size grows with) and their
parsed size (the models as they sit in memory, measured), and all namespaces together. A push past its run's bound is
refused for good (413: the next document of a growing history is larger still); one that would take its namespace
past the namespace's bound first evicts that namespace's idle runs (none of their pods pushed for `idle_seconds`, the
least recently pushed first), and is refused (429, Retry-After) when that is not enough; past the bound of all
namespaces it is refused too. So a tenant fills only its own share, and never evicts another tenant's documents.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import astuple, dataclass, field
from typing import Any, Callable, Optional

from pydantic import BaseModel

from scalingrun_api.heartbeat import Heartbeat
from scalingrun_api.progress import Progress
from scalingrun_api.status_push import PROGRESS

MIB = 1024 * 1024
# The refusals' reasons (the push refusals metric's label): the run's own bound, its namespace's, all namespaces'.
RUN_BOUND, NAMESPACE_BOUND, STORE_FULL = "RunBound", "NamespaceBound", "StoreFull"
# Lists of a progress document: its entries are what its parsed size grows with (a 64 KiB body of 3,900 one-key
# history entries parses to 2.2 MB; a real 500-epoch history of 57 KB to 0.6 MB).
HISTORY_LISTS = ("history", "inputHistory")


@dataclass(frozen=True)
class Bounds:
    """What the pushed documents may hold (docs/security.md, "Bounded per tenant"). A run holds at most one document
    per kind (two) of at most scalingrun_api.status_push.MAX_BODY_BYTES each, by construction."""

    run_history_entries: int = 1024  # a real epoch's entry is about 110 bytes: 64 KiB hold ~590 of them
    run_parsed_bytes: int = 1 * MIB  # the largest real document within 64 KiB parses to ~0.7 MB
    namespace_documents: int = 256
    namespace_bytes: int = 4 * MIB
    namespace_history_entries: int = 16384
    namespace_parsed_bytes: int = 16 * MIB
    documents: int = 8192  # all namespaces together
    parsed_bytes: int = 128 * MIB  # all namespaces together: a quarter of the chart's 512 Mi limit
    idle_seconds: float = 3600.0  # a training's rank 0 beats every 30 s: an hour's silence is a run that ended


@dataclass(frozen=True)
class Full:
    """A push refused by a bound: the HTTP status, the reason (the metric's label), why, when to try again."""

    status: int
    reason: str
    message: str
    retry_after: Optional[int] = None


@dataclass(frozen=True)
class _Cost:
    """What documents hold against `Bounds`: how many, their bytes as pushed, their history entries, their parsed
    size; added and subtracted measure by measure."""

    documents: int = 0
    bytes: int = 0
    entries: int = 0
    parsed: int = 0

    def __add__(self, other: "_Cost") -> "_Cost":
        return _Cost(*(mine + theirs for mine, theirs in zip(astuple(self), astuple(other))))

    def __sub__(self, other: "_Cost") -> "_Cost":
        return _Cost(*(mine - theirs for mine, theirs in zip(astuple(self), astuple(other))))


@dataclass
class _Run:
    documents: dict[str, tuple[Any, _Cost]] = field(default_factory=dict)  # kind -> (model, its cost)
    pushed_at: float = 0.0

    def cost(self) -> _Cost:
        return sum((cost for _, cost in self.documents.values()), _Cost())


@dataclass
class _Tenant:
    runs: "OrderedDict[str, _Run]" = field(default_factory=OrderedDict)  # the least recently pushed first
    cost: _Cost = field(default_factory=_Cost)


class PushedDocuments:
    def __init__(self, bounds: Bounds = Bounds(), clock: Callable[[], float] = time.monotonic) -> None:
        self.bounds, self._clock = bounds, clock
        self._tenants: dict[str, _Tenant] = {}
        self._cost = _Cost()
        self._guard = threading.Lock()

    def record(self, namespace: str, run: str, what: str, document: dict[str, Any],
               size: Optional[int] = None) -> Optional[Full]:
        """Keeps `document` (a pushed JSON object; `size`: its bytes as pushed) as run `namespace/run`'s newest of
        its kind, parsed; or says which bound refuses it (and keeps nothing)."""
        bounds = self.bounds
        entries = history_entries(what, document)
        if entries > bounds.run_history_entries:  # counted before the parse, which such a document would make long
            return Full(413, RUN_BOUND, f"a run keeps at most {bounds.run_history_entries} history entries; this "
                                        f"{what} document has {entries}")
        model = parse_pushed(what, document)
        cost = _Cost(1, len(json.dumps(document)) if size is None else size, entries, parsed_size(model))
        with self._guard:
            tenant = self._tenants.get(namespace) or _Tenant()
            held = tenant.runs.get(run) or _Run()
            replaced = held.documents.get(what, (None, _Cost()))[1]
            run_cost = held.cost() - replaced + cost
            if run_cost.parsed > bounds.run_parsed_bytes or run_cost.entries > bounds.run_history_entries:
                return Full(413, RUN_BOUND, f"run {run}'s pushed documents would take {run_cost.parsed} bytes parsed "
                                            f"and {run_cost.entries} history entries, over its "
                                            f"{bounds.run_parsed_bytes} and {bounds.run_history_entries}")
            now = self._clock()
            over = self._over_namespace(tenant.cost - replaced + cost)
            for idle in [name for name, kept in tenant.runs.items() if name != run
                         and now - kept.pushed_at >= bounds.idle_seconds]:
                if not over:
                    break
                self._drop(namespace, tenant, idle)
                over = self._over_namespace(tenant.cost - replaced + cost)
            if over:
                return Full(429, NAMESPACE_BOUND, f"namespace {namespace}'s pushed documents are at its bound "
                                                  f"({over}); none of its runs is idle", retry_after=60)
            total = self._cost - replaced + cost
            if total.documents > bounds.documents or total.parsed > bounds.parsed_bytes:
                return Full(429, STORE_FULL, "the operator holds as many pushed documents as it may, all namespaces "
                                             "together", retry_after=60)
            held.documents[what], held.pushed_at = (model, cost), now
            self._tenants[namespace] = tenant
            tenant.runs[run] = held
            tenant.runs.move_to_end(run)
            tenant.cost = tenant.cost - replaced + cost
            self._cost = total
        return None

    def _over_namespace(self, cost: _Cost) -> str:
        """Which of a namespace's bounds `cost` is over ('' for none)."""
        b = self.bounds
        for name, value, bound in (("documents", cost.documents, b.namespace_documents),
                                   ("bytes", cost.bytes, b.namespace_bytes),
                                   ("history entries", cost.entries, b.namespace_history_entries),
                                   ("parsed bytes", cost.parsed, b.namespace_parsed_bytes)):
            if value > bound:
                return f"{name}: {bound}"
        return ""

    def _drop(self, namespace: str, tenant: _Tenant, run: str) -> None:
        held = tenant.runs.pop(run, None)
        if held is not None:
            tenant.cost, self._cost = tenant.cost - held.cost(), self._cost - held.cost()
        if not tenant.runs:
            self._tenants.pop(namespace, None)

    def get(self, namespace: str, run: str, what: str) -> Optional[Any]:
        with self._guard:
            held = self._tenants.get(namespace, _Tenant()).runs.get(run)
            kept = held.documents.get(what) if held else None
            return kept[0] if kept else None

    def forget(self, namespace: str, run: str) -> None:
        with self._guard:
            tenant = self._tenants.get(namespace)
            if tenant is not None:
                self._drop(namespace, tenant, run)

    def held(self, namespace: Optional[str] = None) -> tuple[int, int]:
        """(documents, parsed bytes) held for `namespace`, or for all namespaces."""
        with self._guard:
            cost = self._cost if namespace is None else self._tenants.get(namespace, _Tenant()).cost
            return cost.documents, cost.parsed


def history_entries(what: str, document: dict[str, Any]) -> int:
    """The entries of a progress document's lists (history, inputHistory); 0 for a heartbeat."""
    if what != PROGRESS:
        return 0
    return sum(len(value) for value in (document.get(key) for key in HISTORY_LISTS) if isinstance(value, list))


def parsed_size(model: Any) -> int:
    """Bytes a parsed document takes in memory: every object it holds (sys.getsizeof), each counted once."""
    seen: set[int] = set()
    size, stack = 0, [model]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        size += sys.getsizeof(obj)
        if isinstance(obj, BaseModel):
            stack.extend(part for part in (obj.__dict__, obj.__pydantic_extra__, obj.__pydantic_fields_set__)
                         if part is not None)
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
    return size


def parse_pushed(what: str, document: Any) -> Optional[Any]:
    """The model of a pushed document (read as leniently as storage's: scalingrun_api), None when it is no object."""
    if not isinstance(document, dict):
        return None
    return Progress.read(document) if what == PROGRESS else Heartbeat.read(document)
