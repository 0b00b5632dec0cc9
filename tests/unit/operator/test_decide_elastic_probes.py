"""An elastic run's capacity probes under the operator's grants (issue 51, item 5): at most max_capacity_probes per
run, carrying the run's Kueue LocalQueue, and a shrunk run that may not probe says so instead of waiting silently."""

from __future__ import annotations

from scalingrun_operator.builders.common import KUEUE_QUEUE_LABEL
from scalingrun_operator.decide import pinning
from scalingrun_operator.decide.snapshot import Create, Settings
from tests.support.decide_world import actions
from tests.support.decide_elastic import PROBES, after, placed, shrunk


def _made(decision) -> list[dict]:
    return [a.obj for a in decision.actions if isinstance(a, Create)]


def test_a_shrunk_run_without_probes_says_it_cannot_grow_back_once():
    found = shrunk(probes=0)
    decision = found.decide(Settings())  # the chart's default: no PriorityClass, no pods create
    assert _made(decision) == []
    status, reason, message = placed(decision)
    assert (status, reason) == ("False", "CapacityProbesOff")
    assert "2 of 4 workers" in message and "elastic.capacityProbes" in message
    assert [e.reason for e in decision.events] == ["CapacityProbesOff"]
    assert after(found, decision).decide(Settings()).events == ()  # said once, kept in the condition
    assert placed(shrunk(probes=0).decide(PROBES))[1] == "Shrunk"  # with probes: growing back is under way


def test_probes_per_run_are_capped_and_those_above_the_cap_go():
    capped = Settings(capacity_probe_priority_class=PROBES.capacity_probe_priority_class, max_capacity_probes=1)
    assert [p["metadata"]["name"] for p in _made(shrunk(probes=0).decide(capped))] == ["demo-capacity-0"]
    # Two left from an operator with a higher cap: the second goes, the first stays.
    assert actions(shrunk(probes=2).decide(capped)) == [("delete", "demo-capacity-1")]


def test_a_probe_of_a_run_with_a_local_queue_carries_it_for_kueue():
    found = shrunk(probes=0)
    found.spec.setdefault("runPolicy", {})["kueueQueueName"] = "team-a"
    found.status[pinning.PINNED_FIELD] = pinning.pin(found.spec)  # started so, not changed since
    probes = _made(found.decide(PROBES))
    assert probes and all(p["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a" for p in probes)
    assert all(KUEUE_QUEUE_LABEL not in p["metadata"]["labels"] for p in _made(shrunk(probes=0).decide(PROBES)))
