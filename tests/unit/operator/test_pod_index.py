"""The pod watch's index of the runs' pods: served only after a list of its own, kept by events, and a list that
overlaps events keeps what the events said after it began."""

from __future__ import annotations

import copy

from scalingrun_operator.cluster.pod_index import PodIndex

NS = "ml"


def pod(name: str, run: str = "demo", phase: str = "Running", uid: str = "") -> dict:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}",
                         "labels": {"scalingrun.dev/run": run}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"containers": [{"name": "worker", "image": "trainer:1", "env": [{"name": "A", "value": "1"}]}]},
            "status": {"phase": phase}}


def names(pods) -> list[tuple[str, str]]:
    return [(p["metadata"]["name"], p["status"]["phase"]) for p in pods]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_run_is_listed_until_a_list_seeded_it_then_events_keep_it():
    index = PodIndex()
    index.observe(None, pod("demo-worker-1"))  # kopf's listing at start-up: not trusted alone
    assert index.pods(NS, "demo") is None
    listed = index.listing(NS, "demo", lambda: [pod("demo-worker-1"), pod("demo-launcher")])
    assert names(listed) == [("demo-launcher", "Running"), ("demo-worker-1", "Running")]
    index.observe("ADDED", pod("demo-worker-0", phase="Pending"))
    index.observe("MODIFIED", pod("demo-worker-1", phase="Failed"))
    index.observe("DELETED", pod("demo-launcher"))
    index.observe("ADDED", pod("other-worker-0", run="other"))
    assert names(index.pods(NS, "demo")) == [("demo-worker-0", "Pending"), ("demo-worker-1", "Failed")]
    assert "managedFields" not in index.pods(NS, "demo")[0]["metadata"]  # kept trimmed, as a list returns them
    assert "env" not in index.pods(NS, "demo")[0]["spec"]["containers"][0]
    assert index.pods(NS, "other") is None


def test_what_events_say_while_a_list_is_under_way_wins_over_the_list():
    index = PodIndex()
    index.listing(NS, "demo", lambda: [pod("demo-worker-0", phase="Pending"), pod("demo-worker-1")])

    def list_overtaken():
        stale = [pod("demo-worker-0", phase="Pending"), pod("demo-worker-1")]  # as the server was when asked
        index.observe("MODIFIED", pod("demo-worker-0", phase="Running"))
        index.observe("DELETED", pod("demo-worker-1"))
        index.observe("ADDED", pod("demo-worker-2", phase="Pending"))
        return stale

    assert names(index.listing(NS, "demo", list_overtaken)) == [("demo-worker-0", "Running"),
                                                                  ("demo-worker-2", "Pending")]
    assert names(index.pods(NS, "demo")) == [("demo-worker-0", "Running"), ("demo-worker-2", "Pending")]


def test_a_pod_gone_without_an_event_is_dropped_by_the_next_list():
    index = PodIndex()
    index.listing(NS, "demo", lambda: [pod("demo-worker-0"), pod("demo-worker-1")])
    assert names(index.listing(NS, "demo", lambda: [pod("demo-worker-1")])) == [("demo-worker-1", "Running")]
    assert names(index.pods(NS, "demo")) == [("demo-worker-1", "Running")]


def test_the_index_is_listed_again_after_the_resync_interval_or_a_relist_by_kopf():
    clock = Clock()
    index = PodIndex(resync_seconds=60, clock=clock)
    index.listing(NS, "demo", lambda: [pod("demo-worker-0")])
    clock.now = 59
    assert index.pods(NS, "demo") is not None
    clock.now = 61
    assert index.pods(NS, "demo") is None  # the safety net: a list now and then
    index.listing(NS, "demo", lambda: [pod("demo-worker-0")])
    assert index.pods(NS, "demo") is not None
    index.observe(None, copy.deepcopy(pod("demo-worker-0")))  # kopf listed again: its watch may have missed events
    assert index.pods(NS, "demo") is None


def test_a_forgotten_run_leaves_nothing_behind():
    index = PodIndex()
    index.listing(NS, "demo", lambda: [pod("demo-worker-0"), pod("demo-worker-1")])
    index.forget(NS, "demo")
    assert index.pods(NS, "demo") is None
    index.observe("MODIFIED", pod("demo-worker-0", phase="Failed"))  # its pods going away with it
    index.observe("DELETED", pod("demo-worker-0"))
    index.observe("DELETED", pod("demo-worker-1"))
    assert index.size() == 0 and index.pods(NS, "demo") is None
