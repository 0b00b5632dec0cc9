"""The operator-wide progress watcher on a real filesystem: a run is reconciled when its document changes,
once per recheck asked for, and never for nothing; and no kopf handler makes kopf put finalizers on runs."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from scalingrun_operator.cluster.reconcile_scheduler import ReconcileScheduler
from scalingrun_operator.pull.store_source import FollowedDocument
from scalingrun_operator.pull.storage import StorageError, StorageTarget, changed_since, read_json_versioned
from tests.support.progress_watch import Clock, Recorder

TARGET = StorageTarget(endpoint=None, region="us-east-1", credentials=None)


def write(path, epoch: int) -> None:
    path.write_text(json.dumps({"state": "running", "epoch": epoch, "padding": "x" * epoch}))


def test_file_versions_change_with_the_document(tmp_path):
    path = tmp_path / "progress.json"
    assert read_json_versioned(str(path), TARGET) == (None, None)
    assert changed_since(str(path), TARGET, None) == (False, None)
    write(path, 1)
    changed, version = changed_since(f"file://{path}", TARGET, None)
    assert changed and version
    document, read_version = read_json_versioned(str(path), TARGET)
    assert document["epoch"] == 1 and read_version == version
    assert changed_since(str(path), TARGET, version) == (False, version)
    write(path, 2)
    assert changed_since(str(path), TARGET, version)[0]
    path.unlink()
    assert changed_since(str(path), TARGET, version) == (True, None)
    with pytest.raises(StorageError, match="cannot read"):
        changed_since(str(_under_a_file(tmp_path)), TARGET, None)


def _under_a_file(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    return blocker / "progress.json"


def test_a_run_is_reconciled_only_when_its_document_changed(tmp_path):
    clock, reconcile = Clock(), Recorder()
    watcher = ReconcileScheduler(reconcile, interval=15, clock=clock)
    path = tmp_path / "progress.json"
    write(path, 1)
    _, version = read_json_versioned(str(path), TARGET)
    watcher.watch("ns", "quiet", FollowedDocument(str(path), TARGET), version)
    watcher.watch("ns", "busy", FollowedDocument(str(tmp_path / "other.json"), TARGET), None)  # no document yet

    for _ in range(5):  # five intervals, nothing written
        clock.now += 15
        watcher.run_due()
    assert reconcile.settled(0) == []

    write(path, 22)  # another size: a new version even within one mtime tick
    clock.now += 15
    watcher.run_due()
    assert reconcile.settled(1) == [("ns", "quiet")]
    clock.now += 15
    watcher.run_due()
    assert reconcile.settled(1) == [("ns", "quiet")], "the changed version is remembered"

    write(tmp_path / "other.json", 1)
    watcher.unwatch("ns", "quiet")
    write(path, 333)
    clock.now += 15
    watcher.run_due()
    assert reconcile.settled(2) == [("ns", "quiet"), ("ns", "busy")]
    assert set(watcher.watched()) == {("ns", "busy")}
    watcher.stop()


class _HeldDocument(FollowedDocument):
    """A real file whose check waits until released: a check still waiting for a thread when its run is unwatched."""

    def __init__(self, path, started: threading.Event, release: threading.Event):
        super().__init__(str(path), TARGET)
        self._started, self._release = started, release

    def check(self, version):
        self._started.set()
        assert self._release.wait(30)
        return super().check(version)


@pytest.mark.parametrize("unwatched", [True, False])
def test_a_check_in_flight_when_its_run_is_unwatched_reconciles_nothing(tmp_path, unwatched):
    """CI at load 70: a check handed to the pool before `unwatch` ran after it and the document's next write, and
    reconciled a run no longer watched. Still watched, the same check reconciles it."""
    clock, reconcile = Clock(), Recorder()
    watcher = ReconcileScheduler(reconcile, interval=15, clock=clock)
    path, started, release = tmp_path / "progress.json", threading.Event(), threading.Event()
    write(path, 1)
    _, version = read_json_versioned(str(path), TARGET)
    watcher.watch("ns", "gone", _HeldDocument(path, started, release), version)
    clock.now += 15
    watcher.run_due()
    assert started.wait(30), "the check was handed to the pool"
    if unwatched:
        watcher.unwatch("ns", "gone")
    write(path, 22)
    release.set()
    # Every check, then every reconcile it submitted, run to their end (the scheduler's own pools).
    watcher._checks.shutdown(wait=True)
    watcher._pool.shutdown(wait=True)
    assert reconcile.calls == ([] if unwatched else [("ns", "gone")])
    watcher.stop()


def test_rechecks_run_once_after_their_delay_and_the_earliest_wins(tmp_path):
    clock, reconcile = Clock(), Recorder()
    watcher = ReconcileScheduler(reconcile, interval=15, clock=clock)
    watcher.schedule_recheck("ns", "waiting", 30)
    watcher.schedule_recheck("ns", "waiting", 10)  # earlier: wins
    watcher.schedule_recheck("ns", "waiting", 50)  # later: ignored while one is pending
    watcher.schedule_recheck("ns", "deleted", 5)
    watcher.forget("ns", "deleted")
    clock.now += 9
    assert watcher.run_due() == pytest.approx(1, abs=0.01)
    assert reconcile.settled(0) == []
    clock.now += 1
    watcher.run_due()
    assert reconcile.settled(1) == [("ns", "waiting")]
    clock.now += 60
    watcher.run_due()
    assert reconcile.settled(1) == [("ns", "waiting")] and watcher.pending_rechecks() == {}
    watcher.stop()


def test_unreadable_storage_is_one_reconcile_not_one_per_check(tmp_path):
    clock, reconcile = Clock(), Recorder()
    watcher = ReconcileScheduler(reconcile, interval=15, clock=clock)
    watcher.watch("ns", "lost", FollowedDocument(str(_under_a_file(tmp_path)), TARGET), None)
    for _ in range(4):
        clock.now += 15
        watcher.run_due()
    assert reconcile.settled(1) == [("ns", "lost")]
    watcher.stop()


def test_a_failed_reconcile_is_tried_again_after_its_delay():
    clock = Clock()
    calls: list[float] = []

    class NotYet(Exception):
        delay = 7

    def reconcile(namespace: str, name: str) -> None:
        calls.append(clock.now)
        if len(calls) == 1:
            raise NotYet("owned by another run")

    watcher = ReconcileScheduler(reconcile, interval=15, clock=clock)
    watcher.schedule_recheck("ns", "foreign", 0)
    watcher.run_due()
    deadline = time.monotonic() + 5
    while not watcher.pending_rechecks() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watcher.pending_rechecks() == {("ns", "foreign"): pytest.approx(clock.now + 7)}
    clock.now += 7
    watcher.run_due()
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 2
    watcher.stop()


def test_no_handler_makes_kopf_add_a_finalizer_to_runs():
    """kopf adds its finalizer for any timer, daemon or on.delete handler: a run could not be deleted while the
    operator is down. The operator has none for ScalingRuns."""
    os.environ.setdefault("SCALINGRUN_LOG_FORMAT", "plain")
    import kopf

    from scalingrun_operator import main  # noqa: F401  (registers the handlers)

    registry = kopf.get_default_registry()
    spawning = [h for h in registry._spawning.get_all_handlers()]
    deleting = [h for h in registry._changing.get_all_handlers() if h.requires_finalizer]
    assert spawning == [] and deleting == []


def test_many_runs_are_checked_less_often_not_faster_than_the_check_rate(tmp_path):
    clock, reconcile = Clock(), Recorder()
    watcher = ReconcileScheduler(reconcile, interval=1, max_checks_per_second=2, clock=clock)
    for i in range(10):
        watcher.watch("ns", f"run{i}", FollowedDocument(str(tmp_path / f"{i}.json"), TARGET), None)
    clock.now += 10
    watcher.run_due()  # every run checked once: each next check 10 runs / 2 per second = 5 s on
    dues = sorted(w.due - clock.now for w in watcher._watched.values())
    assert dues == [pytest.approx(5)] * 10
    watcher.unwatch("ns", "run0")
    one = ReconcileScheduler(reconcile, interval=1, max_checks_per_second=2, clock=clock)
    one.watch("ns", "alone", FollowedDocument(str(tmp_path / "alone.json"), TARGET), None)
    clock.now += 1
    one.run_due()
    assert [w.due - clock.now for w in one._watched.values()] == [pytest.approx(1)], "few runs: every interval"
    assert reconcile.settled(0) == []
    watcher.stop()
    one.stop()


def test_child_events_matter_only_when_what_a_reconcile_reads_changed():
    from scalingrun_operator.cluster.memory import Memory

    child_event_matters = Memory().child_event_matters

    job = {"metadata": {"uid": "u-job", "resourceVersion": "1", "ownerReferences": [{"uid": "run", "controller": True}]},
           "spec": {"completions": 1}}
    assert not child_event_matters("ADDED", job), "its creation by the operator is no news"
    assert not child_event_matters("MODIFIED", {**job, "metadata": {**job["metadata"], "resourceVersion": "2"}})
    running = {**job, "status": {"active": 1}}
    assert child_event_matters("MODIFIED", running)
    assert not child_event_matters(None, running), "a re-list of an unchanged child"
    done = {**job, "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
    assert child_event_matters(None, done), "a re-list that shows a change missed in between"
    assert child_event_matters("DELETED", done)
    mpijob = {"metadata": {"uid": "u-mpi"}, "spec": {"runPolicy": {"suspend": False}}, "status": {"conditions": []}}
    assert not child_event_matters(None, mpijob), "the first listing only primes (resume reconciles every run)"
    assert child_event_matters("MODIFIED", {**mpijob, "spec": {"runPolicy": {"suspend": True}}})


def test_a_paused_watcher_acts_on_nothing_until_resumed(tmp_path):
    clock, reconcile = Clock(), Recorder()
    watcher = ReconcileScheduler(reconcile, interval=15, clock=clock)
    watcher.schedule_recheck("ns", "later", 1)
    watcher.pause()
    clock.now += 30
    watcher.run_due()
    assert reconcile.settled(0) == [] and watcher.pending_rechecks()
    watcher.resume()
    watcher.run_due()
    assert reconcile.settled(1) == [("ns", "later")]
    watcher.stop()
