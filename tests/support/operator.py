"""The operator as a subprocess against a real API server and S3 (SeaweedFS): the Operator process, a Cluster (a
namespace's API calls), a Bucket, runs and progress documents as the trainer writes them, the pod states the
kubelet would report, and the module-scoped operator and per-test namespace fixtures the integration tests share."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from scalingrun_api import models
from scalingrun_operator.builders.common import RUN_LABEL
from tests.support.apiserver import free_port


ROOT = Path(__file__).resolve().parents[2]


BUCKET = "scalingrun-operator"


SECRET = "s3-creds"


SERVED = "sro"  # namespaces sro-* are served by the module's operator


TIMEOUT = 90  # generous: the machine is small and shared


# A reconciler in the test's process reads the tests' stores (pull mode, an explicit choice since push is the
# default); they are on 127.0.0.1 and their outputs in local folders, both refused by an operator's defaults.
PULL_FROM_TEST_STORES = {"pull_documents": True, "allow_any_storage_endpoint": True, "allow_local_paths": True}


class Operator:
    """`scalingrun operator` in a subprocess, with its log kept for failure messages."""

    def __init__(self, kubeconfig: str, log_path: Path, namespaces: list[str], *extra: str,
                 env: Optional[dict[str, str]] = None):
        self.kubeconfig, self.log_path, self.namespaces, self.extra = kubeconfig, log_path, namespaces, extra
        self.env = env or {}
        self.liveness_port = free_port()
        self.metrics_port = free_port()
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> "Operator":
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(KUBECONFIG=self.kubeconfig, SCALINGRUN_POLL_INTERVAL_SECONDS="1",
                   SCALINGRUN_RECHECK_INTERVAL_SECONDS="1",
                   SCALINGRUN_COMPLETION_GRACE_SECONDS="5", PYTHONUNBUFFERED="1",
                   # The tests' stores are on 127.0.0.1 and their runs' outputs in local folders: both refused by
                   # default (api/endpoints.py); tests of those defaults set these back.
                   SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT="true", SCALINGRUN_ALLOW_LOCAL_PATHS="true")
        if "SCALINGRUN_STATUS_PORT_NUMBER" not in self.env:
            env["SCALINGRUN_PULL_DOCUMENTS"] = "true"  # the tests that push say so; the others read the store
        env.update(self.env)
        args = [sys.executable, "-m", "scalingrun_operator.cli", "operator", "--log-format", "plain",
                "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
                "--metrics-port", str(self.metrics_port), *self.extra]
        for namespace in self.namespaces:
            args += ["--namespace", namespace]
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_for(lambda: self.healthy(), what="operator liveness endpoint", operator=self)
        patterns = [n for n in self.namespaces if "*" in n]
        if patterns and "--peering" not in self.extra:
            self.wait_serving_new_namespaces(patterns[0].replace("*", "probe"))
        return self

    def wait_serving_new_namespaces(self, prefix: str) -> None:
        """Waits until the operator serves namespaces created from now on: a probe namespace gets a run, and the
        run a status from the operator.

        kopf 1.45 lists the namespaces, then starts its watch of them with a second listing that it ignores: a
        namespace created between the two is not served until it changes. Live, kopf answers liveness while that
        happens, so a test's namespace made just after start-up could fall in the gap (seconds wide on a busy
        machine) and its run was never reconciled. A changed namespace is noticed: the probe's is labelled anew
        until its run has a status."""
        from kubernetes import config

        api = config.new_client_from_config(config_file=self.kubeconfig)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": name}})
        try:
            custom.create_namespaced_custom_object(models.GROUP, models.VERSION, name, models.PLURAL, {
                "apiVersion": models.API_VERSION, "kind": models.KIND, "metadata": {"name": "probe"},
                "spec": {"dataset": {"source": "/nonexistent/raw", "output": "/nonexistent/data", "imageSize": 32},
                         "workers": {"replicas": 1, "gpusPerWorker": 0}}})
            touches = [0]

            def served() -> bool:
                run = custom.get_namespaced_custom_object(models.GROUP, models.VERSION, name, models.PLURAL, "probe")
                if run.get("status"):
                    return True
                touches[0] += 1
                if touches[0] % 10 == 0:  # every ~3 s: an event the watch, once it runs, cannot miss
                    core.patch_namespace(name, {"metadata": {"labels": {"scalingrun.dev/probe": str(touches[0])}}})
                return False

            wait_for(served, what=f"the operator to serve a new namespace ({name})", operator=self)
        finally:
            core.delete_namespace(name)

    def healthy(self) -> bool:
        assert self.process and self.process.poll() is None, f"operator exited:\n{self.log_tail()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def kill(self) -> None:
        """SIGKILL: no cleanup, no last patches, as when a node dies."""
        assert self.process
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def wait_for(check: Callable[[], Any], what: str, timeout: float = TIMEOUT, operator: Optional[Operator] = None,
             interval: float = 0.3, describe: Optional[Callable[[], Any]] = None) -> Any:
    """Polls until `check()` is truthy; fails with the last value (or `describe()`) and the operator's log."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    tail = operator.log_tail() if operator else ""
    if describe:
        last = describe()
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}\n--- operator log ---\n{tail}")


class Cluster:
    """Typed shortcuts over the API for one namespace."""

    def __init__(self, api_client, namespace: str):
        self.ns = namespace
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def create_run(self, body: dict) -> dict:
        return self.custom.create_namespaced_custom_object(models.GROUP, models.VERSION, self.ns, models.PLURAL, body)

    def run(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(models.GROUP, models.VERSION, self.ns, models.PLURAL, name)

    def patch_run(self, name: str, patch: dict) -> dict:
        return self.custom.patch_namespaced_custom_object(models.GROUP, models.VERSION, self.ns, models.PLURAL,
                                                          name, patch)

    def delete_run(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(models.GROUP, models.VERSION, self.ns, models.PLURAL, name)

    def status(self, name: str) -> dict:
        return self.run(name).get("status") or {}

    def condition(self, name: str, type_: str) -> dict:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == type_), {})

    def phase_is(self, name: str, phase: str) -> Callable[[], Any]:
        return lambda: self.status(name).get("phase") == phase and self.status(name)

    def job(self, name: str) -> Optional[dict]:
        try:
            return self.batch.api_client.sanitize_for_serialization(self.batch.read_namespaced_job(name, self.ns))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def mpijob(self, name: str) -> Optional[dict]:
        try:
            return self.custom.get_namespaced_custom_object("kubeflow.org", "v2beta1", self.ns, "mpijobs", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def children(self, run: str) -> dict[str, list[str]]:
        """Names of every object labelled as a child of `run`, by kind."""
        selector = f"{RUN_LABEL}={run}"
        return {
            "ConfigMap": [o.metadata.name for o in self.core.list_namespaced_config_map(
                self.ns, label_selector=selector).items],
            "Job": [o.metadata.name for o in self.batch.list_namespaced_job(self.ns, label_selector=selector).items],
            "MPIJob": [o["metadata"]["name"] for o in self.custom.list_namespaced_custom_object(
                "kubeflow.org", "v2beta1", self.ns, "mpijobs", label_selector=selector)["items"]],
        }

    def complete_job(self, name: str, succeeded: int) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.batch.patch_namespaced_job_status(name, self.ns, {"status": {
            "startTime": now, "completionTime": now, "succeeded": succeeded,
            "conditions": [{"type": "Complete", "status": "True", "lastProbeTime": now, "lastTransitionTime": now}]}})

    def fail_job(self, name: str, succeeded: int, failed: int, reason: str, message: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.batch.patch_namespaced_job_status(name, self.ns, {"status": {
            "startTime": now, "succeeded": succeeded, "failed": failed,
            "conditions": [{"type": "Failed", "status": "True", "reason": reason, "message": message,
                            "lastProbeTime": now, "lastTransitionTime": now}]}})

    def set_mpijob_condition(self, name: str, type_: str, reason: str, message: str) -> None:
        """What the mpi-operator would write: Created, Running, then Succeeded or Failed."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [{"type": "Created", "status": "True", "reason": "MPIJobCreated", "message": "created",
                       "lastTransitionTime": now, "lastUpdateTime": now}]
        if type_ != "Created":
            conditions.append({"type": "Running", "status": "True" if type_ == "Running" else "False",
                               "reason": "MPIJobRunning", "message": "running",
                               "lastTransitionTime": now, "lastUpdateTime": now})
        if type_ in ("Succeeded", "Failed"):
            conditions.append({"type": type_, "status": "True", "reason": reason, "message": message,
                               "lastTransitionTime": now, "lastUpdateTime": now})
        status: dict[str, Any] = {"conditions": conditions, "startTime": now}
        if type_ in ("Succeeded", "Failed"):
            status["completionTime"] = now
        self.custom.patch_namespaced_custom_object_status("kubeflow.org", "v2beta1", self.ns, "mpijobs", name,
                                                          {"status": status})

    # --- pods: no kubelet or scheduler runs here, so the tests write what they would ---

    def create_pod(self, name: str, labels: dict[str, str], container: str, image: str, timeout: float = 30,
                   owner: Optional[dict] = None) -> dict:
        """A pod as its controller (Job controller, MPI operator) would create it from a template's labels; with
        `owner` (the Job or MPIJob), controlled by it, as they make it (a pod's push is taken by its owner chain)."""
        refs = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
                 "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}] if owner else []
        body = {"metadata": {"name": name, "labels": labels, "ownerReferences": refs},
                "spec": {"automountServiceAccountToken": False, "containers": [{"name": container, "image": image}]}}
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.core.api_client.sanitize_for_serialization(self.core.create_namespaced_pod(self.ns, body))
            except ApiException as exc:
                # The controller manager creates the namespace's default ServiceAccount a moment after it.
                if exc.status == 403 and "serviceaccount" in str(exc.body).lower() and time.monotonic() < deadline:
                    time.sleep(0.3)
                    continue
                raise

    def set_pod_status(self, name: str, phase: str = "Pending", containers: Optional[list[dict]] = None,
                       conditions: Optional[list[dict]] = None, **extra: Any) -> None:
        """Replaces the pod's status, as the kubelet and the scheduler write it."""
        pod = json.loads(self.core.read_namespaced_pod(name, self.ns, _preload_content=False).data)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        pod["status"] = {"phase": phase, "conditions": [{"lastTransitionTime": now, **c} for c in conditions or []],
                         "containerStatuses": [{"ready": False, "restartCount": 0, "image": "", "imageID": "", **c}
                                               for c in containers or []], **extra}
        self.core.replace_namespaced_pod_status(name, self.ns, pod)

    def delete_pod(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)

    def events(self, name: str) -> list[tuple[str, str, str]]:
        items = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        items.sort(key=lambda e: int(e.metadata.resource_version))  # timestamps have 1 s resolution
        return [(e.type, e.reason, e.message) for e in items]

    def wait_events(self, name: str, check: Callable[[list], Any], operator: Operator) -> None:
        """Events are posted just after the status they report: poll for them too."""
        events: list = []

        def seen() -> bool:
            events[:] = self.events(name)
            return bool(check(events))

        wait_for(seen, what=f"events of {name}", timeout=30, operator=operator, describe=lambda: events)


class Bucket:
    """The tests' own S3 client (botocore, like the operator's), to write what Jobs and trainers write."""

    def __init__(self, server):
        import botocore.session
        from botocore.config import Config

        self.client = botocore.session.get_session().create_client(
            "s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id=server.access_key,
            aws_secret_access_key=server.secret_key, config=Config(s3={"addressing_style": "path"}))

    @classmethod
    def created(cls, server, name: str) -> "Bucket":
        """A client of `server` whose bucket `name` exists (created unless it does)."""
        bucket = cls(server)
        try:
            bucket.client.create_bucket(Bucket=name)
        except (bucket.client.exceptions.BucketAlreadyOwnedByYou, bucket.client.exceptions.BucketAlreadyExists):
            pass
        return bucket

    @staticmethod
    def _split(uri: str) -> tuple[str, str]:
        bucket, _, key = uri[len("s3://"):].partition("/")
        return bucket, key

    def put(self, uri: str, data: bytes) -> None:
        bucket, key = self._split(uri)
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def put_json(self, uri: str, document: dict) -> None:
        self.put(uri, json.dumps(document).encode())

    def get_json(self, uri: str) -> dict:
        bucket, key = self._split(uri)
        return json.loads(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())


def read_json(server, uri: str) -> dict:
    """One GetObject (Bucket.get_json). pyarrow's stream asks the object's size and then reads that range, so a
    document rewritten in between (the trainer rewrites progress.json and heartbeat.json as it trains) came back
    cut, and did not parse (CI runs)."""
    store = _STORES.get(server.endpoint)
    if store is None:
        store = _STORES[server.endpoint] = Bucket(server)  # a client once per server: making one takes tens of ms
    return store.get_json(uri)


_STORES: dict[str, Bucket] = {}  # endpoint -> the tests' client of it


def new_run(namespace: str, name: str, server, **sections: dict) -> dict:
    prefix = f"s3://{BUCKET}/{namespace}"
    spec: dict[str, Any] = {
        "storage": {"endpoint": server.endpoint, "credentialsSecret": SECRET},
        "dataset": {"source": f"{prefix}/raw", "output": f"{prefix}/{name}/data", "imageSize": 32,
                    "preprocessing": {"parallelism": 2}},
        "training": {"maxEpochs": 5},
        "workers": {"replicas": 2, "gpusPerWorker": 0},
    }
    for section, values in sections.items():
        spec.setdefault(section, {}).update(values)
    return {"apiVersion": models.API_VERSION, "kind": models.KIND, "metadata": {"name": name}, "spec": spec}


def manifest_for(run: dict, fingerprint: str = "f" * 16, train: int = 40, validation: int = 5,
                 skipped: int = 1) -> dict:
    """The manifest the preprocessing would write for `run` (as admitted, defaults filled in),
    with its parameters from the trainer's own Params: the two packages must agree."""
    from scalingrun_trainer.preprocess.source import Params

    d, w = run["spec"]["dataset"], run["spec"]["workers"]
    params = Params(source=d["source"], output=d["output"], image_size=d["imageSize"],
                    validation_fraction=d["validationFraction"], sample_fraction=d["sampleFraction"],
                    seed=d["seed"], max_readers=w["replicas"] * max(w["gpusPerWorker"], 1))
    return {"fingerprint": fingerprint, "parameters": params.dataset_parameters(), "source": d["source"],
            "classes": ["a", "b", "c"], "sourceFiles": train + validation + skipped, "shards": 2,
            "written": {"train": train, "validation": validation}, "skipped": skipped,
            "skippedFiles": [{"path": "a/broken.jpg", "reason": "cannot identify image file"}][:skipped],
            "files": {"train": ["train/part-00000-of-00002.parquet"],
                      "validation": ["validation/part-00000-of-00002.parquet"]}}


def progress_uri(run: dict) -> str:
    return f"{run['spec']['dataset']['output']}/runs/{run['metadata']['name']}/progress.json"


def progress(state: str, epoch: int, **extra: Any) -> dict:
    return {"state": state, "epoch": epoch, "maxEpochs": 5,
            "metrics": {"loss": 0.5, "accuracy": 0.8, "val_loss": 0.6, "val_accuracy": 0.8125},
            "bestEpoch": epoch, "bestMetrics": {"val_loss": 0.6, "val_accuracy": 0.8125},
            "imagesPerSecond": 123.4, "elapsedSeconds": 10.0, "learningRate": 0.002, "effectiveBatchSize": 64,
            "processes": 2, "modelUri": None, "error": None, **extra}


def reach_training(cluster: Cluster, bucket: Bucket, name: str, operator: Operator) -> dict:
    """Drives a created run through preprocessing (manifest + Job Complete) to Training."""
    run = cluster.run(name)
    job = wait_for(lambda: cluster.job(f"{name}-preprocess"), what="the preprocessing Job", operator=operator)
    bucket.put_json(f"{run['spec']['dataset']['output']}/_manifest.json", manifest_for(run))
    cluster.complete_job(job["metadata"]["name"], succeeded=2)
    return wait_for(cluster.phase_is(name, "Training"), what=f"{name} Training", operator=operator)


def leave_manifest_in_a_pod(cluster: Cluster, job: dict, run: dict) -> None:
    """The preprocessing Job's pod as it ends for an operator with its status endpoint on: succeeded, with the
    dataset's manifest in its termination message (the trainer's form); nothing is written to storage."""
    from scalingrun_api.manifest import DatasetManifest, manifest_termination_message

    pod = f"{job['metadata']['name']}-0"
    cluster.create_pod(pod, preprocess_pod_labels(job), "preprocess", "trainer:test",
                       owner={"apiVersion": "batch/v1", "kind": "Job", **job})
    message = manifest_termination_message(DatasetManifest.read(manifest_for(run)))
    cluster.set_pod_status(pod, phase="Succeeded", containers=[{"name": "preprocess", "state": {"terminated": {
        "exitCode": 0, "reason": "Completed", "message": message, "startedAt": _now(), "finishedAt": _now()}}}])


def finish_preprocessing_by_pod(cluster: Cluster, name: str, operator: Operator) -> dict:
    """Drives a created run through preprocessing to Training as an operator with its status endpoint on sees it:
    the Job's pod leaves the manifest (leave_manifest_in_a_pod), the Job Complete."""
    job = wait_for(lambda: cluster.job(f"{name}-preprocess"), what="the preprocessing Job", operator=operator)
    leave_manifest_in_a_pod(cluster, job, cluster.run(name))
    cluster.complete_job(job["metadata"]["name"], succeeded=2)
    return wait_for(cluster.phase_is(name, "Training"), what=f"{name} Training", operator=operator)


def status_pusher(cluster: Cluster, pod: dict, run: str, directory: Path):
    """The trainer's client (scalingrun_trainer.core.status_push) as `pod` has it: the URL and CA from the
    namespace's ConfigMap that the operator writes, and a token bound to the pod (TokenRequest, as the kubelet
    projects it)."""
    from scalingrun_api.status_push import CA_FILE, STATUS_AUDIENCE, STATUS_CONFIG_MAP, URL_FILE, push_path
    from scalingrun_trainer.core.status_push import StatusPusher

    token = cluster.core.create_namespaced_service_account_token("default", cluster.ns, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[STATUS_AUDIENCE], expiration_seconds=600,
                                       bound_object_ref=client.V1BoundObjectReference(
                                           kind="Pod", api_version="v1", name=pod["metadata"]["name"],
                                           uid=pod["metadata"]["uid"])))).status.token
    config_map = cluster.core.read_namespaced_config_map(STATUS_CONFIG_MAP, cluster.ns).data
    (directory / "token").write_text(token)
    (directory / CA_FILE).write_text(config_map[CA_FILE])
    return StatusPusher(config_map[URL_FILE], push_path(cluster.ns, run, "").rstrip("/"), directory / CA_FILE,
                        directory / "token")


@pytest.fixture(scope="module")
def bucket(s3_server) -> Bucket:
    return Bucket.created(s3_server, BUCKET)


def new_namespace(api_client, s3_server, request, prefix: str) -> str:
    """A fresh namespace `<prefix>-<test>-<random>` holding the S3 Secret the runs name."""
    core = client.CoreV1Api(api_client)
    slug = "".join(ch for ch in request.node.name.lower().replace("_", "-") if ch.isalnum() or ch == "-")
    name = f"{prefix}-{slug.removeprefix('test-')[:30].strip('-')}-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name}})
    core.create_namespaced_secret(name, {"metadata": {"name": SECRET}, "stringData": {
        "AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}})
    return name


@contextlib.contextmanager
def namespace_cluster(api_client, s3_server, request, prefix: str) -> Iterator[Cluster]:
    """A fresh namespace (new_namespace) as a Cluster, deleted afterwards: each module's per-test fixture."""
    name = new_namespace(api_client, s3_server, request, prefix)
    yield Cluster(api_client, name)
    client.CoreV1Api(api_client).delete_namespace(name)


@contextlib.contextmanager
def started(operator: Operator) -> Iterator[Operator]:
    """The operator running until the block ends: each module's module-scoped operator fixture."""
    operator.start()
    yield operator
    operator.stop()


def served(prefix: str, sweeps: bool = False,
           env: Optional[Callable[[Any], dict[str, str]]] = None) -> tuple[Any, Any]:
    """A module's two fixtures: `operator`, one operator for the module serving the `<prefix>-*` namespaces (and
    only those), and `cluster`, a fresh such namespace per test. `sweeps`: the ScalingSweep CRD is installed too;
    `env(s3_server)`: the operator's environment variables. A module takes them as
    `operator, cluster = served("abc")`."""
    crd = "scalingsweep_crd" if sweeps else "scalingrun_crd"

    @pytest.fixture(scope="module")
    def operator(kubeconfig, mpijob_crd, tmp_path_factory, request) -> Iterator[Operator]:
        request.getfixturevalue(crd)
        log = tmp_path_factory.mktemp(f"{prefix}-operator") / "operator.log"
        variables = env(request.getfixturevalue("s3_server")) if env else None
        with started(Operator(kubeconfig, log, [f"{prefix}-*"], "--standalone", env=variables)) as op:
            yield op

    @pytest.fixture
    def cluster(api_client, s3_server, request, mpijob_crd) -> Iterator[Cluster]:
        request.getfixturevalue(crd)
        with namespace_cluster(api_client, s3_server, request, prefix) as made:
            yield made

    return operator, cluster


operator, cluster = served(SERVED)  # the sro-* namespaces


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def preprocess_pod_labels(job: dict) -> dict[str, str]:
    """What the Job controller puts on its pods: the template's labels and job-name."""
    return {**job["spec"]["template"]["metadata"]["labels"], "job-name": job["metadata"]["name"]}


def mpijob_pod_labels(mpijob: dict, role: str) -> dict[str, str]:
    """What the MPI operator (v0.8) puts on its pods: the template's labels and its own."""
    spec = mpijob["spec"]["mpiReplicaSpecs"]["Launcher" if role == "launcher" else "Worker"]
    return {**spec["template"]["metadata"]["labels"], "training.kubeflow.org/job-name": mpijob["metadata"]["name"],
            "training.kubeflow.org/job-role": role}


def running(container: str, restarts: int = 0, last_exit: Optional[int] = None) -> list[dict]:
    status: dict[str, Any] = {"name": container, "ready": True, "restartCount": restarts,
                              "state": {"running": {"startedAt": _now()}}}
    if last_exit is not None:
        status["lastState"] = {"terminated": {"exitCode": last_exit, "reason": "Error", "startedAt": _now(),
                                              "finishedAt": _now()}}
    return [status]


def waiting(container: str, reason: str, message: str) -> list[dict]:
    return [{"name": container, "state": {"waiting": {"reason": reason, "message": message}}}]


SCHEDULED = [{"type": "PodScheduled", "status": "True"}]


def start_training_pod(cluster: "Cluster", mpijob: dict, role: str, name: str) -> None:
    """A launcher or worker pod as the MPI operator makes it (labels, the template's image), scheduled and Running."""
    spec = mpijob["spec"]["mpiReplicaSpecs"]["Launcher" if role == "launcher" else "Worker"]
    image = spec["template"]["spec"]["containers"][0]["image"]
    cluster.create_pod(name, mpijob_pod_labels(mpijob, role), role, image)
    cluster.set_pod_status(name, phase="Running", containers=running(role), conditions=SCHEDULED)


def mpijob_controller(kubeconfig: str, namespace: str, log: Path) -> subprocess.Popen:
    """The stand-in MPIJob controller (tests/e2e/mpijob_controller, mpi-operator v0.8's) for one namespace, as the e2e
    runs it in its cluster."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, str(ROOT / "tests/e2e/mpijob_controller/controller.py"),
                                 "--kubeconfig", kubeconfig, "--namespace", namespace, "--resync-seconds", "5"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def controller_for(kubeconfig, tmp_path) -> Iterator[Callable[[str], subprocess.Popen]]:
    """Starts the stand-in MPIJob controller for a namespace (controller_for(ns)); stopped after the test."""
    started: list[subprocess.Popen] = []

    def start(namespace: str) -> subprocess.Popen:
        log = tmp_path / "mpijob-controller.log"
        started.append(mpijob_controller(kubeconfig, namespace, log))
        wait_for(lambda: log.exists() and "starting: watching MPIJobs" in log.read_text(), what="the MPIJob controller",
                 describe=lambda: log.read_text() if log.exists() else "no log")
        return started[-1]

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=30)
