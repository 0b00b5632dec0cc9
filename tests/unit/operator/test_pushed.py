"""The documents the runs' pods pushed, as the operator keeps them: parsed as storage's, the newest per run and kind,
bounded, forgotten with the run; and the setting that turns the status endpoint on."""

from __future__ import annotations

import pytest

from scalingrun_api.heartbeat import Heartbeat
from scalingrun_api.progress import Progress
from scalingrun_api.status_push import HEARTBEAT, PROGRESS
from scalingrun_operator.pushed import PushedDocuments, parse_pushed
from scalingrun_operator.config import ConfigError, load


def test_pushed_documents_are_parsed_as_storage_reads_them_and_forgotten_with_the_run():
    assert parse_pushed(PROGRESS, [1, 2]) is None and parse_pushed(HEARTBEAT, "beat") is None
    assert parse_pushed(PROGRESS, {"epoch": "three", "maxEpochs": 5}).max_epochs == 5  # junk left out, rest kept
    pushed = PushedDocuments()
    pushed.record("ns", "run", PROGRESS, Progress(epoch=1))
    pushed.record("ns", "run", HEARTBEAT, Heartbeat(step=3))
    pushed.forget("ns", "run")
    assert pushed.get("ns", "run", PROGRESS) is None and pushed.get("ns", "run", HEARTBEAT) is None


def test_the_least_recently_pushed_go_first_past_the_bound():
    pushed = PushedDocuments(kept=2)
    for run in ("a", "b"):
        pushed.record("ns", run, PROGRESS, Progress(epoch=1))
    pushed.record("ns", "a", PROGRESS, Progress(epoch=2))  # a is the most recent now
    pushed.record("ns", "c", PROGRESS, Progress(epoch=1))
    assert [run for run in "abc" if pushed.get("ns", run, PROGRESS)] == ["a", "c"]


def test_the_status_endpoint_needs_the_https_url_the_pods_reach_it_at():
    with pytest.raises(ConfigError, match="STATUS_URL"):
        load({"SCALINGRUN_STATUS_PORT_NUMBER": "8443"})
    with pytest.raises(ConfigError, match="STATUS_URL"):
        load({"SCALINGRUN_STATUS_PORT_NUMBER": "8443", "SCALINGRUN_STATUS_URL": "http://op:8443"})
    config = load({"SCALINGRUN_STATUS_PORT_NUMBER": "8443", "SCALINGRUN_STATUS_URL": "https://op.ns.svc:8443"})
    assert config.status_port_number == 8443 and config.status_url == "https://op.ns.svc:8443"
    assert load({}).status_port_number == 0  # off unless configured
