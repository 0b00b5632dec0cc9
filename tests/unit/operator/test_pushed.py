"""The documents the runs' pods pushed, as the operator keeps them: parsed as storage's, the newest per run and kind,
bounded per run, per namespace and in all (a tenant evicts only its own idle runs, and is refused past its bound),
forgotten with the run; and the settings that turn the status endpoint on, or choose pull mode instead."""

from __future__ import annotations

import pytest

from scalingrun_api.progress import Progress
from scalingrun_api.status_push import HEARTBEAT, PROGRESS
from scalingrun_operator.pushed import (
    NAMESPACE_BOUND, RUN_BOUND, STORE_FULL, Bounds, PushedDocuments, parse_pushed, parsed_size,
)
from scalingrun_operator.config import Config, ConfigError, document_choice, load


def test_pushed_documents_are_parsed_as_storage_reads_them_and_forgotten_with_the_run():
    assert parse_pushed(PROGRESS, [1, 2]) is None and parse_pushed(HEARTBEAT, "beat") is None
    assert parse_pushed(PROGRESS, {"epoch": "three", "maxEpochs": 5}).max_epochs == 5  # junk left out, rest kept
    pushed = PushedDocuments()
    assert pushed.record("ns", "run", PROGRESS, {"epoch": 1}) is None
    assert pushed.record("ns", "run", HEARTBEAT, {"step": 3}) is None
    assert pushed.get("ns", "run", PROGRESS) == Progress(epoch=1) and pushed.get("ns", "run", HEARTBEAT).step == 3
    pushed.forget("ns", "run")
    assert pushed.get("ns", "run", PROGRESS) is None and pushed.get("ns", "run", HEARTBEAT) is None
    assert pushed.held() == (0, 0)


def _history(epochs: int) -> dict:
    return {"epoch": epochs, "history": [{"epoch": e} for e in range(1, epochs + 1)]}


def test_a_runs_bound_refuses_its_push_for_good_and_keeps_what_it_had():
    pushed = PushedDocuments(Bounds(run_history_entries=10, run_parsed_bytes=20_000))
    assert pushed.record("ns", "a", PROGRESS, _history(5)) is None
    too_long = pushed.record("ns", "a", PROGRESS, _history(11))
    assert (too_long.status, too_long.reason) == (413, RUN_BOUND)  # 413: the trainer gives that document up
    assert "10 history entries" in too_long.message and too_long.retry_after is None
    big = pushed.record("ns", "a", PROGRESS, {"epoch": 1, "metrics": {f"m{i}": 1.0 for i in range(500)}})
    assert big.reason == RUN_BOUND and "parsed" in big.message
    assert pushed.get("ns", "a", PROGRESS).epoch == 5  # the refused pushes changed nothing
    assert parsed_size(parse_pushed(PROGRESS, _history(100))) > parsed_size(parse_pushed(PROGRESS, _history(10)))


def test_a_namespace_at_its_bound_evicts_only_its_own_idle_runs_then_is_refused():
    now = [0.0]
    pushed = PushedDocuments(Bounds(namespace_documents=3, idle_seconds=100), clock=lambda: now[0])
    for run in ("old", "a", "b"):
        assert pushed.record("tenant", run, HEARTBEAT, {"step": 1}) is None
        now[0] += 10
    assert pushed.record("other", "x", HEARTBEAT, {"step": 1}) is None  # another tenant: a store of its own
    # Full, and no run of the tenant idle: refused (429, try again), nothing evicted, the other tenant untouched.
    full = pushed.record("tenant", "c", HEARTBEAT, {"step": 1})
    assert (full.status, full.reason, full.retry_after) == (429, NAMESPACE_BOUND, 60)
    assert "documents: 3" in full.message
    assert [r for r in ("old", "a", "b", "c") if pushed.get("tenant", r, HEARTBEAT)] == ["old", "a", "b"]
    assert pushed.record("tenant", "a", HEARTBEAT, {"step": 2}) is None  # a run replacing its own is no more
    # "old" idle for 100 s: the next run of the tenant takes its place; the other tenant keeps its document.
    now[0] = 100
    assert pushed.record("tenant", "c", HEARTBEAT, {"step": 1}) is None
    assert [r for r in ("old", "a", "b", "c") if pushed.get("tenant", r, HEARTBEAT)] == ["a", "b", "c"]
    assert pushed.get("other", "x", HEARTBEAT).step == 1
    assert pushed.held("tenant")[0] == 3 and pushed.held()[0] == 4


@pytest.mark.parametrize("bound, document, over", [
    ({"namespace_bytes": 100}, {"step": 1, "rank": 0, "time": 1.0, "host": "x" * 40}, "bytes: 100"),
    ({"namespace_history_entries": 15}, _history(8), "history entries: 15"),
    ({"namespace_parsed_bytes": 10_000}, _history(8), "parsed bytes: 10000"),
])
def test_each_of_a_namespaces_bounds_holds(bound, document, over):
    pushed = PushedDocuments(Bounds(**bound))
    what = PROGRESS if "history" in document else HEARTBEAT
    assert pushed.record("tenant", "a", what, document) is None
    full = pushed.record("tenant", "b", what, document)
    assert full is not None and full.reason == NAMESPACE_BOUND and over in full.message
    assert pushed.record("other", "b", what, document) is None


def test_all_namespaces_together_are_bounded_and_no_tenant_evicts_another():
    pushed = PushedDocuments(Bounds(documents=2))
    for namespace in ("one", "two"):
        assert pushed.record(namespace, "a", HEARTBEAT, {"step": 1}) is None
    full = pushed.record("three", "a", HEARTBEAT, {"step": 1})
    assert (full.status, full.reason) == (429, STORE_FULL)
    assert pushed.get("one", "a", HEARTBEAT) and pushed.get("two", "a", HEARTBEAT)
    assert pushed.record("one", "a", HEARTBEAT, {"step": 2}) is None  # replacing takes no more room


def test_the_status_endpoint_needs_the_https_url_the_pods_reach_it_at():
    with pytest.raises(ConfigError, match="STATUS_URL"):
        load({"SCALINGRUN_STATUS_PORT_NUMBER": "8443"})
    with pytest.raises(ConfigError, match="STATUS_URL"):
        load({"SCALINGRUN_STATUS_PORT_NUMBER": "8443", "SCALINGRUN_STATUS_URL": "http://op:8443"})
    config = load({"SCALINGRUN_STATUS_PORT_NUMBER": "8443", "SCALINGRUN_STATUS_URL": "https://op.ns.svc:8443"})
    assert config.status_port_number == 8443 and config.status_url == "https://op.ns.svc:8443"



def test_push_is_the_default_and_pull_an_explicit_choice_that_excludes_the_status_endpoint():
    assert not Config().reads_storage and not load({}).reads_storage
    bare = load({})
    with pytest.raises(ConfigError, match="SCALINGRUN_STATUS_PORT_NUMBER and SCALINGRUN_STATUS_URL.*PULL_DOCUMENTS"):
        document_choice(bare)  # an operator told neither way refuses to start (main.run exits 2 with this)
    pushing = load({"SCALINGRUN_STATUS_PORT_NUMBER": "8443", "SCALINGRUN_STATUS_URL": "https://op.ns.svc:8443"})
    pulling = load({"SCALINGRUN_PULL_DOCUMENTS": "true"})
    document_choice(pushing), document_choice(pulling)
    assert (pushing.reads_storage, pulling.reads_storage) == (False, True)
    with pytest.raises(ConfigError, match="contradict"):
        load({"SCALINGRUN_PULL_DOCUMENTS": "true", "SCALINGRUN_STATUS_PORT_NUMBER": "8443",
              "SCALINGRUN_STATUS_URL": "https://op.ns.svc:8443"})
