"""The ScalingRun resource and its spec: storage, workers, launcher, run policy, tracking (dataset, model and
training have their own modules)."""

from __future__ import annotations

from enum import Enum
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .common import (
    DEFAULT_LIGHTNING_TRAINER_IMAGE, DEFAULT_TRAINER_IMAGE, DNS_SUBDOMAIN_PATTERN, EXTENDED_RESOURCE_PATTERN,
    HTTP_URL_PATTERN, IMAGE_REFERENCE_PATTERN, LABEL_VALUE_PATTERN, MAX_INTEGER, ApiModel, Duration, ObjectMeta,
    Quantity, duration_seconds, SecretName, secret_name_field,
)
from .status import ScalingRunStatus
from .dataset import CPU_LIMIT_DESCRIPTION, Dataset, Resources
from .model import Model, resolve_builtin_defaults
from .pods import PodOverride, PodRole, TaintEffect, Toleration, TolerationOperator  # noqa: F401 (the API's names)
from .training import Training


DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource
# /dev/shm of a worker without spec.workers.sharedMemory; a worker whose memory is under SMALL_POD_MEMORY gets half.
DEFAULT_SHARED_MEMORY, SMALL_POD_MEMORY = "1Gi", "2Gi"
# spec.workers.terminationGracePeriod's default: a training step, the checkpoint at it and its upload (Kubernetes' own
# default, 30 s, is short for a large model's).
DEFAULT_TERMINATION_GRACE_SECONDS = 60
# spec.workers.resizeAfter's default: long enough for a lost node's replacement (a spot node comes back in a minute
# or two), short enough that a run does not stand still for a spot pool's hours.
DEFAULT_RESIZE_AFTER_SECONDS = 300


class StorageCredentials(str, Enum):
    secret = "secret"
    pod_identity = "podIdentity"


class Storage(ApiModel):
    """Object storage used by the dataset, checkpoints and model. Credentials come from a Secret, or from the
    pods' own identity (IRSA, EKS Pod Identity, or any source of the AWS SDKs' default credential chain)."""

    endpoint: Optional[str] = Field(
        None,
        description="Endpoint URL of an S3-compatible store (e.g. http://minio.storage:9000). "
        "Omit for AWS S3.",
        pattern=HTTP_URL_PATTERN,
    )
    region: str = Field("us-east-1", description="Region of the bucket.", min_length=1)
    credentials: StorageCredentials = Field(
        StorageCredentials.secret,
        description="Where the pods' s3:// credentials come from: secret (credentialsSecret, required when any "
        "URI is s3://) or podIdentity (no keys: the AWS SDKs' default chain finds the pods' identity, from "
        "spec.workers.serviceAccountName's IRSA role or EKS Pod Identity association; the operator reads the "
        "run's documents with its own identity, see docs/security.md).",
    )
    credentials_secret: Optional[str] = secret_name_field(
        "Name of a Secret in the run's namespace holding the access key and secret key. "
        "Required when any URI is s3:// and credentials is secret; not allowed with podIdentity. "
        "Keys are never accepted inline."
    )
    access_key_id_key: str = Field(
        "AWS_ACCESS_KEY_ID", description="Key in the Secret holding the access key id.", min_length=1
    )
    secret_access_key_key: str = Field(
        "AWS_SECRET_ACCESS_KEY",
        description="Key in the Secret holding the secret access key.",
        min_length=1,
    )


class Workers(ApiModel):
    """The MPIJob workers: one training process per GPU (slotsPerWorker = gpusPerWorker), or one per worker using
    all of its GPUs under training.strategy multi-worker-mirrored (slotsPerWorker = 1)."""

    replicas: int = Field(1, ge=1, le=1024, description="Number of worker pods (usually nodes); with minReplicas, "
                          "the most.")
    min_replicas: Optional[int] = Field(
        None, ge=1, le=1024, description="Makes the run elastic: when workers are lost (node loss, preemption, "
        "eviction) or cannot be placed for resizeAfter, the run resumes from its last checkpoint with the workers "
        "that can be placed, never fewer than this (below it, it waits and says so), and grows back to replicas at "
        "an epoch boundary when capacity returns. The global batch stays replicas' (the trainer accumulates "
        "gradients). At most replicas. Absent: the run always trains with replicas workers.")
    # No default in the CRD: it means something only beside minReplicas (validate refuses it alone).
    resize_after: Optional[Duration] = Field(
        None, description="With minReplicas: how long lost workers may stay unplaced before the run shrinks to "
        f"the workers that can be placed (seconds or a duration). Default: {DEFAULT_RESIZE_AFTER_SECONDS} s.")
    gpus_per_worker: int = Field(
        1, ge=0, le=16, description="GPUs per worker, = training processes (MPI slots) per worker, except under "
        "multi-worker-mirrored (one process using them all); 0 trains on CPU (1 slot)."
    )
    # No default in the CRD: the API server would write one into the specs of runs started before the field.
    gpu_resource: Optional[str] = Field(
        None, description="The extended resource the GPUs are asked for as (limits of each worker): a MIG profile "
        f"such as nvidia.com/mig-3g.40gb, or another device plugin's (amd.com/gpu). Default: {DEFAULT_GPU_RESOURCE}.",
        pattern=EXTENDED_RESOURCE_PATTERN, max_length=253,
    )
    cpu: Optional[Quantity] = Field(None, description="CPU per worker, e.g. 8: request, and limit unless "
                                   "cpuLimit is set.")
    cpu_limit: Optional[Quantity] = Field(None, description=CPU_LIMIT_DESCRIPTION)
    memory: Optional[Quantity] = Field(None, description="Memory per worker, e.g. 32Gi: request and limit.")
    shared_memory: Optional[Quantity] = Field(
        None, description="Size of each worker's /dev/shm, a memory-backed emptyDir (a container's own is 64Mi: "
        "NCCL between the GPUs of a pod and DataLoader workers fail with bus errors beyond it). What is written there "
        f"counts against the worker's memory limit. Default: {DEFAULT_SHARED_MEMORY}, or half of memory when that is "
        f"under {SMALL_POD_MEMORY}.",
    )
    image: Optional[str] = Field(
        None,
        description=f"Trainer image (launcher, workers, preprocessing). Default: the engine's image for the devices: "
        f"{DEFAULT_TRAINER_IMAGE} (-gpu with gpusPerWorker above 0) for training.framework keras, "
        f"{DEFAULT_LIGHTNING_TRAINER_IMAGE} (-lightning-gpu with GPUs) for pytorch-lightning (the operator's "
        "trainerImages setting replaces their repository and tag, trainerImageDigests pins them). "
        "[registry/]path[:tag][@sha256:<64 hex>]: pin it by digest for a run that must be repeatable. validate and "
        "the operator warn about an image named -cpu beside a GPU request.",
        min_length=1, max_length=512, pattern=IMAGE_REFERENCE_PATTERN,
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the workers must have.")
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Tolerations of the workers. With GPUs asked for, the operator adds its "
        "gpuTolerations setting's (default: the nvidia.com/gpu and sku=gpu taints of GPU node pools) that these do "
        "not cover.")
    priority_class_name: Optional[str] = Field(
        None, description="PriorityClass of the workers.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    termination_grace_period: Duration = Field(
        DEFAULT_TERMINATION_GRACE_SECONDS,
        description="The workers' and the launcher's termination grace period (seconds or a duration): after "
        "SIGTERM (a preemption, a drain, a graceful node shutdown, the pod deleted) the trainer stops at the next "
        "training step and writes a checkpoint there, so that the next attempt resumes at that step; this must "
        "cover a step and the checkpoint's upload. The cloud bounds it: graceful node shutdown gives pods 15 s by "
        "default (GKE), a spot interruption notice comes 2 minutes ahead (AWS).")
    service_account_name: Optional[str] = Field(
        None, description="ServiceAccount of the run's pods (preprocessing, launcher, workers): the one an IAM "
        "role is bound to when spec.storage.credentials is podIdentity. Default: the namespace's default. "
        "Its API token is still not mounted (the pods never call the Kubernetes API).",
        pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    image_pull_secrets: list[SecretName] = Field(
        default_factory=list, description="Secrets in the run's namespace (kubernetes.io/dockerconfigjson), by name, "
        "that the run's pods (preprocessing, launcher, workers) pull their images with: a private registry or "
        "mirror. The ServiceAccount's own imagePullSecrets apply as well.")

    @property
    def elastic(self) -> bool:
        return self.min_replicas is not None

    @property
    def resize_after_seconds(self) -> int:
        return DEFAULT_RESIZE_AFTER_SECONDS if self.resize_after is None else duration_seconds(self.resize_after)


class LauncherResources(Resources):
    """CPU and memory of the launcher pod, as for the other pods. Each field has its own default."""

    cpu: Optional[Quantity] = Field("100m", description="CPU of the launcher, e.g. 100m or 1.")
    memory: Optional[Quantity] = Field("256Mi", description="Memory of the launcher, e.g. 256Mi.")


class Launcher(ApiModel):
    """The MPIJob launcher: it only runs mpirun (rank 0 trains on a worker), so it needs little."""

    resources: LauncherResources = Field(
        default_factory=LauncherResources,
        description="Resources of the launcher pod. Default cpu 100m, memory 256Mi: enough for mpirun, "
        "and small enough to fit beside the workers on a small node. Requests equal limits unless cpuLimit "
        "says otherwise.",
    )


class CleanPodPolicy(str, Enum):
    none = "None"
    running = "Running"
    all = "All"


class SchedulingPolicy(ApiModel):
    """Gang scheduling, passed through to Volcano or scheduler-plugins."""

    min_available: Optional[int] = Field(
        None, ge=1, le=MAX_INTEGER, description="Pods that must be schedulable together.")
    queue: Optional[str] = Field(None, description="Volcano queue.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    priority_class: Optional[str] = Field(
        None, description="PriorityClass of the gang.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    schedule_timeout_seconds: Optional[int] = Field(None, ge=1, le=MAX_INTEGER, description="Gang scheduling timeout.")


class RunPolicy(ApiModel):
    """How the MPIJob runs and is cleaned up."""

    backoff_limit: int = Field(
        3, ge=0, le=100, description="Launcher retries before the MPIJob fails. Rendered as this plus "
        "spec.training.maxInterruptions: the launcher's Job also counts the restarts a lost worker, a lost node or a "
        "stall causes, which the operator bounds by maxInterruptions; the code's failures are bounded by "
        "spec.training.backoffLimit.")
    active_deadline_seconds: Optional[int] = Field(
        None, ge=1, le=MAX_INTEGER, description="The training's deadline: the MPIJob (and so the run) fails after "
        "this many seconds of training, restarts included (the MPIJob's activeDeadlineSeconds). Default: none; "
        "spec.training.stallTimeout bounds a training that stops beating."
    )
    ttl_seconds_after_finished: Optional[int] = Field(
        None, ge=0, le=MAX_INTEGER, description="Delete the MPIJob this long after it finishes."
    )
    clean_pod_policy: CleanPodPolicy = Field(
        CleanPodPolicy.running,
        description="Pods to delete when the launcher ends; Running frees the workers' GPUs.",
    )
    suspend: bool = Field(False, description="Suspend the training; resuming continues from the checkpoint.")
    scheduling_policy: Optional[SchedulingPolicy] = Field(
        None, description="Gang scheduling; when set, the launcher is created at once (no WaitForWorkersReady)."
    )
    kueue_queue_name: Optional[str] = Field(
        None, description="Kueue LocalQueue; sets the kueue.x-k8s.io/queue-name label.", pattern=LABEL_VALUE_PATTERN,
        max_length=63
    )


class Tracking(ApiModel):
    """MLflow experiment tracking: rank 0 logs parameters, per-epoch metrics, the best epoch and the model URI."""

    mlflow_tracking_uri: str = Field(
        ..., description="MLflow tracking server URL, e.g. http://mlflow.mlops:5000.", pattern=HTTP_URL_PATTERN
    )
    experiment_name: Optional[str] = Field(
        None, description="MLflow experiment (created when missing); default: the run name.", min_length=1, max_length=500
    )
    credentials_secret: Optional[str] = secret_name_field(
        "Name of a Secret in the run's namespace with MLflow's own variables as keys: "
        "MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD."
    )


class ScalingRunSpec(ApiModel):
    """What to preprocess, which model to train, and on how many workers."""

    storage: Storage = Field(default_factory=Storage, description="Object storage and its credentials.")
    dataset: Dataset = Field(..., description="Source images (a JPEG tree, or a Parquet table), prepared Parquet, split.")
    model: Model = Field(default_factory=Model, description="The network: a base and head, or your own builder.")
    training: Training = Field(default_factory=Training, description="Optimizer, batch, learning rate, epochs.")
    workers: Workers = Field(default_factory=Workers, description="MPIJob workers.")
    launcher: Launcher = Field(default_factory=Launcher, description="MPIJob launcher (runs mpirun).")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Retries, deadlines, cleanup, scheduling.")
    tracking: Optional[Tracking] = Field(None, description="Experiment tracking (MLflow).")
    pod_overrides: list[PodOverride] = Field(
        default_factory=list, max_length=32,
        description="What the cluster needs on the run's pods (labels, annotations, volumes, env, placement), per "
        "role: each override applies to the pods of its targets, in order. The fields the operator sets (its labels "
        "and environment, its volumes and mounts) cannot be overridden; hostPath volumes only where the operator "
        "allows them (the chart's runs.allowHostPath).")

    @model_validator(mode="after")
    def _builtin_network_defaults(self) -> "ScalingRunSpec":
        # Not in the CRD (see model.py): a builder or a command never gets a base it did not ask for.
        resolve_builtin_defaults(self.model, self.training.command)
        return self


class ScalingRun(BaseModel):
    """A ScalingRun resource: preprocessing Job, then a Horovod MPIJob, with status."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["scalingrun.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["ScalingRun"]
    metadata: ObjectMeta
    spec: ScalingRunSpec
    status: Optional[ScalingRunStatus] = None
