"""The test-only MPIJob controller against a real kube-apiserver 1.20 (tests/conftest.py).

The controller runs as the host process it can be (`controller.py --kubeconfig`), authenticated as
the ServiceAccount that deploy.py renders and bound to deploy.py's ClusterRole, so every test also
proves that RBAC is enough. The API server has no kubelet, scheduler or Job controller
(KCM_JOB_CONTROLLER=0), so the tests play them: they patch pod and Job status, and create the
launcher Job's pod.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import yaml

from tests.e2e.mpijob_controller import controller as stand_in
from tests.support.apiserver import free_port
from tests.e2e.mpijob_controller import deploy

CONTROLLER = Path(stand_in.__file__)
TIMEOUT = 30  # the machine is small and shared
SSH_PATH = "/home/mpiuser/.ssh"

k8s = pytest.mark.k8s


def now() -> str:
    return stand_in.now_rfc3339()


class Cluster:
    """Raw JSON access to the test namespace, and the parts of kubelet and Job controller the tests play."""

    def __init__(self, api_client, namespace: str, log_path: Path):
        self.api = stand_in.Api(api_client)
        self.namespace = namespace
        self.log_path = log_path

    # --- reads and waits ---

    def get(self, kind: str, name: str) -> Optional[dict]:
        return self.api.get(stand_in.object_path(kind, self.namespace, name))

    def mpijob(self, name: str) -> dict:
        return self.api.get(stand_in.mpijob_path(self.namespace, name))

    def pods(self, selector: str) -> list[dict]:
        return self.api.request("GET", stand_in.object_path("Pod", self.namespace),
                                query={"labelSelector": selector})["items"]

    def event_reasons(self, name: str) -> list[str]:
        events = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/events",
                                  query={"fieldSelector": f"involvedObject.name={name}"})["items"]
        return [e["reason"] for e in events]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait(self, probe: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            time.sleep(0.2)
        pytest.fail(f"not {what} within {timeout:.0f} s; controller log:\n{self.log()[-4000:]}", pytrace=False)

    def wait_object(self, kind: str, name: str) -> dict:
        return self.wait(lambda: self.get(kind, name), f"{kind} {name} created")

    def wait_condition(self, name: str, ctype: str, status: str = "True") -> dict:
        def probe():
            job = self.mpijob(name)
            condition = stand_in.find_condition(job.get("status") or {}, ctype)
            return job if condition and condition["status"] == status else None

        return self.wait(probe, f"MPIJob {name} {ctype}={status}")

    def wait_passes(self, passes: int = 2) -> None:
        """Lets the controller resync (every 2 s) at least `passes` times: 'nothing happens' means something."""
        time.sleep(2 * passes + 0.5)

    # --- writes ---

    def create_mpijob(self, name: str, workers: int = 2, run_policy: Optional[dict] = None, launchers: int = 1,
                      **spec: Any) -> dict:
        def template(role: str, command: Optional[list[str]]) -> dict:
            container: dict[str, Any] = {"name": role, "image": "trainer:e2e", "env": [{"name": "ROLE", "value": role}]}
            if command:
                container["command"] = command
            return {"metadata": {"labels": {"scalingrun.dev/run": name}, "annotations": {"note": role}},
                    "spec": {"automountServiceAccountToken": False, "containers": [container]}}

        body = {
            "apiVersion": stand_in.API_VERSION, "kind": "MPIJob",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "slotsPerWorker": 2,
                "sshAuthMountPath": SSH_PATH,
                "runPolicy": {"cleanPodPolicy": "Running"} if run_policy is None else run_policy,
                "mpiReplicaSpecs": {
                    "Launcher": {"replicas": launchers, "template": template("launcher", ["mpirun", "hostname"])},
                    "Worker": {"replicas": workers, "template": template("worker", None)},
                },
                **spec,
            },
        }
        return self.api.create(stand_in.mpijob_path(self.namespace, ""), body)

    def patch_mpijob_spec(self, name: str, spec: dict) -> None:
        self.api.merge_patch(stand_in.mpijob_path(self.namespace, name), {"spec": spec})

    def set_pod(self, name: str, phase: str, ready: bool = False, reason: str = "", message: str = "") -> None:
        """Plays the kubelet: the pod's phase and Ready condition."""
        status: dict[str, Any] = {"phase": phase, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now()}]}
        if reason:
            status.update(reason=reason, message=message)
        self.api.merge_patch(stand_in.object_path("Pod", self.namespace, name) + "/status", {"status": status})

    def start_launcher_pod(self, job_name: str, suffix: str = "a1b2c", phase: str = "Running",
                           reason: str = "", message: str = "") -> dict:
        """Plays the Job controller: a pod from the launcher Job's template, controlled by the Job."""
        job = self.wait_object("Job", job_name)
        template = job["spec"]["template"]
        pod = self.api.create(stand_in.object_path("Pod", self.namespace), {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job_name}-{suffix}", "labels": template["metadata"]["labels"],
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                              "uid": job["metadata"]["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": template["spec"]})
        self.set_pod(pod["metadata"]["name"], phase, ready=phase == "Running", reason=reason, message=message)
        return pod

    def finish_job(self, job_name: str, condition: str, reason: str = "", message: str = "") -> dict:
        """Plays the Job controller: Complete or Failed."""
        stamp = now()
        status: dict[str, Any] = {"startTime": stamp, "conditions": [
            {"type": condition, "status": "True", "lastProbeTime": stamp, "lastTransitionTime": stamp,
             **({"reason": reason} if reason else {}), **({"message": message} if message else {})}]}
        if condition == "Complete":
            status.update(succeeded=1, completionTime=stamp)
        else:
            status.update(failed=3)
        return self.api.merge_patch(stand_in.object_path("Job", self.namespace, job_name) + "/status",
                                    {"status": status})

    def run_workers(self, job: str, count: int = 2, ready: bool = True) -> None:
        for i in range(count):
            self.wait_object("Pod", f"{job}-worker-{i}")
            self.set_pod(f"{job}-worker-{i}", "Running", ready=ready)


# --- the controller, authenticated as deploy.py's ServiceAccount ---------------------------------------------


KIND_COLLECTIONS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
}


def create_documents(api: stand_in.Api, documents: list[dict], namespace: str, dry_run: bool = False) -> list[dict]:
    created = []
    for doc in documents:
        path = KIND_COLLECTIONS[doc["kind"]].format(ns=namespace)
        created.append(api.create(path, doc, query={"dryRun": "All"} if dry_run else None))
    return created


def service_account_kubeconfig(api: stand_in.Api, admin_kubeconfig: str, namespace: str, account: str,
                               path: Path) -> Path:
    """A kubeconfig with the ServiceAccount's token (1.20: the token controller's Secret)."""
    def token_secret():
        sa = api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}")
        return (sa.get("secrets") or [{}])[0].get("name")

    deadline = time.monotonic() + TIMEOUT
    while not token_secret():
        assert time.monotonic() < deadline, f"no token Secret for ServiceAccount {account}"
        time.sleep(0.2)
    secret = api.get(f"/api/v1/namespaces/{namespace}/secrets/{token_secret()}")
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [cluster],
        "users": [{"name": account, "user": {"token": base64.b64decode(secret["data"]["token"]).decode()}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": account}}],
    }))
    return path


@pytest.fixture
def cluster(kubeconfig, api_client, namespace, mpijob_crd, tmp_path):
    api = stand_in.Api(api_client)
    name = f"mpijob-ctl-{namespace}"
    documents = deploy.manifests(image="operator:e2e", namespace=namespace, name=name)
    rbac = [d for d in documents if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    create_documents(api, rbac, namespace)
    sa_kubeconfig = service_account_kubeconfig(api, kubeconfig, namespace, name, tmp_path / "sa-kubeconfig")
    log_path = tmp_path / "controller.log"
    port = free_port()
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, str(CONTROLLER), "--kubeconfig", str(sa_kubeconfig), "--namespace", namespace,
             "--resync-seconds", "2", "--health-port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    harness = Cluster(api_client, namespace, log_path)

    def healthy():
        assert process.poll() is None, f"controller exited:\n{harness.log()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        harness.wait(healthy, "controller healthy")
        yield harness
        assert process.poll() is None, f"controller exited:\n{harness.log()}"
        assert "Forbidden" not in harness.log(), harness.log()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for kind, plural in (("ClusterRoleBinding", "clusterrolebindings"), ("ClusterRole", "clusterroles")):
            api.delete(f"/apis/rbac.authorization.k8s.io/v1/{plural}/{name}")


# --- tests ---------------------------------------------------------------------------------------------------


def owned_by(obj: dict, mpijob: dict) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return refs == [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": mpijob["metadata"]["name"],
                     "uid": mpijob["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]


def env_of(container: dict) -> dict[str, Optional[str]]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


@k8s
def test_creates_the_objects_upstream_creates(cluster):
    from cryptography.hazmat.primitives import serialization

    ns = cluster.namespace
    job = cluster.create_mpijob("pi", workers=2, run_policy={"backoffLimit": 3})

    service = cluster.wait_object("Service", "pi")
    assert owned_by(service, job)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"training.kubeflow.org/operator-name": "mpi-operator",
                                           "training.kubeflow.org/job-name": "pi"}
    assert not service["spec"].get("publishNotReadyAddresses")

    config = cluster.wait_object("ConfigMap", "pi-config")
    assert owned_by(config, job)
    assert config["data"]["hostfile"] == f"pi-worker-0.pi.{ns}.svc slots=2\npi-worker-1.pi.{ns}.svc slots=2\n"
    assert config["data"]["discover_hosts.sh"] == "#!/bin/sh\n"

    secret = cluster.wait_object("Secret", "pi-ssh")
    assert owned_by(secret, job)
    assert secret["type"] == "kubernetes.io/ssh-auth"
    private_pem = base64.b64decode(secret["data"]["ssh-privatekey"])
    public_line = base64.b64decode(secret["data"]["ssh-publickey"])
    assert private_pem.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    key = serialization.load_pem_private_key(private_pem, password=None)
    expected_public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert public_line == expected_public + b"\n" and public_line.startswith(b"ecdsa-sha2-nistp521 ")

    ssh_volume = {"name": "ssh-auth", "secret": {"secretName": "pi-ssh", "defaultMode": 0o644, "items": [
        {"key": "ssh-privatekey", "path": "id_rsa"}, {"key": "ssh-publickey", "path": "id_rsa.pub"},
        {"key": "ssh-publickey", "path": "authorized_keys"}]}}
    for i in range(2):
        pod = cluster.wait_object("Pod", f"pi-worker-{i}")
        assert owned_by(pod, job)
        assert pod["metadata"]["labels"] == {
            "scalingrun.dev/run": "pi", "training.kubeflow.org/operator-name": "mpi-operator",
            "training.kubeflow.org/job-name": "pi", "training.kubeflow.org/job-role": "worker",
            "training.kubeflow.org/replica-index": str(i)}
        assert pod["metadata"]["annotations"] == {"note": "worker"}
        spec = pod["spec"]
        assert (spec["hostname"], spec["subdomain"], spec["restartPolicy"]) == (f"pi-worker-{i}", "pi", "Never")
        assert spec["dnsConfig"]["searches"] == [f"pi.{ns}.svc.cluster.local"]
        container = spec["containers"][0]
        assert container["command"] == ["/usr/sbin/sshd", "-De"]  # no command in the template
        assert env_of(container) == {"ROLE": "worker", "K_MPI_JOB_ROLE": "worker"}
        assert container["volumeMounts"] == [{"name": "ssh-auth", "mountPath": SSH_PATH}]
        assert spec["volumes"] == [ssh_volume]  # the API server fills in 0644 for a non-root path

    launcher = cluster.wait_object("Job", "pi-launcher")  # AtStartup: at once, workers not Ready
    assert owned_by(launcher, job)
    assert launcher["metadata"]["labels"] == {"app": "pi"}
    assert launcher["spec"]["backoffLimit"] == 3
    template = launcher["spec"]["template"]
    assert {k: v for k, v in template["metadata"]["labels"].items() if k.startswith("training")} == {
        "training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/job-name": "pi",
        "training.kubeflow.org/job-role": "launcher"}
    spec = template["spec"]
    assert (spec["hostname"], spec["subdomain"], spec["restartPolicy"]) == ("pi-launcher", "pi", "OnFailure")
    container = spec["containers"][0]
    assert container["command"] == ["mpirun", "hostname"]
    assert env_of(container) == {
        "ROLE": "launcher", "K_MPI_JOB_ROLE": "launcher",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true", "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10", "OMPI_MCA_orte_set_default_slots": "2",
        "NVIDIA_VISIBLE_DEVICES": None, "NVIDIA_DRIVER_CAPABILITIES": None}
    assert container["volumeMounts"] == [{"name": "ssh-auth", "mountPath": SSH_PATH},
                                         {"name": "mpi-job-config", "mountPath": "/etc/mpi"}]
    assert spec["volumes"] == [ssh_volume, {"name": "mpi-job-config", "configMap": {
        "name": "pi-config", "defaultMode": 0o644, "items": [
            {"key": "hostfile", "path": "hostfile", "mode": 0o444},
            {"key": "discover_hosts.sh", "path": "discover_hosts.sh", "mode": 0o555}]}}]

    created = cluster.wait_condition("pi", "Created")
    condition = stand_in.find_condition(created["status"], "Created")
    assert (condition["reason"], condition["message"]) == ("MPIJobCreated", f"MPIJob {ns}/pi is created.")
    assert created["status"]["startTime"]
    assert stand_in.find_condition(created["status"], "Running") is None  # workers alone are not Running
    assert "MPIJobCreated" in cluster.event_reasons("pi")

    # discover_hosts.sh lists the workers Running now.
    cluster.set_pod("pi-worker-1", "Running", ready=True)
    cluster.wait(lambda: cluster.get("ConfigMap", "pi-config")["data"]["discover_hosts.sh"]
                 == f"#!/bin/sh\necho pi-worker-1.pi.{ns}.svc\n", "discover_hosts.sh updated")

    # Level-triggered and idempotent: further passes create nothing new.
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods("training.kubeflow.org/job-name=pi")}
    cluster.wait_passes()
    assert {p["metadata"]["name"]: p["metadata"]["uid"]
            for p in cluster.pods("training.kubeflow.org/job-name=pi")} == uids
    assert cluster.get("Secret", "pi-ssh")["data"] == secret["data"]  # the key is never regenerated


@k8s
def test_wait_for_workers_ready_delays_the_launcher(cluster):
    cluster.create_mpijob("wait", workers=2, launcherCreationPolicy="WaitForWorkersReady")
    cluster.run_workers("wait", ready=False)  # Running but not Ready
    cluster.set_pod("wait-worker-0", "Running", ready=True)
    cluster.wait(lambda: "1 of 2 workers Ready; launcher waits" in cluster.log(), "waiting logged")
    cluster.wait_passes()
    assert cluster.get("Job", "wait-launcher") is None

    cluster.set_pod("wait-worker-1", "Running", ready=True)
    launcher = cluster.wait_object("Job", "wait-launcher")
    assert launcher["spec"]["template"]["spec"]["hostname"] == "wait-launcher"


@k8s
@pytest.mark.parametrize("policy, kept", [("Running", {"done-worker-1"}), ("All", set()),
                                          (None, {"done-worker-0", "done-worker-1"})])
def test_running_then_succeeded_and_clean_pod_policy(cluster, policy, kept):
    """Running needs the launcher's pod Running too; Succeeded follows the launcher Job. cleanPodPolicy
    Running deletes the workers still running, All every worker, None (the v0.8 default) none."""
    # None: left out, so the controller's default applies.
    body = cluster.create_mpijob("done", workers=2, run_policy={"cleanPodPolicy": policy} if policy else {})
    cluster.run_workers("done")
    cluster.wait_passes(1)
    assert stand_in.find_condition(cluster.mpijob("done")["status"], "Running") is None  # no launcher pod yet

    cluster.set_pod("done-worker-1", "Pending")
    cluster.start_launcher_pod("done-launcher")
    cluster.wait_passes()
    assert stand_in.find_condition(cluster.mpijob("done")["status"], "Running") is None  # a worker is not Running
    cluster.set_pod("done-worker-1", "Running", ready=True)
    running = cluster.wait_condition("done", "Running")
    condition = stand_in.find_condition(running["status"], "Running")
    assert (condition["reason"], condition["message"]) == (
        "MPIJobRunning", f"MPIJob {cluster.namespace}/done is running.")
    assert running["status"]["replicaStatuses"] == {"Launcher": {"active": 1}, "Worker": {"active": 2}}

    cluster.set_pod("done-worker-1", "Succeeded")  # finished before the launcher did
    job = cluster.finish_job("done-launcher", "Complete")
    succeeded = cluster.wait_condition("done", "Succeeded")
    status = succeeded["status"]
    assert stand_in.find_condition(status, "Succeeded")["reason"] == "MPIJobSucceeded"
    assert stand_in.find_condition(status, "Running")["status"] == "False"
    assert status["completionTime"] == job["status"]["completionTime"]
    assert status["replicaStatuses"]["Launcher"] == {"succeeded": 1}
    assert "MPIJobSucceeded" in cluster.event_reasons("done")

    cluster.wait(lambda: {p["metadata"]["name"] for p in cluster.pods("training.kubeflow.org/job-role=worker")}
                 == kept, f"workers {sorted(kept)} left (cleanPodPolicy {policy})")
    cluster.wait_passes()  # finished: nothing is recreated
    assert {p["metadata"]["name"] for p in cluster.pods("training.kubeflow.org/job-role=worker")} == kept
    assert body["metadata"]["uid"] == cluster.mpijob("done")["metadata"]["uid"]


@k8s
def test_failed_launcher_job_fails_the_mpijob(cluster):
    cluster.create_mpijob("boom", workers=1, run_policy={"backoffLimit": 0, "cleanPodPolicy": "All"})
    assert cluster.wait_object("Job", "boom-launcher")["spec"]["backoffLimit"] == 0
    cluster.run_workers("boom", count=1)
    cluster.start_launcher_pod("boom-launcher", phase="Failed", reason="OOMKilled", message="out of memory")
    cluster.finish_job("boom-launcher", "Failed", reason="BackoffLimitExceeded",
                       message="Job has reached the specified backoff limit")
    failed = cluster.wait_condition("boom", "Failed")
    condition = stand_in.find_condition(failed["status"], "Failed")
    # Upstream appends the last failed launcher pod's reason and message.
    assert condition["reason"] == "BackoffLimitExceeded/OOMKilled"
    assert condition["message"] == "Job has reached the specified backoff limit: out of memory"
    assert failed["status"]["completionTime"]
    assert stand_in.find_condition(failed["status"], "Running")["status"] == "False"
    assert failed["status"]["replicaStatuses"]["Launcher"] == {"failed": 3}
    assert "BackoffLimitExceeded/OOMKilled" in cluster.event_reasons("boom")
    cluster.wait(lambda: not cluster.pods("training.kubeflow.org/job-role=worker"), "workers deleted")


@k8s
def test_deleted_worker_is_recreated_and_failed_worker_is_kept(cluster):
    cluster.create_mpijob("heal", workers=2)
    cluster.run_workers("heal")
    first = cluster.get("Pod", "heal-worker-1")
    cluster.api.delete(stand_in.object_path("Pod", cluster.namespace, "heal-worker-1"))
    again = cluster.wait(lambda: (p := cluster.get("Pod", "heal-worker-1"))
                         and p["metadata"]["uid"] != first["metadata"]["uid"] and p, "heal-worker-1 recreated")
    assert again["spec"]["hostname"] == "heal-worker-1"
    assert "created Pod" in cluster.log()

    # v0.8 recreates only missing workers: a Failed one stays, counted in replicaStatuses.
    failed_uid = cluster.get("Pod", "heal-worker-0")["metadata"]["uid"]
    cluster.set_pod("heal-worker-0", "Failed", reason="Error", message="sshd exited")
    cluster.wait(lambda: (cluster.mpijob("heal")["status"].get("replicaStatuses") or {}).get("Worker")
                 == {"failed": 1}, "Worker failed 1")
    cluster.wait_passes()
    assert cluster.get("Pod", "heal-worker-0")["metadata"]["uid"] == failed_uid
    assert not stand_in.condition_is_true(cluster.mpijob("heal")["status"], "Failed")

    # An evicted worker fails the MPIJob (MPIJobEvicted).
    cluster.set_pod("heal-worker-1", "Failed", reason="Evicted", message="node low on memory")
    failed = cluster.wait_condition("heal", "Failed")
    condition = stand_in.find_condition(failed["status"], "Failed")
    assert (condition["reason"], condition["message"]) == ("MPIJobEvicted", "1/2 workers are evicted")


@k8s
def test_suspend_and_resume(cluster):
    cluster.create_mpijob("nap", workers=2, run_policy={"suspend": True})
    suspended = cluster.wait_condition("nap", "Suspended")
    assert stand_in.find_condition(suspended["status"], "Suspended")["reason"] == "MPIJobSuspended"
    running = stand_in.find_condition(suspended["status"], "Running")
    assert (running["status"], running["reason"]) == ("False", "MPIJobSuspended")
    assert "startTime" not in suspended["status"]
    for kind, name in (("Service", "nap"), ("ConfigMap", "nap-config"), ("Secret", "nap-ssh")):
        assert cluster.get(kind, name), f"{kind} {name} exists while suspended"
    cluster.wait_passes()
    assert cluster.pods("training.kubeflow.org/job-name=nap") == []
    # 1.20 drops Job.spec.suspend: a launcher created now would run, so there is none.
    assert cluster.get("Job", "nap-launcher") is None
    assert "drops Job.spec.suspend" in cluster.log()

    cluster.patch_mpijob_spec("nap", {"runPolicy": {"suspend": False}})
    resumed = cluster.wait_condition("nap", "Suspended", "False")
    assert stand_in.find_condition(resumed["status"], "Suspended")["reason"] == "MPIJobResumed"
    assert resumed["status"]["startTime"]
    cluster.run_workers("nap")
    cluster.start_launcher_pod("nap-launcher")
    cluster.wait_condition("nap", "Running")

    # Suspending a running job deletes its workers and (without Job suspension) its launcher Job.
    cluster.patch_mpijob_spec("nap", {"runPolicy": {"suspend": True}})
    again = cluster.wait_condition("nap", "Suspended")
    assert stand_in.find_condition(again["status"], "Running")["status"] == "False"
    cluster.wait(lambda: not cluster.pods("training.kubeflow.org/job-role=worker"), "workers deleted")
    cluster.wait(lambda: cluster.get("Job", "nap-launcher") is None, "launcher Job deleted")
    assert events_include(cluster, "nap", {"MPIJobSuspended", "MPIJobResumed"})


def events_include(cluster: Cluster, name: str, reasons: set[str]) -> bool:
    return reasons <= set(cluster.event_reasons(name))


@k8s
def test_create_or_adopt(cluster):
    """An orphan with a child's name is adopted; one another controller owns is left alone, with an event."""
    ns = cluster.namespace
    cluster.api.create(stand_in.object_path("ConfigMap", ns), {
        "metadata": {"name": "mine-config"}, "data": {"hostfile": "stale\n"}})
    other = cluster.api.create(stand_in.object_path("ConfigMap", ns), {"metadata": {"name": "other"}})
    cluster.api.create(stand_in.object_path("Secret", ns), {
        "metadata": {"name": "theirs-ssh", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": other["metadata"]["uid"],
            "controller": True}]}, "data": {"x": "eA=="}})
    mine = cluster.create_mpijob("mine", workers=1)
    theirs = cluster.create_mpijob("theirs", workers=1)

    config = cluster.wait(lambda: (c := cluster.get("ConfigMap", "mine-config")) and owned_by(c, mine) and c,
                          "orphan ConfigMap adopted")
    cluster.wait(lambda: cluster.get("ConfigMap", "mine-config")["data"]["hostfile"]
                 == f"mine-worker-0.mine.{ns}.svc slots=2\n", "adopted ConfigMap brought up to date")
    assert config["metadata"]["uid"]
    cluster.wait_object("Job", "mine-launcher")

    cluster.wait(lambda: "ErrResourceExists" in cluster.event_reasons("theirs"), "ErrResourceExists event")
    assert cluster.get("Secret", "theirs-ssh")["data"] == {"x": "eA=="}
    assert cluster.get("Job", "theirs-launcher") is None
    assert cluster.get("Pod", "theirs-worker-0") is None
    assert theirs["metadata"]["uid"]


@k8s
def test_invalid_mpijob_gets_a_validation_event_and_nothing_else(cluster):
    cluster.create_mpijob("bad", workers=1, launchers=2)  # the CRD's schema allows it; v0.8 does not
    cluster.create_mpijob("good", workers=1)
    cluster.wait(lambda: "ValidationError" in cluster.event_reasons("bad") or None, "ValidationError event")
    cluster.wait_object("Job", "good-launcher")
    cluster.wait_passes()
    assert "spec.mpiReplicaSpecs[Launcher].replicas: Invalid value: 2: must be 1" in cluster.log()
    assert cluster.event_reasons("bad") == ["ValidationError"]  # once, not every pass
    assert not cluster.mpijob("bad").get("status")
    for kind, name in (("Service", "bad"), ("ConfigMap", "bad-config"), ("Secret", "bad-ssh"),
                       ("Job", "bad-launcher"), ("Pod", "bad-worker-0")):
        assert cluster.get(kind, name) is None


@k8s
def test_deploy_manifests_are_accepted_by_the_api_server(cluster):
    """The ConfigMap and Deployment pass the API server's validation (dry run; there is no kubelet here)."""
    documents = deploy.manifests(image="operator:e2e", namespace=cluster.namespace, name="dry")
    created = create_documents(cluster.api, [d for d in documents if d["kind"] in ("ConfigMap", "Deployment")],
                               cluster.namespace, dry_run=True)
    deployment = created[1]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert created[0]["data"]["controller.py"] == CONTROLLER.read_text()


def test_deploy_manifests_least_privilege():
    documents = {d["kind"]: d for d in deploy.manifests(image="operator:e2e", namespace="e2e")}
    assert set(documents) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment"}
    rules = documents["ClusterRole"]["rules"]
    assert all("*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"] for r in rules)
    secrets = [r for r in rules if "secrets" in r["resources"]]
    assert secrets and all(not {"list", "watch"} & set(r["verbs"]) for r in secrets)
    container = documents["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "operator:e2e" and container["imagePullPolicy"] == "IfNotPresent"
    assert container["resources"]["requests"] == {"cpu": "25m", "memory": "96Mi"}
    assert container["command"][:2] == ["python", "/opt/mpijob-controller/controller.py"]
    namespaced = {d["kind"]: d for d in deploy.manifests(image="x", namespace="e2e", watch_namespace="runs")}
    assert {"Role", "RoleBinding"} <= set(namespaced) and "ClusterRole" not in namespaced
    assert "--namespace=runs" in namespaced["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]
