#!/usr/bin/env python3
"""A test-only MPIJob controller: the e2e's stand-in for Kubeflow's mpi-operator (v0.8 behaviour).

No MPI operator can be installed where the e2e runs, so this controller plays its part for
MPIJob kubeflow.org/v2beta1: worker pods, the headless Service, the hostfile ConfigMap, the ssh
Secret, the launcher batch/v1 Job, and the MPIJob's status (conditions, replicaStatuses, times).
Objects, names, labels, env, volumes and condition reasons follow mpi-operator v0.8 (see
../shared/mpi-operator/README.md). It is never shipped in the chart or the images.

Every MPIJob, pod or launcher Job event queues its MPIJob; one worker thread reconciles from what
the API server says now (no cache), so each pass is level-triggered and idempotent: deterministic
names, owner references on everything, create-or-adopt. Services, ConfigMaps and Secrets are not
watched (that would need list/watch on every Secret in the cluster): a periodic resync repairs them.

Dependencies: the standard library, `kubernetes` (configuration and authentication only; objects
are raw JSON dicts) and `cryptography` (the ssh key), all in the operator image.

    python tests/e2e/mpijob_controller/controller.py --kubeconfig PATH [--namespace NS]
"""

from __future__ import annotations

import argparse
import base64
import copy
import heapq
import http.server
import json
import logging
import re
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Optional

log = logging.getLogger("mpijob-controller")

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v2beta1", "mpijobs", "MPIJob"
API_VERSION = f"{GROUP}/{VERSION}"
CONTROLLER_NAME = "mpi-job-controller"
# runPolicy.managedBy values this controller acts on (unset or upstream's own name).
MANAGED_BY_THIS_CONTROLLER = "kubeflow.org/mpi-operator"

OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_NAME = "mpi-operator"

CONFIG_VOLUME = "mpi-job-config"
CONFIG_MOUNT_PATH = "/etc/mpi"
HOSTFILE = "hostfile"
DISCOVER_HOSTS = "discover_hosts.sh"
SSH_VOLUME = "ssh-auth"
ROOT_SSH_PATH = "/root/.ssh"
SSH_PRIVATE_KEY = "ssh-privatekey"
SSH_PUBLIC_KEY = "ssh-publickey"

# Condition types and reasons, as mpi-operator sets them.
CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED = (
    "Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
REASON_CREATED, REASON_RUNNING, REASON_SUCCEEDED = "MPIJobCreated", "MPIJobRunning", "MPIJobSucceeded"
REASON_FAILED, REASON_SUSPENDED, REASON_RESUMED = "MPIJobFailed", "MPIJobSuspended", "MPIJobResumed"
REASON_EVICTED, REASON_VALIDATION, REASON_EXISTS = "MPIJobEvicted", "ValidationError", "ErrResourceExists"
EVENT_MESSAGE_LIMIT = 1024

OPEN_MPI, INTEL_MPI, MPICH = "OpenMPI", "Intel", "MPICH"
MPI_ENV = {
    OPEN_MPI: [
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
        {"name": "OMPI_MCA_orte_default_hostfile", "value": f"{CONFIG_MOUNT_PATH}/{HOSTFILE}"},
        {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
    ],
    INTEL_MPI: [
        {"name": "I_MPI_HYDRA_HOST_FILE", "value": f"{CONFIG_MOUNT_PATH}/{HOSTFILE}"},
        {"name": "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
    ],
    MPICH: [
        {"name": "HYDRA_HOST_FILE", "value": f"{CONFIG_MOUNT_PATH}/{HOSTFILE}"},
        {"name": "HYDRA_LAUNCH_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
    ],
}
SLOTS_ENV = {OPEN_MPI: "OMPI_MCA_orte_set_default_slots", INTEL_MPI: "I_MPI_PERHOST"}
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# ---------------------------------------------------------------------------------------------
# Spec: defaults and validation (what the upstream API defaulting and validation do)
# ---------------------------------------------------------------------------------------------

def _default(obj: dict, key: str, value: Any) -> None:
    if obj.get(key) in (None, ""):
        obj[key] = value


def defaulted_spec(mpijob: dict) -> dict:
    """A copy of the spec with v0.8's defaults (cleanPodPolicy None, slots 1, /root/.ssh, ...)."""
    spec = copy.deepcopy(mpijob.get("spec") or {})
    if not isinstance(spec.get("runPolicy"), dict):
        spec["runPolicy"] = {}
    _default(spec["runPolicy"], "cleanPodPolicy", "None")
    _default(spec, "slotsPerWorker", 1)
    _default(spec, "sshAuthMountPath", ROOT_SSH_PATH)
    _default(spec, "mpiImplementation", OPEN_MPI)
    _default(spec, "launcherCreationPolicy", "AtStartup")
    replica_specs = spec.get("mpiReplicaSpecs") or {}
    if isinstance(replica_specs.get("Launcher"), dict):
        _default(replica_specs["Launcher"], "restartPolicy", "OnFailure")
        _default(replica_specs["Launcher"], "replicas", 1)
    if isinstance(replica_specs.get("Worker"), dict):
        _default(replica_specs["Worker"], "restartPolicy", "Never")
        _default(replica_specs["Worker"], "replicas", 0)
    return spec


def validation_errors(name: str, spec: dict) -> list[str]:
    """v0.8's validation: an invalid MPIJob gets a ValidationError event and nothing else."""
    errors: list[str] = []
    replica_specs = spec.get("mpiReplicaSpecs")
    worker = (replica_specs or {}).get("Worker")
    replicas = worker.get("replicas") if isinstance(worker, dict) else None
    last_worker = f"{name}-worker-{max(replicas or 1, 1) - 1}"
    if len(last_worker) > 63 or not DNS1035_LABEL.match(last_worker):
        errors.append(f"metadata.name: Invalid value {name!r}: will not able to create pod and service "
                      f"with invalid DNS label {last_worker!r}")
    if not replica_specs:
        errors.append("spec.mpiReplicaSpecs: Required value: must have replica specs")
    else:
        for role, required in (("Launcher", True), ("Worker", False)):
            replica = replica_specs.get(role)
            path = f"spec.mpiReplicaSpecs[{role}]"
            if replica is None:
                if required:
                    errors.append(f"{path}: Required value: must have {role} replica spec")
                continue
            if replica.get("replicas") is None:
                errors.append(f"{path}.replicas: Required value: must define number of replicas")
            if replica.get("restartPolicy") not in ("Never", "OnFailure"):
                errors.append(f"{path}.restartPolicy: Unsupported value: {replica.get('restartPolicy')!r}: "
                              "supported values: \"Never\", \"OnFailure\"")
            if not ((replica.get("template") or {}).get("spec") or {}).get("containers"):
                errors.append(f"{path}.template.spec.containers: Required value: must define at least one container")
            count = replica.get("replicas")
            if role == "Launcher" and count is not None and count != 1:
                errors.append(f"{path}.replicas: Invalid value: {count}: must be 1")
            if role == "Worker" and count is not None and count <= 0:
                errors.append(f"{path}.replicas: Invalid value: {count}: must be greater than or equal to 1")
    if spec.get("slotsPerWorker", 0) < 0:
        errors.append("spec.slotsPerWorker: Invalid value: must be greater than or equal to 0")
    policy = spec["runPolicy"]
    if policy.get("cleanPodPolicy") not in ("None", "Running", "All"):
        errors.append(f"spec.runPolicy.cleanPodPolicy: Unsupported value: {policy.get('cleanPodPolicy')!r}: "
                      "supported values: \"All\", \"None\", \"Running\"")
    for field in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if policy.get(field) is not None and policy[field] < 0:
            errors.append(f"spec.runPolicy.{field}: Invalid value: {policy[field]}: "
                          "must be greater than or equal to 0")
    if policy.get("managedBy") not in (None, MANAGED_BY_THIS_CONTROLLER, "kueue.x-k8s.io/multikueue"):
        errors.append(f"spec.runPolicy.managedBy: Unsupported value: {policy['managedBy']!r}")
    if spec.get("mpiImplementation") not in MPI_ENV:
        errors.append(f"spec.mpiImplementation: Unsupported value: {spec.get('mpiImplementation')!r}: "
                      "supported values: \"Intel\", \"MPICH\", \"OpenMPI\"")
    return errors


# ---------------------------------------------------------------------------------------------
# Builders: the objects an MPIJob owns (pure functions of the MPIJob)
# ---------------------------------------------------------------------------------------------

def owner_reference(mpijob: dict) -> dict:
    meta = mpijob["metadata"]
    return {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def child_metadata(mpijob: dict, name: str) -> dict:
    meta = mpijob["metadata"]
    return {"name": name, "namespace": meta["namespace"], "labels": {"app": meta["name"]},
            "ownerReferences": [owner_reference(mpijob)]}


def role_labels(job_name: str, role: str) -> dict:
    return {OPERATOR_NAME_LABEL: OPERATOR_NAME, JOB_NAME_LABEL: job_name, JOB_ROLE_LABEL: role}


def worker_selector(job_name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in role_labels(job_name, "worker").items())


def worker_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def launcher_name(job_name: str) -> str:
    return f"{job_name}-launcher"


def worker_replicas(spec: dict) -> int:
    worker = (spec.get("mpiReplicaSpecs") or {}).get("Worker")
    return int(worker.get("replicas") or 0) if worker else 0


def runs_launcher_as_worker(spec: dict) -> bool:
    return bool(spec.get("runLauncherAsWorker"))


def host_fqdn(pod_name: str, mpijob: dict, cluster_domain: str) -> str:
    meta = mpijob["metadata"]
    host = f"{pod_name}.{meta['name']}.{meta['namespace']}.svc"
    return f"{host}.{cluster_domain}" if cluster_domain else host


def build_service(mpijob: dict, spec: dict) -> dict:
    """Headless Service named after the job, fronting launcher and workers (their pods' subdomain)."""
    name = mpijob["metadata"]["name"]
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": child_metadata(mpijob, name),
        "spec": {
            "clusterIP": "None",
            "selector": {OPERATOR_NAME_LABEL: OPERATOR_NAME, JOB_NAME_LABEL: name},
            # Upstream publishes not-ready pods only when the launcher is also a worker (it waits on itself).
            "publishNotReadyAddresses": runs_launcher_as_worker(spec),
        },
    }


def build_config_map(mpijob: dict, spec: dict, running_workers: list[str], cluster_domain: str = "") -> dict:
    """`hostfile` lists every worker; `discover_hosts.sh` echoes the workers Running now."""
    name = mpijob["metadata"]["name"]
    slots = spec["slotsPerWorker"]
    hosts = [launcher_name(name)] if runs_launcher_as_worker(spec) else []
    hosts += [worker_name(name, i) for i in range(worker_replicas(spec))]
    line = "{} slots={}\n" if spec["mpiImplementation"] == OPEN_MPI else "{}:{}\n"
    hostfile = "".join(line.format(host_fqdn(h, mpijob, cluster_domain), slots) for h in hosts)
    discovered = [launcher_name(name)] if runs_launcher_as_worker(spec) else []
    discovered += sorted(running_workers)
    script = "#!/bin/sh\n" + "".join(f"echo {host_fqdn(h, mpijob, cluster_domain)}\n" for h in discovered)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": child_metadata(mpijob, f"{name}-config"),
            "data": {HOSTFILE: hostfile, DISCOVER_HOSTS: script}}


def build_ssh_secret(mpijob: dict) -> dict:
    """A fresh ECDSA P-521 key pair (like v0.8): PEM private key, authorized_keys-format public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP521R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                    serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
        "metadata": child_metadata(mpijob, f"{mpijob['metadata']['name']}-ssh"),
        "data": {SSH_PRIVATE_KEY: base64.b64encode(private_pem).decode(),
                 SSH_PUBLIC_KEY: base64.b64encode(public + b"\n").decode()},
    }


def _add_ssh_volume(pod_spec: dict, mpijob: dict, spec: dict) -> None:
    secret: dict[str, Any] = {
        "secretName": f"{mpijob['metadata']['name']}-ssh",
        "items": [{"key": SSH_PRIVATE_KEY, "path": "id_rsa"},
                  {"key": SSH_PUBLIC_KEY, "path": "id_rsa.pub"},
                  {"key": SSH_PUBLIC_KEY, "path": "authorized_keys"}],
    }
    if spec["sshAuthMountPath"] == ROOT_SSH_PATH:
        secret["defaultMode"] = 0o600  # root's ssh refuses group/world-readable keys
    pod_spec.setdefault("volumes", []).append({"name": SSH_VOLUME, "secret": secret})
    pod_spec["containers"][0].setdefault("volumeMounts", []).append(
        {"name": SSH_VOLUME, "mountPath": spec["sshAuthMountPath"]})


def _pod_restart_policy(replica_spec: dict) -> str:
    policy = replica_spec.get("restartPolicy")
    return "Never" if policy == "ExitCode" else policy


def _place_in_service(pod_spec: dict, hostname: str, job_name: str) -> None:
    pod_spec["hostname"] = hostname
    pod_spec["subdomain"] = job_name  # the headless Service's name
    if pod_spec.get("hostNetwork"):
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"


def build_worker(mpijob: dict, spec: dict, index: int) -> dict:
    name = mpijob["metadata"]["name"]
    namespace = mpijob["metadata"]["namespace"]
    template = copy.deepcopy(spec["mpiReplicaSpecs"]["Worker"].get("template") or {})
    meta = template.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), **role_labels(name, "worker")}
    labels[REPLICA_INDEX_LABEL] = str(index + 1 if runs_launcher_as_worker(spec) else index)
    pod_spec = template["spec"]
    pod_name = worker_name(name, index)
    _place_in_service(pod_spec, pod_name, name)
    # Intel MPI and MPICH reach the launcher by its short hostname.
    dns_config = pod_spec.setdefault("dnsConfig", {})
    dns_config["searches"] = (dns_config.get("searches") or []) + [f"{name}.{namespace}.svc.cluster.local"]
    pod_spec["restartPolicy"] = _pod_restart_policy(spec["mpiReplicaSpecs"]["Worker"])
    container = pod_spec["containers"][0]
    if not container.get("command") and not container.get("args"):
        container["command"] = ["/usr/sbin/sshd", "-De"]
    container["env"] = (container.get("env") or []) + [{"name": "K_MPI_JOB_ROLE", "value": "worker"}]
    _add_ssh_volume(pod_spec, mpijob, spec)
    metadata = {"name": pod_name, "namespace": namespace, "labels": labels,
                "ownerReferences": [owner_reference(mpijob)]}
    if meta.get("annotations"):
        metadata["annotations"] = meta["annotations"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def build_launcher_template(mpijob: dict, spec: dict) -> dict:
    name = mpijob["metadata"]["name"]
    replica_spec = spec["mpiReplicaSpecs"]["Launcher"]
    template = copy.deepcopy(replica_spec.get("template") or {})
    meta = template.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), **role_labels(name, "launcher")}
    if runs_launcher_as_worker(spec):
        labels[REPLICA_INDEX_LABEL] = "0"
    pod_spec = template["spec"]
    _place_in_service(pod_spec, launcher_name(name), name)
    container = pod_spec["containers"][0]
    env = (container.get("env") or []) + [{"name": "K_MPI_JOB_ROLE", "value": "launcher"}]
    implementation = spec["mpiImplementation"]
    env += MPI_ENV[implementation]
    if implementation in SLOTS_ENV:
        env.append({"name": SLOTS_ENV[implementation], "value": str(spec["slotsPerWorker"])})
    if not runs_launcher_as_worker(spec):
        # Emptied so that a launcher never grabs GPUs it does not need.
        env += [{"name": "NVIDIA_VISIBLE_DEVICES"}, {"name": "NVIDIA_DRIVER_CAPABILITIES"}]
    container["env"] = env
    _add_ssh_volume(pod_spec, mpijob, spec)
    pod_spec["restartPolicy"] = _pod_restart_policy(replica_spec)
    pod_spec["volumes"].append({"name": CONFIG_VOLUME, "configMap": {
        "name": f"{name}-config",
        "items": [{"key": HOSTFILE, "path": HOSTFILE, "mode": 0o444},
                  {"key": DISCOVER_HOSTS, "path": DISCOVER_HOSTS, "mode": 0o555}]}})
    container["volumeMounts"].append({"name": CONFIG_VOLUME, "mountPath": CONFIG_MOUNT_PATH})
    out_meta: dict[str, Any] = {"labels": labels}
    if meta.get("annotations"):
        out_meta["annotations"] = meta["annotations"]
    return {"metadata": out_meta, "spec": pod_spec}


def build_launcher_job(mpijob: dict, spec: dict, suspend: bool = False) -> dict:
    policy = spec["runPolicy"]
    job_spec: dict[str, Any] = {
        "template": build_launcher_template(mpijob, spec),
        # Terminating pods are not replaced before they are gone (kubernetes#115844); 1.20 drops it.
        "podReplacementPolicy": "Failed",
    }
    for field in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        if policy.get(field) is not None:
            job_spec[field] = policy[field]
    if suspend:
        job_spec["suspend"] = True
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": child_metadata(mpijob, launcher_name(mpijob["metadata"]["name"])), "spec": job_spec}


# ---------------------------------------------------------------------------------------------
# Status: conditions and reads of pods and Jobs
# ---------------------------------------------------------------------------------------------

def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(status: dict, ctype: str) -> Optional[dict]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), None)


def condition_is_true(status: dict, ctype: str) -> bool:
    condition = find_condition(status, ctype)
    return bool(condition and condition.get("status") == "True")


def is_finished(status: dict) -> bool:
    return condition_is_true(status, SUCCEEDED) or condition_is_true(status, FAILED)


def set_condition(status: dict, ctype: str, value: str, reason: str, message: str) -> bool:
    """Upstream's rules: unchanged status and reason is no change; Succeeded/Failed turn Running off."""
    current = find_condition(status, ctype)
    if current and current.get("status") == value and current.get("reason") == reason:
        return False
    stamp = now_rfc3339()
    transition = current["lastTransitionTime"] if current and current.get("status") == value else stamp
    kept = []
    for condition in status.get("conditions") or []:
        if condition.get("type") == ctype or {ctype, condition.get("type")} == {RUNNING, RESTARTING}:
            continue
        if ctype in (SUCCEEDED, FAILED) and condition.get("type") in (RUNNING, FAILED):
            condition = {**condition, "status": "False"}
        kept.append(condition)
    status["conditions"] = kept + [{"type": ctype, "status": value, "reason": reason, "message": message,
                                    "lastUpdateTime": stamp, "lastTransitionTime": transition}]
    return True


def controller_of(obj: dict) -> Optional[dict]:
    return next((r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)


def is_controlled_by(obj: dict, owner: dict) -> bool:
    ref = controller_of(obj)
    return bool(ref and ref.get("uid") == owner["metadata"]["uid"])


def pod_phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase") or ""


def pod_is_ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def job_condition(job: dict, ctype: str) -> Optional[dict]:
    return next((c for c in (job.get("status") or {}).get("conditions") or []
                 if c.get("type") == ctype and c.get("status") == "True"), None)


def job_finished(job: dict) -> bool:
    return bool(job_condition(job, "Complete") or job_condition(job, "Failed"))


def replica_status(active: int = 0, succeeded: int = 0, failed: int = 0) -> dict:
    """Zero counts are left out, as upstream's `omitempty` does."""
    counts = {"active": active, "succeeded": succeeded, "failed": failed}
    return {k: v for k, v in counts.items() if v}


def truncated(message: str) -> str:
    return message if len(message) <= EVENT_MESSAGE_LIMIT else message[:EVENT_MESSAGE_LIMIT - 3] + "..."


class ResourceExists(Exception):
    """A child's name is taken by an object another controller owns."""


# ---------------------------------------------------------------------------------------------
# The API: raw JSON over the kubernetes client's authenticated connection pool
# ---------------------------------------------------------------------------------------------

class Api:
    def __init__(self, api_client):
        from kubernetes.client.rest import ApiException

        self.client = api_client
        self.ApiException = ApiException

    def request(self, method: str, path: str, body: Any = None, query: Optional[dict] = None,
                content_type: str = "application/json", timeout: float = 30) -> dict:
        """One call, tried again (up to 3 more times) where the API server could not reach etcd in time: a 504, or a
        500 saying so (a loaded 1.20 server). A create retried after its write did land answers 409, which the
        controller's create-or-adopt takes as an adoption."""
        for attempt in range(4):
            try:
                return self._request_once(method, path, body, query, content_type, timeout)
            except self.ApiException as exc:
                body_text = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
                if attempt == 3 or not (exc.status == 504 or (exc.status == 500 and "etcdserver" in body_text)):
                    raise
                time.sleep(1.0 + attempt)
        raise AssertionError("unreachable")

    def _request_once(self, method: str, path: str, body: Any, query: Optional[dict], content_type: str,
                      timeout: float) -> dict:
        response = self.client.call_api(
            path, method, query_params=list((query or {}).items()), body=body,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            _request_timeout=(10, timeout))
        data = response.data
        return json.loads(data) if data else {}

    def get(self, path: str, query: Optional[dict] = None) -> Optional[dict]:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path, query=query)
        except self.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, body: dict, query: Optional[dict] = None) -> dict:
        return self.request("POST", path, body, query)

    def replace(self, path: str, body: dict) -> dict:
        return self.request("PUT", path, body)

    def merge_patch(self, path: str, body: dict) -> dict:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, propagation: Optional[str] = None) -> bool:
        """True when this call deleted it; False when it was already gone."""
        body = {"propagationPolicy": propagation} if propagation else None
        try:
            self.request("DELETE", path, body)
            return True
        except self.ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def watch(self, path: str, query: dict, timeout_seconds: int) -> Iterator[dict]:
        """Watch events, one dict per line of the stream, until the server ends the watch."""
        query = {**query, "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        response = self.client.call_api(
            path, "GET", query_params=list(query.items()), header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            _request_timeout=(10, timeout_seconds + 30))
        try:
            pending = b""
            for chunk in response.stream(64 * 1024, decode_content=False):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.release_conn()


def namespaced(prefix: str, plural: str, namespace: str, name: str = "", sub: str = "") -> str:
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
    return f"{path}/{sub}" if sub else path


CORE, BATCH, KUBEFLOW = "/api/v1", "/apis/batch/v1", f"/apis/{GROUP}/{VERSION}"
KIND_PATHS = {"Pod": (CORE, "pods"), "Service": (CORE, "services"), "ConfigMap": (CORE, "configmaps"),
              "Secret": (CORE, "secrets"), "Job": (BATCH, "jobs")}


def object_path(kind: str, namespace: str, name: str = "") -> str:
    prefix, plural = KIND_PATHS[kind]
    return namespaced(prefix, plural, namespace, name)


def mpijob_path(namespace: str, name: str, sub: str = "") -> str:
    return namespaced(KUBEFLOW, PLURAL, namespace, name, sub)


# ---------------------------------------------------------------------------------------------
# Work queue: one entry per MPIJob, earliest due first; a key is never processed twice at once
# ---------------------------------------------------------------------------------------------

class WorkQueue:
    def __init__(self):
        self._due: dict[tuple[str, str], float] = {}
        self._heap: list[tuple[float, tuple[str, str]]] = []
        self._cond = threading.Condition()

    def add(self, key: tuple[str, str], delay: float = 0.0) -> None:
        due = time.monotonic() + delay
        with self._cond:
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            heapq.heappush(self._heap, (due, key))
            self._cond.notify()

    def get(self, stop: threading.Event) -> Optional[tuple[str, str]]:
        with self._cond:
            while not stop.is_set():
                while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded by an earlier add
                if self._heap and self._heap[0][0] <= time.monotonic():
                    _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    return key
                wait = self._heap[0][0] - time.monotonic() if self._heap else 1.0
                self._cond.wait(min(max(wait, 0.01), 1.0))
        return None


# ---------------------------------------------------------------------------------------------
# The controller
# ---------------------------------------------------------------------------------------------

class MPIJobController:
    def __init__(self, api_client, namespace: str = "", cluster_domain: str = "", resync_seconds: float = 30):
        self.api = Api(api_client)
        self.namespace = namespace
        self.cluster_domain = cluster_domain
        self.resync_seconds = resync_seconds
        self.queue = WorkQueue()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.known_jobs: set[tuple[str, str]] = set()
        self.known_jobs_lock = threading.Lock()
        self.failures: dict[tuple[str, str], int] = {}
        self.warned_invalid: set[tuple[str, int]] = set()
        self._job_suspend_supported: Optional[bool] = None

    # --- running ---------------------------------------------------------------------------

    def start(self) -> None:
        scope = f"namespace {self.namespace}" if self.namespace else "all namespaces"
        log.info("starting: watching MPIJobs %s in %s", API_VERSION, scope)
        mpijobs = f"{KUBEFLOW}/namespaces/{self.namespace}/{PLURAL}" if self.namespace else f"{KUBEFLOW}/{PLURAL}"
        pods = f"{CORE}/namespaces/{self.namespace}/pods" if self.namespace else f"{CORE}/pods"
        jobs = f"{BATCH}/namespaces/{self.namespace}/jobs" if self.namespace else f"{BATCH}/jobs"
        self._spawn("watch-mpijobs", self._watch_forever, "MPIJobs", mpijobs, {}, self._on_mpijob)
        # Workers and launcher pods carry the operator-name label (the launcher's from its template).
        self._spawn("watch-pods", self._watch_forever, "pods", pods,
                    {"labelSelector": f"{OPERATOR_NAME_LABEL}={OPERATOR_NAME}"}, self._on_pod)
        self._spawn("watch-jobs", self._watch_forever, "Jobs", jobs, {}, self._on_owned)
        self._spawn("resync", self._resync_forever)
        self._spawn("reconcile", self._work_forever)

    def stop(self) -> None:
        self.stop_event.set()

    def healthy(self) -> bool:
        return bool(self.threads) and all(t.is_alive() for t in self.threads)

    def _spawn(self, name: str, target: Callable, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _watch_forever(self, what: str, path: str, query: dict, on_object: Callable[[str, dict], None]) -> None:
        resource_version: Optional[str] = None
        backoff = 1.0
        while not self.stop_event.is_set():
            try:
                if resource_version is None:
                    listing = self.api.request("GET", path, query=query)
                    for item in listing.get("items") or []:
                        on_object("ADDED", item)
                    resource_version = listing["metadata"]["resourceVersion"]
                for event in self.api.watch(path, {**query, "resourceVersion": resource_version}, 300):
                    if self.stop_event.is_set():
                        return
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        # 410 Gone: our resourceVersion is too old; list again.
                        log.info("watch of %s expired (%s); listing again", what, obj.get("message"))
                        resource_version = None
                        break
                    resource_version = obj["metadata"]["resourceVersion"]
                    if event.get("type") != "BOOKMARK":
                        on_object(event["type"], obj)
                backoff = 1.0
            except Exception as exc:  # connection loss, API errors: keep watching
                if getattr(exc, "status", None) == 410:
                    resource_version = None
                    continue
                log.warning("watch of %s failed (%s); retrying in %.0f s", what, str(exc).splitlines()[0], backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 30)

    def _on_mpijob(self, event_type: str, mpijob: dict) -> None:
        key = (mpijob["metadata"]["namespace"], mpijob["metadata"]["name"])
        with self.known_jobs_lock:
            if event_type == "DELETED":
                self.known_jobs.discard(key)
                return
            self.known_jobs.add(key)
        self.queue.add(key)

    def _on_pod(self, event_type: str, pod: dict) -> None:
        job_name = (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL)
        if job_name:
            self.queue.add((pod["metadata"]["namespace"], job_name))

    def _on_owned(self, event_type: str, obj: dict) -> None:
        ref = controller_of(obj)
        if ref and ref.get("kind") == KIND and ref.get("apiVersion") == API_VERSION:
            self.queue.add((obj["metadata"]["namespace"], ref["name"]))

    def _resync_forever(self) -> None:
        while not self.stop_event.wait(self.resync_seconds):
            with self.known_jobs_lock:
                keys = list(self.known_jobs)
            for key in keys:
                self.queue.add(key)

    def _work_forever(self) -> None:
        while not self.stop_event.is_set():
            key = self.queue.get(self.stop_event)
            if key is None:
                return
            try:
                self.reconcile(*key)
                self.failures.pop(key, None)
            except Exception as exc:
                failures = self.failures[key] = self.failures.get(key, 0) + 1
                delay = min(0.5 * 2 ** (failures - 1), 60)
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                if getattr(exc, "status", None) == 409:
                    log.info("MPIJob %s/%s: conflict (%s); again in %.1f s", *key, first_line, delay)
                else:
                    log.warning("MPIJob %s/%s: reconcile failed: %s; again in %.1f s", *key, first_line, delay,
                                exc_info=not isinstance(exc, (ResourceExists, self.api.ApiException)))
                self.queue.add(key, delay)

    # --- helpers ---------------------------------------------------------------------------

    def event(self, mpijob: dict, event_type: str, reason: str, message: str) -> None:
        meta = mpijob["metadata"]
        stamp = now_rfc3339()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"],
                               "resourceVersion": meta.get("resourceVersion")},
            "type": event_type, "reason": reason, "message": truncated(message),
            "source": {"component": CONTROLLER_NAME}, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        log.info("event %s %s on MPIJob %s/%s: %s", event_type, reason, meta["namespace"], meta["name"], message)
        try:
            self.api.create(namespaced(CORE, "events", meta["namespace"]), body)
        except Exception as exc:  # an event is a courtesy; never fail a reconcile for it
            log.warning("could not record event %s: %s", reason, exc)

    def ensure(self, mpijob: dict, desired: dict) -> dict:
        """Create-or-adopt: ours is used, an orphan is adopted, another owner's is an error."""
        kind, name = desired["kind"], desired["metadata"]["name"]
        namespace = mpijob["metadata"]["namespace"]
        path = object_path(kind, namespace, name)
        existing = self.api.get(path)
        if existing is None:
            try:
                created = self.api.create(object_path(kind, namespace), desired)
                log.info("created %s %s/%s for MPIJob %s", kind, namespace, name, mpijob["metadata"]["name"])
                return created
            except self.api.ApiException as exc:
                if exc.status != 409:
                    raise
                existing = self.api.get(path)
                if existing is None:
                    raise ResourceExists(f"{kind} {name} conflicted and then vanished") from None
        return self.claim(mpijob, existing)

    def claim(self, mpijob: dict, existing: dict) -> dict:
        if is_controlled_by(existing, mpijob):
            return existing
        kind, name = existing.get("kind") or "object", existing["metadata"]["name"]
        if controller_of(existing):
            message = f'Resource "{name}" of Kind "{kind}" already exists and is not managed by MPIJob'
            self.event(mpijob, "Warning", REASON_EXISTS, message)
            raise ResourceExists(message)
        refs = (existing["metadata"].get("ownerReferences") or []) + [owner_reference(mpijob)]
        adopted = self.api.merge_patch(
            object_path(kind, existing["metadata"]["namespace"], name),
            {"metadata": {"ownerReferences": refs, "resourceVersion": existing["metadata"]["resourceVersion"]}})
        log.info("adopted %s %s/%s for MPIJob %s", kind, existing["metadata"]["namespace"], name,
                 mpijob["metadata"]["name"])
        return adopted

    def job_suspend_supported(self, namespace: str) -> bool:
        """Whether the API server keeps Job.spec.suspend (1.21+); 1.20 drops it silently."""
        if self._job_suspend_supported is None:
            probe = {"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"generateName": "mpijob-suspend-probe-"},
                     "spec": {"suspend": True, "template": {"spec": {
                         "restartPolicy": "Never", "containers": [{"name": "probe", "image": "probe"}]}}}}
            answer = self.api.create(object_path("Job", namespace), probe, query={"dryRun": "All"})
            self._job_suspend_supported = (answer.get("spec") or {}).get("suspend") is True
            log.info("the API server %s", "keeps Job.spec.suspend" if self._job_suspend_supported else
                     "drops Job.spec.suspend: a suspended MPIJob's launcher Job is deleted instead")
        return self._job_suspend_supported

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        return self.api.request("GET", object_path("Pod", namespace), query={"labelSelector": selector}).get(
            "items") or []

    # --- the reconcile ---------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> None:
        mpijob = self.api.get(mpijob_path(namespace, name))
        if mpijob is None or mpijob["metadata"].get("deletionTimestamp"):
            return
        mpijob.setdefault("apiVersion", API_VERSION)
        mpijob.setdefault("kind", KIND)
        spec = defaulted_spec(mpijob)
        managed_by = spec["runPolicy"].get("managedBy")
        if managed_by not in (None, MANAGED_BY_THIS_CONTROLLER):
            return
        errors = validation_errors(name, spec)
        if errors:
            seen = (mpijob["metadata"]["uid"], mpijob["metadata"].get("generation", 0))
            if seen not in self.warned_invalid:
                self.warned_invalid.add(seen)
                self.event(mpijob, "Warning", REASON_VALIDATION,
                           "Found validation errors: [" + ", ".join(errors) + "]")
            return

        status = copy.deepcopy(mpijob.get("status") or {})
        before = copy.deepcopy(status)
        if not status.get("conditions"):
            message = f"MPIJob {namespace}/{name} is created."
            set_condition(status, CREATED, "True", REASON_CREATED, message)
            self.event(mpijob, "Normal", REASON_CREATED, message)

        clean_pod_policy = spec["runPolicy"]["cleanPodPolicy"]
        if is_finished(status) and status.get("completionTime"):
            if clean_pod_policy in ("Running", "All"):
                self.delete_workers(mpijob, spec, f"finished, cleanPodPolicy {clean_pod_policy}")
                status.setdefault("replicaStatuses", {})["Worker"] = replica_status()
            self.write_status(mpijob, before, status)
            return

        suspended = bool(spec["runPolicy"].get("suspend"))
        if not status.get("startTime") and not suspended:
            status["startTime"] = now_rfc3339()

        launcher = self.api.get(object_path("Job", namespace, launcher_name(name)))
        if launcher is not None:
            launcher = self.claim(mpijob, {**launcher, "kind": "Job"})
        workers: list[dict] = []
        if launcher is None or not job_finished(launcher):
            worker_pods = self.list_pods(namespace, worker_selector(name))
            self.ensure_service(mpijob, spec)
            self.ensure_config_map(mpijob, spec, worker_pods)
            self.ensure_ssh_secret(mpijob)
            if not suspended:
                workers = self.ensure_workers(mpijob, spec, worker_pods)
            if launcher is None:
                launcher = self.maybe_create_launcher(mpijob, spec, workers, suspended)
        if launcher is not None:
            launcher = self.align_launcher_suspension(mpijob, launcher, suspended)
        if suspended:
            self.delete_workers(mpijob, spec, "suspended")
            status.setdefault("replicaStatuses", {})["Worker"] = replica_status()
            if launcher is None:
                status["replicaStatuses"]["Launcher"] = replica_status()
        self.update_status(mpijob, spec, status, launcher, workers, suspended)
        self.write_status(mpijob, before, status)

    def ensure_service(self, mpijob: dict, spec: dict) -> None:
        desired = build_service(mpijob, spec)
        current = self.ensure(mpijob, desired)
        wanted = {k: desired["spec"][k] for k in ("selector", "publishNotReadyAddresses")}
        if {k: current["spec"].get(k, False if k == "publishNotReadyAddresses" else None) for k in wanted} != wanted:
            meta = current["metadata"]
            self.api.merge_patch(object_path("Service", meta["namespace"], meta["name"]),
                                 {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": wanted})
            log.info("updated Service %s/%s: selector and publishNotReadyAddresses", meta["namespace"], meta["name"])

    def ensure_config_map(self, mpijob: dict, spec: dict, worker_pods: list[dict]) -> None:
        running = [p["metadata"]["name"] for p in worker_pods if pod_phase(p) == "Running"]
        desired = build_config_map(mpijob, spec, running, self.cluster_domain)
        current = self.ensure(mpijob, desired)
        if current.get("data") != desired["data"]:
            meta = current["metadata"]
            self.api.merge_patch(object_path("ConfigMap", meta["namespace"], meta["name"]),
                                 {"metadata": {"resourceVersion": meta["resourceVersion"]}, "data": desired["data"]})
            log.info("updated ConfigMap %s/%s: discover_hosts.sh lists %d running workers",
                     meta["namespace"], meta["name"], len(running))

    def ensure_ssh_secret(self, mpijob: dict) -> None:
        namespace, name = mpijob["metadata"]["namespace"], f"{mpijob['metadata']['name']}-ssh"
        existing = self.api.get(object_path("Secret", namespace, name))
        if existing is None:
            self.ensure(mpijob, build_ssh_secret(mpijob))
            return
        existing = self.claim(mpijob, {**existing, "kind": "Secret"})
        if sorted(existing.get("data") or {}) != sorted([SSH_PRIVATE_KEY, SSH_PUBLIC_KEY]):
            fresh = build_ssh_secret(mpijob)
            self.api.replace(object_path("Secret", namespace, name),
                             {**existing, "type": fresh["type"], "data": fresh["data"]})
            log.info("replaced the keys of Secret %s/%s", namespace, name)

    def ensure_workers(self, mpijob: dict, spec: dict, worker_pods: list[dict]) -> list[dict]:
        """Worker pods 0..replicas-1, each created when missing (a deleted one comes back, same name)."""
        namespace, name = mpijob["metadata"]["namespace"], mpijob["metadata"]["name"]
        replicas = worker_replicas(spec)
        by_name = {p["metadata"]["name"]: p for p in worker_pods}
        for pod in worker_pods:  # scaled down
            index = (pod["metadata"].get("labels") or {}).get(REPLICA_INDEX_LABEL, "")
            if index.isdigit() and int(index) >= replicas and is_controlled_by(pod, mpijob):
                if self.api.delete(object_path("Pod", namespace, pod["metadata"]["name"])):
                    log.info("deleted Pod %s/%s: beyond %d worker replicas", namespace, pod["metadata"]["name"],
                             replicas)
        workers = []
        for index in range(replicas):
            existing = by_name.get(worker_name(name, index))
            if existing is not None:
                workers.append(self.claim(mpijob, {**existing, "kind": "Pod"}))
                continue
            try:
                workers.append(self.ensure(mpijob, build_worker(mpijob, spec, index)))
            except self.api.ApiException as exc:
                self.event(mpijob, "Warning", REASON_FAILED, f"worker pod created failed: {exc.reason}")
                raise
        return workers

    def maybe_create_launcher(self, mpijob: dict, spec: dict, workers: list[dict], suspended: bool) -> Optional[dict]:
        namespace, name = mpijob["metadata"]["namespace"], mpijob["metadata"]["name"]
        if suspended and not self.job_suspend_supported(namespace):
            return None  # a Job created suspended would run here
        if spec["launcherCreationPolicy"] == "WaitForWorkersReady":
            ready = sum(1 for w in workers if pod_is_ready(w))
            if ready < len(workers):
                log.info("MPIJob %s/%s: %d of %d workers Ready; launcher waits (WaitForWorkersReady)",
                         namespace, name, ready, len(workers))
                return None
        if (spec["mpiReplicaSpecs"]["Launcher"].get("template") or {}).get("spec", {}).get("restartPolicy"):
            self.event(mpijob, "Warning", "SetPodTemplateRestartPolicy",
                       "Restart policy in pod template overridden by restart policy in replica spec")
        try:
            return self.ensure(mpijob, build_launcher_job(mpijob, spec, suspend=suspended))
        except self.api.ApiException as exc:
            self.event(mpijob, "Warning", REASON_FAILED, f"launcher pod created failed: {exc.reason}")
            raise

    def align_launcher_suspension(self, mpijob: dict, launcher: dict, suspended: bool) -> Optional[dict]:
        namespace = mpijob["metadata"]["namespace"]
        path = object_path("Job", namespace, launcher["metadata"]["name"])
        if bool((launcher.get("spec") or {}).get("suspend")) == suspended:
            return launcher
        if self.job_suspend_supported(namespace):
            updated = self.api.merge_patch(path, {"spec": {"suspend": suspended}})
            log.info("%s Job %s/%s", "suspended" if suspended else "resumed", namespace, launcher["metadata"]["name"])
            return updated
        if suspended:
            # Without Job suspension, stopping the launcher means deleting it (and its pods).
            if self.api.delete(path, propagation="Background"):
                log.info("deleted Job %s/%s: MPIJob suspended", namespace, launcher["metadata"]["name"])
            return None
        return launcher

    def delete_workers(self, mpijob: dict, spec: dict, why: str) -> None:
        """Upstream's cleanup (on finish and on suspend): with cleanPodPolicy Running, finished workers stay."""
        namespace, name = mpijob["metadata"]["namespace"], mpijob["metadata"]["name"]
        pods = {p["metadata"]["name"]: p for p in self.list_pods(namespace, worker_selector(name))}
        for index in range(worker_replicas(spec)):
            pod = pods.get(worker_name(name, index)) or self.api.get(
                object_path("Pod", namespace, worker_name(name, index)))
            if pod is None:
                continue
            if not is_controlled_by(pod, mpijob):
                message = (f'Resource "{pod["metadata"]["name"]}" of Kind "Pod" already exists and is not '
                           "managed by MPIJob")
                self.event(mpijob, "Warning", REASON_EXISTS, message)
                raise ResourceExists(message)
            if spec["runPolicy"]["cleanPodPolicy"] == "Running" and pod_phase(pod) not in ("Running", "Pending"):
                continue
            if pod["metadata"].get("deletionTimestamp"):
                continue
            if self.api.delete(object_path("Pod", namespace, pod["metadata"]["name"])):
                log.info("deleted Pod %s/%s (phase %s): MPIJob %s", namespace, pod["metadata"]["name"],
                         pod_phase(pod) or "unknown", why)

    def launcher_pods(self, launcher: dict) -> list[dict]:
        selector = ((launcher.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not selector:
            return []
        pods = self.list_pods(launcher["metadata"]["namespace"], ",".join(f"{k}={v}" for k, v in selector.items()))
        return [p for p in pods if is_controlled_by(p, launcher)]

    def update_status(self, mpijob: dict, spec: dict, status: dict, launcher: Optional[dict],
                      workers: list[dict], suspended: bool) -> None:
        namespace, name = mpijob["metadata"]["namespace"], mpijob["metadata"]["name"]
        replica_statuses = status.setdefault("replicaStatuses", {})
        if suspended:
            if set_condition(status, SUSPENDED, "True", REASON_SUSPENDED, "MPIJob suspended"):
                self.event(mpijob, "Normal", REASON_SUSPENDED, "MPIJob suspended")
        elif find_condition(status, SUSPENDED) is not None:
            if set_condition(status, SUSPENDED, "False", REASON_RESUMED, "MPIJob resumed"):
                self.event(mpijob, "Normal", REASON_RESUMED, "MPIJob resumed")
                status["startTime"] = now_rfc3339()

        running_launchers = 0
        if launcher is not None:
            pods = self.launcher_pods(launcher)
            running_launchers = sum(1 for p in pods if pod_phase(p) == "Running")
            launcher_status = launcher.get("status") or {}
            if job_condition(launcher, "Complete"):
                replica_statuses["Launcher"] = replica_status(succeeded=1, failed=launcher_status.get("failed", 0))
                message = f"MPIJob {namespace}/{name} successfully completed."
                status.setdefault("completionTime", launcher_status.get("completionTime") or now_rfc3339())
                if set_condition(status, SUCCEEDED, "True", REASON_SUCCEEDED, message):
                    self.event(mpijob, "Normal", REASON_SUCCEEDED, message)
            elif job_condition(launcher, "Failed"):
                replica_statuses["Launcher"] = replica_status(failed=launcher_status.get("failed", 0))
                self.mark_failed(mpijob, status, launcher, pods)
            else:
                replica_statuses["Launcher"] = replica_status(active=running_launchers,
                                                              failed=launcher_status.get("failed", 0))

        counts = {"Running": 0, "Succeeded": 0, "Failed": 0}
        evicted = 0
        for pod in workers:
            phase = pod_phase(pod)
            if phase in counts:
                counts[phase] += 1
            if phase == "Failed" and (pod.get("status") or {}).get("reason") == "Evicted":
                evicted += 1
        if not suspended:
            replica_statuses["Worker"] = replica_status(counts["Running"], counts["Succeeded"], counts["Failed"])
        if evicted:
            message = f"{evicted}/{len(workers)} workers are evicted"
            if set_condition(status, FAILED, "True", REASON_EVICTED, message):
                self.event(mpijob, "Warning", REASON_EVICTED, message)

        if suspended:
            set_condition(status, RUNNING, "False", REASON_SUSPENDED, f"MPIJob {namespace}/{name} is suspended.")
        elif is_finished(status):
            if find_condition(status, RUNNING) is None:
                stamp = status.get("completionTime") or now_rfc3339()
                status["conditions"].append({
                    "type": RUNNING, "status": "False", "reason": REASON_RUNNING,
                    "message": f"MPIJob {namespace}/{name} is finished but Running condition was never set.",
                    "lastUpdateTime": stamp, "lastTransitionTime": stamp})
        elif launcher is not None and running_launchers >= 1 and counts["Running"] == len(workers):
            message = f"MPIJob {namespace}/{name} is running."
            if set_condition(status, RUNNING, "True", REASON_RUNNING, message):
                self.event(mpijob, "Normal", REASON_RUNNING, f"MPIJob {namespace}/{name} is running")

    def mark_failed(self, mpijob: dict, status: dict, launcher: dict, launcher_pods: list[dict]) -> None:
        failed = job_condition(launcher, "Failed") or {}
        reason = failed.get("reason") or REASON_FAILED
        meta = mpijob["metadata"]
        message = failed.get("message") or f"MPIJob {meta['namespace']}/{meta['name']} has failed"
        if reason == "BackoffLimitExceeded":
            # Like upstream: the last failed launcher pod's reason and message are appended.
            failed_pods = [p for p in launcher_pods if pod_phase(p) == "Failed"]
            if failed_pods:
                last = max(failed_pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
                reason += "/" + ((last.get("status") or {}).get("reason") or "")
                message = truncated(message + ": " + ((last.get("status") or {}).get("message") or ""))
        status.setdefault("completionTime", now_rfc3339())
        if set_condition(status, FAILED, "True", reason, message):
            self.event(mpijob, "Warning", reason, message)

    def write_status(self, mpijob: dict, before: dict, status: dict) -> None:
        if status == before:
            return
        meta = mpijob["metadata"]
        self.api.replace(mpijob_path(meta["namespace"], meta["name"], "status"), {**mpijob, "status": status})
        summary = ", ".join(f"{c['type']}={c['status']}" for c in status.get("conditions") or [])
        log.info("updated status of MPIJob %s/%s: %s; replicas %s", meta["namespace"], meta["name"], summary,
                 json.dumps(status.get("replicaStatuses") or {}, sort_keys=True))


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def api_client_for(kubeconfig: Optional[str]):
    import os

    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config()


def serve_health(controller: MPIJobController, port: int) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            ok = self.path == "/healthz" and controller.healthy()
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(b"ok\n" if ok else b"not ok\n")

        def log_message(self, *args):  # probes every few seconds would drown the action log
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else KUBECONFIG/~/.kube/config)")
    parser.add_argument("--namespace", default="", help="watch only this namespace (default: all)")
    parser.add_argument("--cluster-domain", default="",
                        help="appended to hostfile names (default: none, like upstream)")
    parser.add_argument("--resync-seconds", type=float, default=30, help="reconcile every known MPIJob this often")
    parser.add_argument("--health-port", type=int, default=0, help="serve GET /healthz on this port (0: off)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)

    controller = MPIJobController(api_client_for(args.kubeconfig), namespace=args.namespace,
                                  cluster_domain=args.cluster_domain, resync_seconds=args.resync_seconds)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: controller.stop())
    if args.health_port:
        serve_health(controller, args.health_port)
    controller.start()
    while not controller.stop_event.wait(5):
        if not controller.healthy():
            log.error("a controller thread died; exiting")
            return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
