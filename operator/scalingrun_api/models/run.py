"""The ScalingRun resource and its spec: storage, dataset, workers, launcher, run policy, tracking."""

from __future__ import annotations

from enum import Enum
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .common import (
    DATA_URI_PATTERN, DEFAULT_LIGHTNING_TRAINER_IMAGE, DEFAULT_TRAINER_IMAGE, DNS_SUBDOMAIN_PATTERN, HTTP_URL_PATTERN,
    LABEL_VALUE_PATTERN, MAX_INTEGER, ApiModel, ObjectMeta, Quantity, secret_name_field,
)
from .status import ScalingRunStatus
from .training import Model, Training


class Storage(ApiModel):
    """Object storage used by the dataset, checkpoints and model. Credentials come only from a Secret."""

    endpoint: Optional[str] = Field(
        None,
        description="Endpoint URL of an S3-compatible store (e.g. http://minio.storage:9000). "
        "Omit for AWS S3.",
        pattern=HTTP_URL_PATTERN,
    )
    region: str = Field("us-east-1", description="Region of the bucket.", min_length=1)
    credentials_secret: Optional[str] = secret_name_field(
        "Name of a Secret in the run's namespace holding the access key and secret key. "
        "Required when any URI is s3://. Keys are never accepted inline."
    )
    access_key_id_key: str = Field(
        "AWS_ACCESS_KEY_ID", description="Key in the Secret holding the access key id.", min_length=1
    )
    secret_access_key_key: str = Field(
        "AWS_SECRET_ACCESS_KEY",
        description="Key in the Secret holding the secret access key.",
        min_length=1,
    )


# Measured in docs/operations.md ("CPU requests and limits"): a CPU limit equal to the request cost a 2-worker
# run no images/s, so requests equal limits unless cpuLimit says otherwise.
CPU_LIMIT_DESCRIPTION = (
    "CPU limit, at least cpu: a CFS quota per 100 ms. Default: equal to cpu (with memory, Guaranteed QoS). "
    "Set it higher to let the pod use idle CPU beyond its request, e.g. the node's cores for a quota that "
    "never binds."
)


class Resources(ApiModel):
    """CPU and memory for each pod: requests equal limits (Guaranteed QoS), unless cpuLimit sets another CPU
    limit."""

    cpu: Optional[Quantity] = Field(None, description="CPU cores, e.g. 4 or 3500m: request, and limit unless "
                                   "cpuLimit is set.")
    memory: Optional[Quantity] = Field(None, description="Memory, e.g. 16Gi: request and limit.")
    cpu_limit: Optional[Quantity] = Field(None, description=CPU_LIMIT_DESCRIPTION)


class Preprocessing(ApiModel):
    """The preprocessing Job that turns the JPEG tree into Parquet shards."""

    parallelism: int = Field(
        4,
        ge=1,
        le=256,
        description="Number of shards processed in parallel (an Indexed Job with this many "
        "completions); each shard handles a deterministic share of the files.",
    )
    max_bad_fraction: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Fail when more than this fraction of the source files cannot be decoded; "
        "below it, bad files are skipped and counted.",
    )
    backoff_limit: int = Field(2, ge=0, le=20, description="Retries per shard before the Job fails.")
    resources: Resources = Field(
        default_factory=lambda: Resources(cpu=1, memory="2Gi"),
        description="Resources of each preprocessing pod.",
    )
    readers: Optional[int] = Field(
        None,
        ge=1,
        le=16384,
        description="Horovod processes the dataset is laid out for (>= 2 row groups per process and split); "
        "default and minimum: this run's processes. A ScalingSweep sets its largest point's, so that every "
        "point reads one dataset.",
    )


class Dataset(ApiModel):
    """Where the raw images are, where the Parquet goes, and how it is split."""

    source: str = Field(
        ...,
        description="URI of a JPEG tree with one folder per class (s3://bucket/prefix or an "
        "absolute local path). Classes are the sorted folder names.",
        pattern=DATA_URI_PATTERN,
    )
    output: str = Field(
        ...,
        description="URI where the labelled Parquet shards (train/ and validation/) are written.",
        pattern=DATA_URI_PATTERN,
    )
    image_size: int = Field(
        299,
        ge=32,
        le=1024,
        description="Side of the square images: resized with aspect kept, padded to a square.",
    )
    validation_fraction: float = Field(
        0.1, gt=0, lt=1, description="Fraction of the images held out for validation."
    )
    sample_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Deterministic fraction of the source to use; start small, then grow.",
    )
    seed: int = Field(42, ge=0, le=MAX_INTEGER, description="Seed of the per-file split and sample.")
    preprocessing: Preprocessing = Field(
        default_factory=Preprocessing, description="The preprocessing Job."
    )


class TolerationOperator(str, Enum):
    exists = "Exists"
    equal = "Equal"


class TaintEffect(str, Enum):
    no_schedule = "NoSchedule"
    prefer_no_schedule = "PreferNoSchedule"
    no_execute = "NoExecute"


class Toleration(ApiModel):
    """A pod toleration, as in the Pod API."""

    key: Optional[str] = Field(None, description="Taint key; empty with Exists matches all taints.")
    operator: TolerationOperator = Field(TolerationOperator.equal, description="Exists or Equal.")
    value: Optional[str] = Field(None, description="Taint value for Equal.", pattern=LABEL_VALUE_PATTERN, max_length=63)
    effect: Optional[TaintEffect] = Field(None, description="Taint effect to match; empty matches all.")
    toleration_seconds: Optional[int] = Field(
        None, ge=0, le=MAX_INTEGER, description="For NoExecute: how long to stay bound.")


class Workers(ApiModel):
    """The MPIJob workers: one Horovod process per GPU (slotsPerWorker = gpusPerWorker)."""

    replicas: int = Field(1, ge=1, le=1024, description="Number of worker pods (usually nodes).")
    gpus_per_worker: int = Field(
        1, ge=0, le=16, description="GPUs per worker, = Horovod slots per worker; 0 trains on CPU (1 slot)."
    )
    cpu: Optional[Quantity] = Field(None, description="CPU per worker, e.g. 8: request, and limit unless "
                                   "cpuLimit is set.")
    cpu_limit: Optional[Quantity] = Field(None, description=CPU_LIMIT_DESCRIPTION)
    memory: Optional[Quantity] = Field(None, description="Memory per worker, e.g. 32Gi: request and limit.")
    image: Optional[str] = Field(
        None,
        description=f"Trainer image (launcher, workers, preprocessing). Default: {DEFAULT_TRAINER_IMAGE} for "
        f"training.framework keras, {DEFAULT_LIGHTNING_TRAINER_IMAGE} for pytorch-lightning.",
        min_length=1,
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the workers must have.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations of the workers.")
    priority_class_name: Optional[str] = Field(
        None, description="PriorityClass of the workers.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)


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

    backoff_limit: int = Field(3, ge=0, le=100, description="Launcher retries before the run fails.")
    active_deadline_seconds: Optional[int] = Field(
        None, ge=1, le=MAX_INTEGER, description="Fail the training after this many seconds."
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
    dataset: Dataset = Field(..., description="Source images, Parquet output and split.")
    model: Model = Field(default_factory=Model, description="Base network and head.")
    training: Training = Field(default_factory=Training, description="Optimizer, batch, learning rate, epochs.")
    workers: Workers = Field(default_factory=Workers, description="MPIJob workers.")
    launcher: Launcher = Field(default_factory=Launcher, description="MPIJob launcher (runs mpirun).")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Retries, deadlines, cleanup, scheduling.")
    tracking: Optional[Tracking] = Field(None, description="Experiment tracking (MLflow).")


class ScalingRun(BaseModel):
    """A ScalingRun resource: preprocessing Job, then a Horovod MPIJob, with status."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["scalingrun.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["ScalingRun"]
    metadata: ObjectMeta
    spec: ScalingRunSpec
    status: Optional[ScalingRunStatus] = None
