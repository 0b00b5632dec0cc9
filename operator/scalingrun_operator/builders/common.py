"""Names, labels and pod pieces shared by the child builders."""

from __future__ import annotations

from typing import Any

from scalingrun_api.engines import engine
from scalingrun_api.models import MANAGED_BY, ScalingRun
from scalingrun_api.status_push import (
    CA_FILE, STATUS_AUDIENCE, STATUS_CONFIG_MAP, STATUS_DIR, STATUS_PATH_VARIABLE, TOKEN_EXPIRATION_SECONDS,
    TOKEN_FILE, URL_FILE, run_push_path,
)
from scalingrun_api.models.run import DEFAULT_GPU_RESOURCE
from scalingrun_api.models.training import CONFIG_PATH

CONFIG_FILE = CONFIG_PATH
CONFIG_MOUNT_DIR = CONFIG_PATH.rsplit("/", 1)[0]
RUN_LABEL = "scalingrun.dev/run"
NON_ROOT_UID = 1000


def trainer_image(run: ScalingRun) -> str:
    """spec.workers.image, else the engine's default image for the workers' devices (-gpu with gpusPerWorker above
    0; the Lightning one has torch, no TensorFlow); the operator fills spec.workers.image from its trainerImages
    setting first (decide.run.with_default_image)."""
    training, workers = run.spec.training, run.spec.workers
    return workers.image or engine(training.framework, training.strategy).default_image(workers.gpus_per_worker)


def config_map_name(run: ScalingRun) -> str:
    # Not `-config`: mpi-operator names its ConfigMap `<mpijob>-config`, and run X's MPIJob is `X-train`, so run
    # `X-train`'s ConfigMap would be `X-train-config` too. No name mpi-operator derives ends in `-runconfig`.
    return f"{run.metadata.name}-runconfig"


def preprocess_job_name(run: ScalingRun) -> str:
    return f"{run.metadata.name}-preprocess"


def mpijob_name(run: ScalingRun) -> str:
    return f"{run.metadata.name}-train"


def labels(run: ScalingRun, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "scalingrun",
        "app.kubernetes.io/instance": run.metadata.name,
        "app.kubernetes.io/component": component,
        **MANAGED_BY,
        RUN_LABEL: run.metadata.name,
    }


def metadata(run: ScalingRun, name: str, namespace: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels(run, component)}


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def queue_labels(run: ScalingRun) -> dict[str, str]:
    """The Kueue LocalQueue label of a job (the MPIJob, the preprocessing Job) of a run with
    spec.runPolicy.kueueQueueName: on the job only, not its pods (Kueue admits the job; its pods follow), and on an
    elastic run's capacity probes, pods of their own (builders/capacity_probes.py)."""
    queue = run.spec.run_policy.kueue_queue_name
    return {KUEUE_QUEUE_LABEL: queue} if queue else {}


def storage_env(run: ScalingRun) -> list[dict[str, Any]]:
    """Object-store settings; the keys only as Secret references, never as values."""
    storage = run.spec.storage
    env: list[dict[str, Any]] = [{"name": "AWS_DEFAULT_REGION", "value": storage.region}]
    if storage.endpoint:
        env.append({"name": "AWS_ENDPOINT_URL", "value": storage.endpoint})
    if storage.credentials_secret:
        for var, key in (
            ("AWS_ACCESS_KEY_ID", storage.access_key_id_key),
            ("AWS_SECRET_ACCESS_KEY", storage.secret_access_key_key),
        ):
            env.append(
                {
                    "name": var,
                    "valueFrom": {"secretKeyRef": {"name": storage.credentials_secret, "key": key}},
                }
            )
    return env


# MLflow's own variable names, used as the Secret's keys too; a Secret may hold a token or a user and password.
MLFLOW_CREDENTIAL_VARS = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def tracking_env(run: ScalingRun) -> list[dict[str, Any]]:
    """MLflow credentials as optional Secret references (only the keys the Secret has are set)."""
    tracking = run.spec.tracking
    if tracking is None or not tracking.credentials_secret:
        return []
    return [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": tracking.credentials_secret, "key": var, "optional": True}}}
        for var in MLFLOW_CREDENTIAL_VARS
    ]


def service_account(run: ScalingRun) -> dict[str, Any]:
    """spec.workers.serviceAccountName for every pod of the run (the identity its storage credentials may come
    from); none: the namespace's default."""
    name = run.spec.workers.service_account_name
    return {"serviceAccountName": name} if name else {}


def image_pull_secrets(run: ScalingRun) -> dict[str, Any]:
    """spec.workers.imagePullSecrets for every pod of the run (a private registry or mirror)."""
    names = run.spec.workers.image_pull_secrets
    return {"imagePullSecrets": [{"name": name} for name in names]} if names else {}


STATUS_VOLUME = "scalingrun-status"


def status_env(run: ScalingRun, namespace: str) -> list[dict[str, Any]]:
    """The run's push path (scalingrun_api.status_push.run_push_path), for its processes."""
    return [{"name": STATUS_PATH_VARIABLE, "value": run_push_path(namespace, run.metadata.name)}]


def status_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """What a run's pod pushes its status with (docs/security.md, "The push path"): a projected ServiceAccount token
    of our own audience (the kubelet rotates it; it is good for nothing else: the API server refuses its audience),
    and the status endpoint's URL and CA bundle from the namespace's ConfigMap, optional (an operator without the
    endpoint writes none, and the pod pushes nothing): (volume, volumeMount)."""
    return ({"name": STATUS_VOLUME, "projected": {"sources": [
                {"serviceAccountToken": {"audience": STATUS_AUDIENCE, "path": TOKEN_FILE,
                                         "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
                {"configMap": {"name": STATUS_CONFIG_MAP, "optional": True,
                               "items": [{"key": URL_FILE, "path": URL_FILE}, {"key": CA_FILE, "path": CA_FILE}]}},
            ]}},
            {"name": STATUS_VOLUME, "mountPath": STATUS_DIR, "readOnly": True})


def pod_spec(run: ScalingRun, namespace: str, container: dict[str, Any],
             volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """The spec of a run's pod of one container, non-root, that never calls the Kubernetes API: no API token is
    mounted, only the status token, whose audience the API server refuses (status_volume)."""
    volume, mount = status_volume()
    env = [e for e in container.get("env", []) if e["name"] != STATUS_PATH_VARIABLE]
    container = {**container, "env": env + status_env(run, namespace),
                 "volumeMounts": [*container.get("volumeMounts", []), mount]}
    return {
        "automountServiceAccountToken": False,
        **service_account(run),
        **image_pull_secrets(run),
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [*volumes, volume],
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """Nothing gained, nothing dropped back, nothing written outside `writable_dirs`' emptyDirs."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


# What a trainer container writes, with a read-only root filesystem: temporary files (TensorFlow, Petastorm,
# Lightning, checkpoints and the model before their upload, Open MPI's session directory).
TMP_DIR = "/tmp"


def writable_dirs(*paths: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An emptyDir for each path (the pod's own, gone with it): (volumes, volumeMounts)."""
    names = [path.strip("/").replace("/", "-").replace(".", "") for path in paths]
    return ([{"name": name, "emptyDir": {}} for name in names],
            [{"name": name, "mountPath": path} for name, path in zip(names, paths)])


def config_volume(run: ScalingRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rendered trainer config, mounted read-only: (volume, volumeMount)."""
    return (
        {"name": "config", "configMap": {"name": config_map_name(run)}},
        {"name": "config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True},
    )


def resources(cpu: str | None, memory: str | None, gpus: int = 0, cpu_limit: str | None = None,
              gpu_resource: str = DEFAULT_GPU_RESOURCE) -> dict[str, Any]:
    """Requests equal limits by default (Guaranteed QoS): measured, a CPU limit equal to the request cost a
    2-worker run no images/s (docs/operations.md, "CPU requests and limits"). `cpu_limit` sets another CPU
    limit (at least the request). GPUs (as `gpu_resource`) only as limits, as the device plugin expects: the API
    server sets an extended resource's request to its limit."""
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    limits = {k: v for k, v in (("cpu", cpu_limit or cpu), ("memory", memory)) if v is not None}
    if gpus:
        limits[gpu_resource] = gpus
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out
