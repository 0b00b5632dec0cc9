"""Only our own children, on a real kube-apiserver: an object of a child's name is adopted only when it carries
the run's labels and has no controller; any other is never patched (its resourceVersion does not move), and
the run says which object holds it up and what to do; a ConfigMap found for a run is brought to its spec.

The operator's Reconciler runs in this process on a namespace no operator serves, so that nothing else
looks in between; the run's documents are local files (no Secret, no S3 server needed).
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api import models
from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders import build_config_map, build_mpijob, build_preprocess_job
from scalingrun_operator.builders.locations import manifest_uri
from scalingrun_operator.cluster import act
from scalingrun_operator.cluster.k8s import Kube
from scalingrun_operator.cluster.latest import LatestObjects
from scalingrun_operator.cluster.reconcile import Reconciler
from scalingrun_operator.config import Config
from scalingrun_operator.decide.children import identity_labels
from scalingrun_operator.decide.pinning import PINNED_FIELD
from scalingrun_operator.decide.preprocessing import dataset_parameters
from scalingrun_operator.decide.snapshot import Patch

from tests.support.operator import Cluster, PULL_FROM_TEST_STORES, wait_for

pytestmark = pytest.mark.k8s

@pytest.fixture
def cluster(api_client, scalingrun_crd, mpijob_crd):
    name = f"srx-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": name}})
    yield Cluster(api_client, name)
    client.CoreV1Api(api_client).delete_namespace(name)


def new_run(cluster: Cluster, root: Path, name: str = "mine", **run_policy) -> tuple[dict, object]:
    spec = {"dataset": {"source": str(root / "raw"), "output": str(root / name), "imageSize": 32,
                        "preprocessing": {"parallelism": 1}},
            "workers": {"replicas": 2, "gpusPerWorker": 0}, **({"runPolicy": run_policy} if run_policy else {})}
    created = cluster.create_run({"apiVersion": models.API_VERSION, "kind": models.KIND, "metadata": {"name": name},
                                  "spec": spec})
    return created, parse_scalingrun({k: created[k] for k in ("apiVersion", "kind", "metadata", "spec")})


def dataset_there(run) -> None:
    path = Path(manifest_uri(run))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fingerprint": "f" * 16, "parameters": dataset_parameters(run),
                                "source": run.spec.dataset.source, "classes": ["a"], "shards": 1,
                                "written": {"train": 4, "validation": 1}, "skipped": 0}))


def put(cluster: Cluster, obj: dict) -> dict:
    kind, namespace = obj["kind"], cluster.ns
    if kind == "ConfigMap":
        return cluster.core.api_client.sanitize_for_serialization(cluster.core.create_namespaced_config_map(namespace, obj))
    if kind == "Job":
        return cluster.batch.api_client.sanitize_for_serialization(cluster.batch.create_namespaced_job(namespace, obj))
    return cluster.custom.create_namespaced_custom_object("kubeflow.org", "v2beta1", namespace, "mpijobs", obj)


def get(cluster: Cluster, kind: str, name: str) -> dict:
    return Kube(cluster.core.api_client).get_child(kind, cluster.ns, name)


def other_owner(cluster: Cluster, tmp_path: Path) -> dict:
    """A controller reference to another ScalingRun (one that exists: the garbage collector would remove what a
    missing owner owns). Nothing reconciles it here."""
    other, _ = new_run(cluster, tmp_path, name="other")
    return {"apiVersion": models.API_VERSION, "kind": models.KIND, "name": "other", "uid": other["metadata"]["uid"],
            "controller": True}


def foreign(obj: dict, how: str, owner: dict) -> dict:
    obj = copy.deepcopy(obj)
    if how == "unlabelled":
        obj["metadata"]["labels"] = {"app": "not-a-scalingrun"}
    else:  # controlled by another owner, labels and all
        obj["metadata"]["ownerReferences"] = [owner]
    return obj


@pytest.mark.parametrize("kind", ["ConfigMap", "Job", "MPIJob"])
@pytest.mark.parametrize("how", ["unlabelled", "controlled by another"])
def test_an_object_of_a_childs_name_that_is_not_the_runs_is_never_patched(cluster, tmp_path, kind, how):
    created, run = new_run(cluster, tmp_path)
    reconcile = Reconciler(Kube(cluster.core.api_client), Config(**PULL_FROM_TEST_STORES))
    if kind == "MPIJob":
        dataset_there(run)  # straight to training
    build = {"ConfigMap": build_config_map, "Job": build_preprocess_job, "MPIJob": build_mpijob}[kind]
    held = put(cluster, foreign(build(run, cluster.ns), how, other_owner(cluster, tmp_path)))
    name = held["metadata"]["name"]
    for _ in range(3):
        reconcile(cluster.ns, "mine")
    now = get(cluster, kind, name)
    assert now["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"], "it was patched"
    assert now["metadata"].get("ownerReferences") == held["metadata"].get("ownerReferences")
    conflict = cluster.condition("mine", "ChildConflict")
    assert (conflict["status"], conflict["reason"]) == ("True", "NameTaken")
    assert conflict["message"].startswith(f"{kind} {name} already exists in namespace {cluster.ns} and ")
    assert f"kubectl delete {kind.lower()} -n {cluster.ns} {name}" in conflict["message"]
    assert ("belongs to ScalingRun other" if how != "unlabelled" else "lacks this owner's labels") in (
        conflict["message"])
    assert cluster.status("mine")["message"].startswith(f"ChildConflict: {kind} {name}")
    assert [r for t, r, _ in cluster.events("mine") if t == "Warning"] == ["ChildConflict"], "said once"
    if kind == "MPIJob":
        assert cluster.condition("mine", "Preprocessed")["status"] == "True"
    assert cluster.status("mine")["phase"] in ("Pending", "Preprocessing")

    # The name is free again: the run makes its own child and says the conflict is over.
    {"ConfigMap": cluster.core.delete_namespaced_config_map, "Job": cluster.batch.delete_namespaced_job}.get(
        kind, lambda n, ns, **_: cluster.custom.delete_namespaced_custom_object("kubeflow.org", "v2beta1", ns,
                                                                                "mpijobs", n))(
        name, cluster.ns, propagation_policy="Background")
    wait_for(lambda: get(cluster, kind, name) is None, what=f"{kind} {name} gone")
    reconcile(cluster.ns, "mine")
    mine = get(cluster, kind, name)
    assert [r["uid"] for r in mine["metadata"]["ownerReferences"]] == [created["metadata"]["uid"]]
    assert cluster.condition("mine", "ChildConflict")["status"] == "False"


def test_a_labelled_orphan_configmap_is_adopted_and_brought_to_the_spec(cluster, tmp_path):
    created, run = new_run(cluster, tmp_path)
    stale = build_config_map(run, cluster.ns)
    stale["data"] = {"config.json": "{}", "left-over": "x"}
    put(cluster, stale)
    Reconciler(Kube(cluster.core.api_client), Config(**PULL_FROM_TEST_STORES))(cluster.ns, "mine")
    adopted = get(cluster, "ConfigMap", "mine-runconfig")
    assert [r["uid"] for r in adopted["metadata"]["ownerReferences"]] == [created["metadata"]["uid"]]
    assert adopted["data"] == build_config_map(run, cluster.ns)["data"]
    assert cluster.job("mine-preprocess") is not None
    assert cluster.condition("mine", "ChildConflict") == {}

    # Ours, and changed behind the run's back: brought back to the spec by the next look that ensures it.
    cluster.core.patch_namespaced_config_map("mine-runconfig", cluster.ns, {"data": {"config.json": "{}"}})
    cluster.batch.delete_namespaced_job("mine-preprocess", cluster.ns, propagation_policy="Background")
    Reconciler(Kube(cluster.core.api_client), Config(**PULL_FROM_TEST_STORES))(cluster.ns, "mine")
    assert get(cluster, "ConfigMap", "mine-runconfig")["data"] == build_config_map(run, cluster.ns)["data"]


def test_act_patches_only_what_the_run_controls_at_the_version_it_checked(cluster, tmp_path):
    """The check before every patch, on its own: nothing reaches an object that is not the run's."""
    created, run = new_run(cluster, tmp_path)
    kube = Kube(cluster.core.api_client)
    desired, owner = build_config_map(run, cluster.ns), other_owner(cluster, tmp_path)
    labels = identity_labels(desired)
    for how in ("unlabelled", "controlled by another"):
        held = foreign(desired, how, owner)
        held["metadata"]["name"] = f"held-{how[:4]}"
        held = put(cluster, held)
        for adopt in (False, True):
            with pytest.raises(act.NotControlled):
                act.patch_child(kube, created, Patch(held, {"data": {"x": "y"}}, adopt=adopt, labels=labels))
        assert get(cluster, "ConfigMap", held["metadata"]["name"])["metadata"]["resourceVersion"] == (
            held["metadata"]["resourceVersion"])
    # A labelled orphan may be adopted, but only at the version checked: one that moved on is refused (409).
    orphan = put(cluster, {**desired, "metadata": {**desired["metadata"], "name": "orphan"}})
    cluster.core.patch_namespaced_config_map("orphan", cluster.ns, {"data": {"moved": "on"}})
    with pytest.raises(ApiException) as refused:
        act.patch_child(kube, created, Patch(orphan, {"metadata": {"ownerReferences": [
            {"apiVersion": models.API_VERSION, "kind": models.KIND, "name": "mine", "uid": created["metadata"]["uid"],
             "controller": True}]}}, adopt=True, labels=labels))
    assert refused.value.status == 409
    assert not get(cluster, "ConfigMap", "orphan")["metadata"].get("ownerReferences")


def test_a_suspended_run_never_suspends_an_mpijob_that_is_not_its_own(cluster, tmp_path):
    created, run = new_run(cluster, tmp_path, suspend=True)
    dataset_there(run)
    theirs = build_mpijob(run, cluster.ns)
    theirs["spec"]["runPolicy"]["suspend"] = False
    held = put(cluster, foreign(theirs, "controlled by another", other_owner(cluster, tmp_path)))
    reconcile = Reconciler(Kube(cluster.core.api_client), Config(**PULL_FROM_TEST_STORES))
    reconcile(cluster.ns, "mine")
    reconcile(cluster.ns, "mine")
    now = cluster.mpijob("mine-train")
    assert now["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
    assert now["spec"]["runPolicy"]["suspend"] is False
    assert cluster.condition("mine", "ChildConflict")["status"] == "True"


class CountingKube(Kube):
    def __init__(self, api_client):
        super().__init__(api_client)
        self.run_reads = 0

    def get_run(self, namespace, name):
        self.run_reads += 1
        return super().get_run(namespace, name)


def test_a_stale_copy_of_the_run_costs_a_conflict_and_a_fresh_read_never_a_second_child(cluster, tmp_path):
    """The operator's copy of a run (cluster/latest.py) lags behind the API server: the look from it writes its
    pin at the version it saw, conflicts, and the next attempt reads the run anew."""
    created, _ = new_run(cluster, tmp_path)
    kube = CountingKube(cluster.core.api_client)
    latest = LatestObjects()
    reconcile = Reconciler(kube, Config(**PULL_FROM_TEST_STORES), latest=latest)
    reconcile(cluster.ns, "mine")
    assert kube.run_reads == 1  # no copy yet
    pinned = cluster.status("mine")[PINNED_FIELD]
    events = cluster.events("mine")
    job = cluster.job("mine-preprocess")
    assert job is not None

    reconcile(cluster.ns, "mine")
    assert kube.run_reads == 1, "the answer to its own status write was the copy"

    latest.runs.forget((cluster.ns, "mine"))
    latest.run_seen(None, created)  # as a watch far behind would have it: no status, no pin
    reconcile(cluster.ns, "mine")
    assert kube.run_reads == 2, "read anew after the conflict"
    assert cluster.status("mine")[PINNED_FIELD] == pinned
    assert cluster.job("mine-preprocess")["metadata"]["uid"] == job["metadata"]["uid"]
    assert cluster.events("mine") == events, "nothing said twice"


def test_a_copy_of_a_run_deleted_since_ends_the_look_without_an_error(cluster, tmp_path):
    """The copy still shows a run the API server no longer has (its DELETED event not come yet): the look's write
    gets a 404, and the next attempt reads the run anew, finds none and stops, with no error for kopf to log."""
    created, _ = new_run(cluster, tmp_path)
    kube = CountingKube(cluster.core.api_client)
    latest = LatestObjects()
    reconcile = Reconciler(kube, Config(**PULL_FROM_TEST_STORES), latest=latest)
    reconcile(cluster.ns, "mine")
    cluster.delete_run("mine")
    latest.runs.forget((cluster.ns, "mine"))
    latest.run_seen(None, created)  # as before its first look: the look writes its pin, at once
    assert reconcile(cluster.ns, "mine") is None
    assert kube.run_reads == 2, "read anew after the 404"

