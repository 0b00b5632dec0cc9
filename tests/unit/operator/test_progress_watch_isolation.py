"""The progress watcher against stores that misbehave (tests/support/hostile_store.py on 127.0.0.1): a hostile or failing
store holds at most its share of the check pool, a store that keeps failing is not asked every round, the healthy
runs' checks go on meanwhile, and the liveness probe hears when the watcher stops or a check is stuck."""

from __future__ import annotations

import threading
import time

import kopf
import pytest

from scalingrun_operator.pull.bounded_http import Clients
from scalingrun_operator.pull.store_slots import Guard
from scalingrun_operator.cluster import reconcile_scheduler as progress_watch
from scalingrun_operator.cluster.reconcile_scheduler import ReconcileScheduler
from scalingrun_operator.pull import store_source
from scalingrun_operator.pull.store_source import FollowedDocument
from scalingrun_operator.handlers import lifecycle
from scalingrun_operator.pull.storage import Credentials, StorageTarget

from tests.support.hostile_store import HostileStore
from tests.support.progress_watch import Clock, Recorder


@pytest.fixture
def stores():
    made: list[HostileStore] = []

    def start(behaviour: str, **kwargs) -> HostileStore:
        made.append(HostileStore(behaviour, **kwargs))
        return made[-1]

    yield start
    for store in made:
        store.close()


def target(store: HostileStore, clients: Clients) -> StorageTarget:
    return StorageTarget(store.endpoint, "us-east-1", Credentials("AKIDEXAMPLE", "s" * 40), clients=clients)


def wait_until(check, what: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def started(reconcile, interval: float, rate: int, store: HostileStore, prefix: str, runs: int,
            healthy: HostileStore, clients: Clients) -> ReconcileScheduler:
    """A watcher of `runs` runs `prefix<i>` on `store` and one run "fine" on `healthy`, started."""
    watcher = ReconcileScheduler(reconcile, interval=interval, max_checks_per_second=rate, per_endpoint=2)
    for i in range(runs):
        watcher.watch("ns", f"{prefix}{i}", FollowedDocument(f"s3://b/{prefix}{i}/progress.json",
                                                             target(store, clients)), '"v0"')
    watcher.watch("ns", "fine", FollowedDocument("s3://b/fine/progress.json", target(healthy, clients)), '"v1"')
    watcher.start()
    return watcher


def test_a_trickling_store_holds_its_share_of_checks_and_the_healthy_run_goes_on(stores):
    trickle, healthy = stores("trickle-headers", pace=0.1), stores("healthy")
    clients = Clients()
    seen: list[tuple[str, int]] = []
    recorder = Recorder()

    def reconcile(namespace: str, name: str) -> None:
        seen.append((name, len(trickle.requests)))
        recorder(namespace, name)

    watcher = started(reconcile, 0.2, 100, trickle, "slow", 10, healthy, clients)
    try:
        wait_until(lambda: len(trickle.requests) >= 2, "two checks at the trickling store")
        healthy.etag = "v2"  # the healthy run's progress moves on while its neighbours' checks hang
        wait_until(lambda: ("ns", "fine") in recorder.calls, "the healthy run's reconcile")
        at_that_time = dict(seen)["fine"]
        assert at_that_time <= 2, "no more than its share of checks went to the trickling store"
        assert watcher.health() is None
    finally:
        watcher.stop()


def test_a_store_that_keeps_failing_is_asked_once_per_backoff_not_once_per_run_and_round(stores):
    broken, healthy = stores("huge-error"), stores("healthy")
    clients = Clients(guard=Guard(threshold=2, base=30.0))
    reconcile = Recorder()
    watcher = started(reconcile, 0.1, 1000, broken, "broken", 60, healthy, clients)
    try:
        wait_until(lambda: len(healthy.requests) >= 20, "20 rounds of the healthy run's check")
        assert len(broken.requests) <= 4, "two failures open the breaker (and two may have been in flight)"
        assert clients.guard.open_for(broken.endpoint) > 20
        failing = {name for _, name in reconcile.calls}
        assert failing <= {f"broken{i}" for i in range(60)}, "the healthy run had nothing to reconcile"
    finally:
        watcher.stop()


def test_health_says_when_the_loop_stopped_passing_or_a_check_is_stuck(monkeypatch, stores):
    clock = Clock()
    release = threading.Event()

    def stuck_check(uri, target, version):
        release.wait(10)
        return False, version

    monkeypatch.setattr(store_source, "changed_since", stuck_check)
    watcher = ReconcileScheduler(Recorder(), interval=15, clock=clock)
    store = stores("healthy")
    watcher.watch("ns", "run", FollowedDocument("s3://b/run/progress.json", target(store, Clients())), '"v1"')
    clock.now += 30
    watcher.run_due()
    assert watcher.health() is None
    clock.now += progress_watch.STUCK_SECONDS + 1
    watcher.run_due()
    assert watcher.health() == (f"1 progress checks stuck, the oldest for {progress_watch.STUCK_SECONDS + 1:.0f} s "
                                f"(ns/run at {store.endpoint})")
    release.set()
    wait_until(lambda: watcher.health() is None, "the check to end")
    clock.now += 61
    assert watcher.health() == "the progress watcher has not passed for 61 s"
    watcher.stop()


def test_the_liveness_probe_fails_with_what_the_watcher_says():
    class Runtime:
        problem = None

        def health(self):
            return self.problem

        class metrics:
            @staticmethod
            def tracked_runs():
                return 3

    runtime = Runtime()
    memo = kopf.Memo(runtime=runtime)
    assert lifecycle.watcher_probe(memo=memo) == "passing"
    runtime.problem = "the progress watcher has not passed for 61 s"
    with pytest.raises(kopf.PermanentError, match="has not passed for 61 s"):
        lifecycle.watcher_probe(memo=memo)
