"""What the operator keeps between looks: its copies of runs, children and keys (cluster/latest.py), good for a
while after the API server showed them, never older than one held, never a deleted object's; what decide derived
from a run (cluster/reconcile.py); and kopf's diff base, built for the kinds with change handlers only
(handlers/lifecycle.py); a store's keys, read again once a read of the store failed (cluster/observe.py)."""

from __future__ import annotations

import copy
import json

import kopf

from scalingrun_api.status_push import PROGRESS
from scalingrun_operator.cluster.latest import Latest, LatestObjects
from scalingrun_operator.cluster.memory import Memory
from scalingrun_operator.cluster.observe import Observer
from scalingrun_operator.cluster.reconcile import Reconciler
from scalingrun_operator.config import Config
from scalingrun_operator.decide.pinning import PINNED_FIELD
from scalingrun_operator.decide.snapshot import Child, Document, Store
from scalingrun_operator.document_source import PodDocuments
from scalingrun_operator.pull.store_source import StoreSources
from scalingrun_operator.pull.storage import Credentials
from scalingrun_operator.handlers.lifecycle import ChangeHandledDiffBase


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(name: str, version: str, phase: str = "Training") -> dict:
    return {"kind": "ScalingRun", "metadata": {"namespace": "ns", "name": name, "resourceVersion": version},
            "spec": {}, "status": {"phase": phase}}


def test_a_copy_serves_until_it_is_older_than_max_age_since_last_shown():
    clock = Clock()
    latest = Latest(max_age=60, clock=clock)
    latest.seen("k", "v1", "10")
    clock.now = 59
    assert latest.get("k") == "v1"
    latest.seen("k", "v1", "10")  # shown again: good for another 60 s
    clock.now = 118
    assert latest.get("k") == "v1"
    clock.now = 120
    assert latest.get("k") is None
    assert len(latest) == 0


def test_a_watch_event_behind_the_answer_to_a_write_is_not_taken():
    latest = Latest(max_age=60)
    latest.seen("k", "written", "12")
    latest.seen("k", "lagging event", "11")
    assert latest.get("k") == "written"
    latest.seen("k", "the write's own event", "12")
    latest.seen("k", "newer", "13")
    assert latest.get("k") == "newer"


def test_versions_that_are_not_numbers_take_the_newest_to_arrive():
    latest = Latest(max_age=60)
    latest.seen("k", "first", "b")
    latest.seen("k", "second", "a")
    assert latest.get("k") == "second"


def test_a_deleted_object_has_no_copy_and_a_write_that_raced_its_deletion_does_not_bring_one_back():
    objects = LatestObjects()
    objects.run_seen(None, run("r", "20"))
    objects.run_seen("DELETED", run("r", "25"))
    assert objects.runs.get(("ns", "r")) is None
    objects.run_seen(None, run("r", "24"))  # the answer to a status write, handled after the DELETED event
    assert objects.runs.get(("ns", "r")) is None
    objects.run_seen("ADDED", run("r", "30", phase="Pending"))  # made again under the same name
    assert objects.runs.get(("ns", "r"))["status"]["phase"] == "Pending"


def test_forget_drops_a_copy_so_the_next_read_asks_the_server():
    objects = LatestObjects()
    objects.run_seen(None, run("r", "20"))
    objects.runs.forget(("ns", "r"))
    assert objects.runs.get(("ns", "r")) is None


def test_children_are_kept_by_kind_namespace_and_name():
    objects = LatestObjects()
    job = {"kind": "Job", "metadata": {"namespace": "ns", "name": "r-preprocess", "resourceVersion": "5"}}
    mpijob = {"kind": "MPIJob", "metadata": {"namespace": "ns", "name": "r-preprocess", "resourceVersion": "6"}}
    objects.child_seen(None, job)
    objects.child_seen("MODIFIED", {**mpijob, "metadata": {**mpijob["metadata"], "managedFields": [{"manager": "x"}]}})
    assert objects.children.get(("Job", "ns", "r-preprocess")) is job
    assert objects.children.get(("MPIJob", "ns", "r-preprocess")) == mpijob, "kept without its managedFields"
    objects.child_seen("DELETED", {**job, "metadata": {**job["metadata"], "resourceVersion": "7"}})
    assert objects.children.get(("Job", "ns", "r-preprocess")) is None


def test_copies_nobody_asks_for_again_are_dropped_in_time():
    clock = Clock()
    latest = Latest(max_age=30, clock=clock)
    latest.seen(("ns", "old-secret"), "keys")
    clock.now = 31
    for i in range(1024):
        latest.seen(("ns", f"s{i}"), "keys")
    assert len(latest) == 1024  # the old one went with the 1,024th store, before anyone asked for it


def test_the_diff_base_is_kopfs_for_runs_and_none_for_pods():
    ours = ChangeHandledDiffBase(prefix="scalingrun.dev", key="last-handled-configuration")
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix="scalingrun.dev", key="last-handled-configuration")
    body = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
            "metadata": {"name": "r", "resourceVersion": "5", "labels": {"team": "a"}, "managedFields": [{"x": 1}],
                         "annotations": {"scalingrun.dev/last-handled-configuration": "{}", "note": "x"}},
            "spec": {"workers": {"replicas": 2}}, "status": {"phase": "Training", "training": {"pods": [1] * 100}}}
    assert ours.build(body=kopf.Body(body)) == kopfs.build(body=kopf.Body(body))
    assert "status" not in ours.build(body=kopf.Body(body))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Running"}}
    assert ours.build(body=kopf.Body(pod)) is None


def test_a_look_starts_from_what_the_last_look_derived_while_uid_generation_and_pin_hold():
    reconcile = Reconciler(kube=None, config=Config())
    body = run("r", "5")
    body["metadata"].update(uid="u1", generation=1)
    derived = reconcile._derived_for("ns", "r", body)
    derived["run"] = "parsed once"
    written = copy.deepcopy(body)
    written["metadata"]["resourceVersion"] = "6"
    written["status"]["phase"] = "Succeeded"  # a status write moves nothing decide derives from the spec
    assert reconcile._derived_for("ns", "r", written) is derived
    edited = copy.deepcopy(written)
    edited["metadata"]["generation"] = 2
    assert reconcile._derived_for("ns", "r", edited) == {}
    pinned = copy.deepcopy(edited)
    pinned["status"][PINNED_FIELD] = json.dumps({"workers": {"replicas": 2}})
    kept = reconcile._derived_for("ns", "r", pinned)
    assert kept == {} and kept is not reconcile._derived_for("ns", "r", edited)
    made_again = copy.deepcopy(body)
    made_again["metadata"]["uid"] = "u2"
    reconcile._derived_for("ns", "r", body)["run"] = "parsed once"
    assert reconcile._derived_for("ns", "r", made_again) == {}
    reconcile._derived_for("ns", "r", body)["run"] = "parsed once"
    reconcile.forget("ns", "r")
    assert reconcile._derived_for("ns", "r", body) == {}


class SecretReader:
    def __init__(self) -> None:
        self.reads = 0

    def read_credentials(self, namespace, secret, id_key, secret_key):
        self.reads += 1
        return Credentials("AKIAEXAMPLE", "not-a-real-secret")


def test_a_stores_keys_are_read_once_for_many_looks_and_again_after_a_read_failed():
    reader, objects = SecretReader(), LatestObjects()

    sources = StoreSources(reader, Config(pull_documents=True), objects.credentials)

    def observer() -> Observer:
        return Observer(reader, Memory(), sources.for_look("ns", "r"), "ns", "r",  # type: ignore[arg-type]
                        latest=objects)

    store = Store(endpoint="http://127.0.0.1:9", region="us-east-1", secret="keys")
    observer().documents.target(store)
    observer().documents.target(store)
    assert reader.reads == 1
    # Loopback is refused by default: a read that fails, as one with a rotated key would.
    failed = observer().read(Document("s3://bucket/runs/r/progress.json", store, PROGRESS, versioned=True))
    assert failed.error and reader.reads == 1
    observer().documents.target(store)
    assert reader.reads == 2
    sources.for_look("ns", "r", copies=False).target(store)  # a look after a conflict trusts no copy
    assert reader.reads == 3


class ChildReader:
    """get_child of a Kube: counts the reads of each kind."""

    def __init__(self) -> None:
        self.reads: dict[str, int] = {}

    def get_child(self, kind, namespace, name):
        self.reads[kind] = self.reads.get(kind, 0) + 1
        return {"kind": kind, "metadata": {"namespace": namespace, "name": name, "resourceVersion": "9"}}


def test_a_watched_child_read_once_is_served_from_its_copy_and_a_configmap_is_read_every_look():
    reader, objects = ChildReader(), LatestObjects()
    for _ in range(3):
        observer = Observer(reader, Memory(), PodDocuments(None, "ns", "r"), "ns", "r",  # type: ignore[arg-type]
                            latest=objects)
        for kind in ("Job", "MPIJob", "ConfigMap"):
            assert observer.read(Child(kind, f"r-{kind.lower()}"))["metadata"]["name"] == f"r-{kind.lower()}"
    # A ConfigMap has no watch: a copy of it would hide its deletion or an edit.
    assert reader.reads == {"Job": 1, "MPIJob": 1, "ConfigMap": 3}
    # Deleted since (its watch event): read again, and the older read's answer is not taken back.
    objects.child_seen("DELETED", {"kind": "Job", "metadata": {"namespace": "ns", "name": "r-job",
                                                               "resourceVersion": "10"}})
    objects.child_read("Job", "ns", {"metadata": {"namespace": "ns", "name": "r-job", "resourceVersion": "9"}})
    again = Observer(reader, Memory(), PodDocuments(None, "ns", "r"), "ns", "r",  # type: ignore[arg-type]
                     latest=objects)
    again.read(Child("Job", "r-job"))
    assert reader.reads["Job"] == 2

