"""The rows of `scalingrun get` (the command against an API server: tests/integration/test_cli_cluster.py)."""

from __future__ import annotations

import datetime as dt

from scalingrun_operator.cli.cluster import RUN_COLUMNS, SWEEP_COLUMNS, _reached, run_row, sweep_row, table

NOW = dt.datetime(2026, 11, 25, 20, 0, tzinfo=dt.timezone.utc)


def test_a_run_without_status_shows_dashes_not_errors():
    assert run_row({"metadata": {"name": "new"}, "spec": {}}, NOW) == ["new", "-", "-", "-", "-", "-", "-", "-", "0",
                                                                        ""]


def test_eta_and_a_long_message_cut_unless_wide():
    run = {"metadata": {"name": "r"}, "spec": {"workers": {"replicas": 4}},
           "status": {"phase": "Training", "message": "x" * 100,
                      "training": {"estimatedCompletion": "2026-11-25T21:35:00Z", "epoch": 1}}}
    row = run_row(run, NOW)
    assert row[2:4] == ["4", "1"] and row[7] == "1h35m" and len(row[-1]) == 60 and row[-1].endswith("…")
    assert run_row(run, NOW, wide=True)[-1] == "x" * 100
    run["status"]["training"]["estimatedCompletion"] = "2026-11-25T20:12:30Z"
    assert run_row(run, NOW)[7] == "12m"


def test_a_sweep_row_names_its_progress_and_recommendation():
    sweep = {"metadata": {"name": "s"}, "status": {"phase": "Succeeded", "progress": "4/4", "message": "done",
                                                   "recommendation": {"run": "s-w4"}}}
    assert sweep_row(sweep, NOW) == ["s", "Succeeded", "4/4", "s-w4", "done"]
    assert table([sweep_row(sweep, NOW)], SWEEP_COLUMNS).splitlines() == [
        "NAME   PHASE       POINTS   RECOMMENDED   MESSAGE", "s      Succeeded   4/4      s-w4          done"]
    assert len(RUN_COLUMNS) == len(run_row({"metadata": {"name": "x"}}, NOW))


def test_wait_reads_phases_and_conditions():
    run = {"status": {"phase": "Training", "conditions": [{"type": "Ready", "status": "False"}]}}
    assert _reached(run, "Training") and not _reached(run, "Succeeded")
    assert _reached(run, "condition=Ready=False") and not _reached(run, "condition=Ready")


def test_an_elastic_run_shows_its_size_and_wide_output_its_resizes_with_their_cost():
    run = {"metadata": {"name": "spot"}, "spec": {"workers": {"replicas": 4, "minReplicas": 2}},
           "status": {"training": {"elastic": {"workers": 2, "resizes": [
               {"from": 4, "to": 2, "cause": "workersUnplaced", "costSeconds": 310}]}}}}
    assert run_row(run, NOW)[2] == "2/4"
    assert run_row(run, NOW, wide=True)[2] == "2/4 (4->2 310s)"
    run["status"]["training"]["elastic"].update(workers=4, resizing={"from": 2, "to": 4, "cause": "capacityReturned"})
    assert run_row(run, NOW, wide=True)[2] == "4 (4->2 310s, 2->4 now)"
    assert run_row({"metadata": {"name": "fixed"}, "spec": {"workers": {"replicas": 3}}}, NOW, wide=True)[2] == "3"


def test_wide_output_shows_the_hours_at_each_size_the_running_one_counted_to_now_or_the_end():
    since = NOW - dt.timedelta(minutes=30)
    elastic = {"workers": 2, "resizes": [{"from": 4, "to": 2, "cause": "workersUnplaced", "costSeconds": 310}],
               "sizes": [{"workers": 4, "seconds": 5400, "workerHours": 6.0}],
               "counting": {"workers": 2, "since": since.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    run = {"metadata": {"name": "spot"}, "spec": {"workers": {"replicas": 4, "minReplicas": 2, "gpusPerWorker": 8}},
           "status": {"phase": "Training", "training": {"elastic": elastic}}}
    gpu_hours = {4: 4 * 8 * 5400 / 3600, 2: 2 * 8 * (NOW - since).total_seconds() / 3600}
    assert run_row(run, NOW, wide=True)[2] == f"2/4 (4->2 310s; GPU-h 4: {gpu_hours[4]:.2f}, 2: {gpu_hours[2]:.2f})"
    assert run_row(run, NOW)[2] == "2/4"
    ended = since + dt.timedelta(minutes=12)  # a finished run: counted to its completionTime, however late read
    run["status"].update(phase="Succeeded", completionTime=ended.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert run_row(run, NOW, wide=True)[2].endswith(f", 2: {2 * 8 * 12 * 60 / 3600:.2f})")
    run["spec"]["workers"]["gpusPerWorker"] = 0
    assert f"; worker-h 4: {4 * 5400 / 3600:.2f}, 2: {2 * 12 * 60 / 3600:.2f})" in run_row(run, NOW, wide=True)[2]
