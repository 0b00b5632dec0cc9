"""The Coalescer: one reconcile per run at a time, pod events folded into one per interval, no thread waiting."""

from __future__ import annotations

import threading

import pytest

from scalingrun_operator.cluster.coalesce import Coalescer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_trigger_with_nothing_in_flight_runs_in_the_callers_thread():
    calls = []
    coalescer = Coalescer(lambda key, why: calls.append((key, why, threading.current_thread().name)))
    assert coalescer.trigger(("ns", "a"), "create") is True
    assert calls == [(("ns", "a"), "create", threading.current_thread().name)]


def test_triggers_during_a_reconcile_return_at_once_and_make_one_more():
    clock = FakeClock()
    inside, release, calls = threading.Event(), threading.Event(), []

    def act(key, why):
        calls.append(why)
        if len(calls) == 1:
            inside.set()
            assert release.wait(10)

    coalescer = Coalescer(act, min_interval=1.0, clock=clock)
    first = threading.Thread(target=coalescer.trigger, args=(("ns", "a"), "create"))
    first.start()
    assert inside.wait(10)
    # Fifty events while the first reconcile runs: none waits, none runs.
    assert [coalescer.trigger(("ns", "a"), "pod", urgent=False) for _ in range(50)] == [False] * 50
    assert coalescer.trigger(("ns", "a"), "child") is False
    release.set()
    first.join(10)
    assert calls == ["create"]
    # Urgent (a child's event came): once more as soon as the pool takes it, and only once.
    assert coalescer.pending() == {("ns", "a"): 100.0}
    coalescer.run_due()
    coalescer._pool.shutdown(wait=True)  # the reconcile handed to the pool has run (stop() would cancel it)
    coalescer.stop()
    assert calls == ["create", "child"]


def test_pod_events_make_at_most_one_reconcile_per_interval():
    clock = FakeClock()
    calls = []
    coalescer = Coalescer(lambda key, why: calls.append((clock.now, why)), min_interval=1.0, clock=clock)
    assert coalescer.trigger(("ns", "a"), "pod", urgent=False)
    for step in range(9):  # nine more events in the next 0.9 s
        clock.now += 0.1
        assert not coalescer.trigger(("ns", "a"), "pod", urgent=False)
    assert coalescer.pending() == {("ns", "a"): pytest.approx(101.0)}
    clock.now = 100.95
    coalescer.run_due()
    assert len(calls) == 1, "due at the end of the interval, not before"
    clock.now = 101.0
    coalescer.run_due()
    coalescer._pool.shutdown(wait=True)  # the reconcile handed to the pool has run (stop() would cancel it)
    coalescer.stop()
    assert calls == [(100.0, "pod"), (101.0, "pod")]


def test_an_urgent_trigger_does_not_wait_for_the_interval_and_other_runs_are_independent():
    clock = FakeClock()
    calls = []
    coalescer = Coalescer(lambda key, why: calls.append((key[1], why)), min_interval=1.0, clock=clock)
    coalescer.trigger(("ns", "a"), "pod", urgent=False)
    clock.now += 0.2
    assert not coalescer.trigger(("ns", "a"), "pod", urgent=False)
    assert coalescer.trigger(("ns", "b"), "pod", urgent=False), "another run has an interval of its own"
    assert coalescer.trigger(("ns", "a"), "child"), "a child's event runs now, deferred pod events with it"
    assert coalescer.pending() == {}
    assert calls == [("a", "pod"), ("b", "pod"), ("a", "child")]


def test_an_error_reaches_the_caller_and_leaves_the_run_free():
    def act(key, why):
        raise RuntimeError("API server gone")

    coalescer = Coalescer(act)
    with pytest.raises(RuntimeError, match="API server gone"):
        coalescer.trigger(("ns", "a"), "create")
    with pytest.raises(RuntimeError):
        coalescer.trigger(("ns", "a"), "create")


def test_a_forgotten_run_is_not_reconciled_later():
    clock = FakeClock()
    calls = []
    coalescer = Coalescer(lambda key, why: calls.append(why), clock=clock)
    coalescer.trigger(("ns", "a"), "pod", urgent=False)
    coalescer.trigger(("ns", "a"), "pod", urgent=False)
    coalescer.forget(("ns", "a"))
    clock.now += 5
    coalescer.run_due()
    coalescer.stop()
    assert calls == ["pod"]


def test_with_settle_a_burst_of_pod_events_makes_one_reconcile_and_none_runs_in_the_callers_thread():
    clock = FakeClock()
    calls = []
    coalescer = Coalescer(lambda key, why: calls.append((clock.now, why)), min_interval=1.0, clock=clock, settle=0.5)
    assert not coalescer.trigger(("ns", "a"), "pod", urgent=False), "deferred, though nothing ran for a while"
    for _ in range(4):  # the rest of the burst
        clock.now += 0.1
        assert not coalescer.trigger(("ns", "a"), "pod", urgent=False)
    assert coalescer.pending() == {("ns", "a"): pytest.approx(100.5)}, "the first event's settle, not slid on"
    clock.now = 100.5
    coalescer.run_due()
    coalescer._pool.shutdown(wait=True)
    coalescer.stop()
    assert calls == [(100.5, "pod")]
    assert coalescer.trigger(("ns", "a"), "child") is True, "an urgent trigger still runs at once"


def test_soon_waits_for_no_settle_runs_in_the_pool_and_keeps_the_interval():
    clock = FakeClock()
    calls = []
    coalescer = Coalescer(lambda key, why: calls.append((clock.now, why, threading.current_thread().name)),
                          min_interval=1.0, clock=clock, settle=0.5)
    coalescer.soon(("ns", "a"), "push")
    assert calls == [], "never in the caller's thread (the status server's event loop)"
    assert coalescer.pending() == {("ns", "a"): 100.0}, "due now: no settle"
    coalescer.run_due()
    coalescer._pool.shutdown(wait=True)
    assert [(at, why) for at, why, _ in calls] == [(100.0, "push")]
    assert calls[0][2].startswith("coalesced-reconcile")
    clock.now = 100.2
    coalescer.soon(("ns", "a"), "push")
    assert coalescer.pending() == {("ns", "a"): pytest.approx(101.0)}, "at most one reconcile a second per run"
    coalescer.stop()
