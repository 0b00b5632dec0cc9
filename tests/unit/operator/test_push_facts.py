"""With the status endpoint on, observe answers decide's document asks from the run's own pods, never from storage:
the dataset manifest from the termination message a preprocessing or check pod left, progress and heartbeat as
pushed. decide gets the same facts as from storage (what it uses of the manifest), so it decides the same."""

from __future__ import annotations

import json

import pytest

from scalingrun_api.manifest import (
    TERMINATION_MESSAGE_BYTES, DatasetManifest, manifest_from_termination_message, manifest_termination_message,
)
from scalingrun_api.status_push import PROGRESS
from scalingrun_operator import config
from scalingrun_operator.cluster.observe import Observer
from scalingrun_operator.cluster.pod_index import PodIndex
from scalingrun_operator.pushed import PushedDocuments
from scalingrun_operator.decide.pods import manifest_left
from scalingrun_operator.decide.snapshot import MANIFEST, Document, Listing, Names, Read, Store
from scalingrun_operator.cluster.memory import Memory
from scalingrun_operator.document_source import PodDocuments, PushedSources
from scalingrun_operator.pull.store_source import StoreSources

PUSH = config.load({"SCALINGRUN_STATUS_PORT_NUMBER": "8443",
                    "SCALINGRUN_STATUS_URL": "https://scalingrun-status.scalingrun-system.svc:8443",
                    "SCALINGRUN_ALLOW_LOCAL_PATHS": "true"})
PULL = config.load({"SCALINGRUN_PULL_DOCUMENTS": "true", "SCALINGRUN_ALLOW_LOCAL_PATHS": "true"})

MANIFEST_DOCUMENT = {
    "fingerprint": "f" * 16, "parameters": {"formatVersion": 2, "imageSize": 32}, "source": "s3://b/raw",
    "classes": ["cat", "dog"], "shards": 2, "shardsReused": 0, "written": {"train": 40, "validation": 5},
    "skipped": 1, "skippedFiles": [{"path": "a/broken.jpg", "reason": "cannot identify image file"}],
    "files": {"train": ["train/part-00000-of-00002.parquet"], "validation": ["validation/part-00000-of-00002.parquet"]},
}


JOB_UID = "uid-of-demo-preprocess"


def _preprocess_pod(name: str, exit_code: int, message: str, finished: str = "2026-11-27T10:00:00Z",
                    job_uid: str = JOB_UID) -> dict:
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "demo-preprocess", "uid": job_uid, "controller": True}
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "ownerReferences": [owner],
                         "labels": {"scalingrun.dev/run": "demo", "app.kubernetes.io/component": "preprocess"}},
            "status": {"phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": [
                {"name": "preprocess", "state": {"terminated": {"exitCode": exit_code, "message": message,
                                                                "finishedAt": finished}}}]}}


def _observer(settings, pods: list[dict], pushed: PushedDocuments | None = None) -> Observer:
    index = PodIndex()
    index.listing("ns", "demo", lambda: pods)
    # No Kube: a look that reached for the API server beyond the pod index (a Secret) would fail here.
    # Pull mode's source gets no Secret reader either: a read that reached for one would fail.
    sources = StoreSources(None, settings) if settings.reads_storage else PushedSources(pushed)  # type: ignore
    return Observer(None, Memory(), sources.for_look("ns", "demo"), "ns", "demo", index)  # type: ignore[arg-type]


def test_the_termination_message_keeps_what_decide_uses_within_the_kubelets_limit():
    small = manifest_from_termination_message(manifest_termination_message(DatasetManifest.read(MANIFEST_DOCUMENT)))
    assert small.classes == ["cat", "dog"] and small.number_of_classes() == 2
    assert small.files == {} and small.skipped_files == []  # file lists are the trainer's, not the operator's
    many = DatasetManifest.read({**MANIFEST_DOCUMENT, "classes": [f"class-{i:04d}" for i in range(1000)]})
    text = manifest_termination_message(many)
    assert len(text.encode()) <= TERMINATION_MESSAGE_BYTES
    assert manifest_from_termination_message(text).number_of_classes() == 1000
    assert manifest_from_termination_message("Traceback (most recent call last): ...") is None
    assert manifest_from_termination_message(json.dumps({"other": 1})) is None


def test_the_newest_successful_pods_manifest_counts():
    old = DatasetManifest.read({**MANIFEST_DOCUMENT, "fingerprint": "0" * 16})
    new = DatasetManifest.read(MANIFEST_DOCUMENT)
    pods = [_preprocess_pod("p-0", 0, manifest_termination_message(old), "2026-11-27T10:00:00Z"),
            _preprocess_pod("p-1", 0, manifest_termination_message(new), "2026-11-27T10:05:00Z"),
            _preprocess_pod("p-2", 1, manifest_termination_message(old), "2026-11-27T10:09:00Z"),  # failed: no
            _preprocess_pod("p-3", 0, "", "2026-11-27T10:10:00Z")]  # a shard that finished before the manifest
    assert manifest_left(pods, JOB_UID).fingerprint == "f" * 16
    assert manifest_left(pods[2:], JOB_UID) is None


def test_only_a_pod_of_the_runs_own_job_leaves_the_manifest():
    """Labels are anyone's: a pod labelled as the run's preprocessing but controlled by another Job (or by none) leaves
    nothing, however new; without the run's Job no pod counts."""
    mine = DatasetManifest.read(MANIFEST_DOCUMENT)
    forged = DatasetManifest.read({**MANIFEST_DOCUMENT, "fingerprint": "e" * 16, "source": "s3://elsewhere/raw"})
    own = _preprocess_pod("demo-preprocess-0", 0, manifest_termination_message(mine), "2026-11-27T10:00:00Z")
    other_job = _preprocess_pod("imposter", 0, manifest_termination_message(forged), "2026-11-27T11:00:00Z",
                                job_uid="uid-of-another-job")
    no_owner = {**other_job, "metadata": {**other_job["metadata"], "name": "loose", "ownerReferences": []}}
    assert manifest_left([own, other_job, no_owner], JOB_UID).fingerprint == "f" * 16
    assert manifest_left([other_job, no_owner], JOB_UID) is None
    assert manifest_left([own], None) is None


def test_push_mode_reads_documents_from_the_pods_and_pull_mode_from_storage_alike(tmp_path):
    uri = str(tmp_path / "_manifest.json")
    (tmp_path / "_manifest.json").write_text(json.dumps(MANIFEST_DOCUMENT))
    store = Store(endpoint=None, region="us-east-1", secret="s3-creds")  # a Secret named: pull mode would read it
    pods = [_preprocess_pod("p-0", 0, manifest_termination_message(DatasetManifest.read(MANIFEST_DOCUMENT)))]
    pushed = PushedDocuments()
    pushed.record("ns", "demo", PROGRESS, {"state": "running", "epoch": 3})

    push = _observer(PUSH, pods, pushed)
    from_pods: Read = push.read(Document(uri, store, MANIFEST, job_uid=JOB_UID))
    assert push.read(Document(uri, store, MANIFEST)).document is None  # no Job: no pod of it
    assert push.read(Document(uri, store, PROGRESS, versioned=True)).document.epoch == 3
    assert push.read(Listing(str(tmp_path), store)) == Names()  # not listed: the Job's own counts say it
    # The pods' source: no store to follow, no storage target to make, no Secret to read (no Kube to read one with).
    assert isinstance(push.documents, PodDocuments) and push.documents.followed(Document(uri, store, PROGRESS)) is None

    pull = _observer(PULL, pods)
    with pytest.raises(AttributeError):  # pull mode reads the Secret first: with no Kube, it cannot
        pull.read(Document(uri, store, MANIFEST))
    from_storage: Read = _observer(PULL, pods).read(Document(uri, Store(None, "us-east-1"), MANIFEST))
    assert from_storage.document.files  # storage's has the file lists; the pod's leaves them out
    used = ("fingerprint", "parameters", "source", "classes", "shards", "shards_reused", "written", "skipped")
    assert {f: getattr(from_pods.document, f) for f in used} == {f: getattr(from_storage.document, f) for f in used}
