"""The ScalingRun API (`scalingrun.dev/v1alpha1`): the single source of truth.

The CRD in manifests/ and in the chart is generated from these models (`scalingrun crd`);
field descriptions become `kubectl explain` text. Only pydantic here: no kopf, no TensorFlow.
"""

from __future__ import annotations

import datetime as dt
from enum import Enum
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError
from pydantic.alias_generators import to_camel

GROUP = "scalingrun.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ScalingRun"
PLURAL = "scalingruns"
SINGULAR = "scalingrun"
SHORT_NAMES = ["srun"]

DEFAULT_TRAINER_IMAGE = "ghcr.io/scalingrun/trainer:0.1.0"
# The trainer image of a pytorch-lightning run when spec.workers.image is not set (torch, no TensorFlow/Horovod).
DEFAULT_LIGHTNING_TRAINER_IMAGE = "ghcr.io/scalingrun/trainer:0.1.0-lightning-cpu"

# s3:// (any S3-compatible store), file:// or an absolute local path.
DATA_URI_PATTERN = r"^(s3://[a-z0-9][a-z0-9.\-]{1,62}(/.*)?|file:///.*|/.*)$"
WEIGHTS_PATTERN = r"^(imagenet|none|s3://.+|gs://.+|https?://.+|file:///.+|/.+)$"
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # a DNS subdomain, as Secret names are
HTTP_URL_PATTERN = r"^https?://[^\s/]+(/.*)?$"
DNS_SUBDOMAIN_PATTERN = SECRET_NAME_PATTERN  # PriorityClass and Volcano queue names too
LABEL_VALUE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"  # at most 63 characters
# A positive Kubernetes resource quantity, e.g. 500m, 4, 16Gi: some digit other than 0 (no zero CPU or memory).
# No lookahead: the API server's regexps (RE2) and pydantic's (Rust) have none.
QUANTITY_PATTERN = r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"

# Users write `cpu: 4` or `memory: 16Gi`; kept as a string, declared int-or-string in the CRD.
Quantity = Annotated[
    str,
    BeforeValidator(lambda v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v),
    Field(pattern=QUANTITY_PATTERN),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string"}], "pattern": QUANTITY_PATTERN}
    ),
]


AUTO = "auto"
MAX_BATCH_SIZE = 65536


def _batch_size(value: object) -> int | str:
    """An integer in [1, 65536] or "auto"; strict: "32" (a string) is not 32."""
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError("batch_size", 'Input should be a valid integer >= 1 or "auto"')
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise PydanticCustomError("batch_size", f"Input should be greater than or equal to 1 and at most "
                                  f"{MAX_BATCH_SIZE}, or \"auto\"")
    return value


# batchSizePerWorker: a number, or "auto" (a probe before training picks it). Int-or-string in the CRD: the
# bounds apply to integers and the pattern to strings.
BatchSize = Annotated[
    int | str,
    PlainValidator(_batch_size),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "minimum": 1, "maximum": MAX_BATCH_SIZE,
                    "pattern": f"^{AUTO}$"}),
]


class _Model(BaseModel):
    """camelCase on the wire, unknown fields rejected (a typo must not silently become a default)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,  # enum defaults become plain strings too
    )


def _secret_name_field(description: str):
    """An optional reference to a Secret in the run's namespace, by name: never the values themselves."""
    return Field(None, description=description, pattern=SECRET_NAME_PATTERN, max_length=253)


# --- spec -----------------------------------------------------------------------------------------


class Storage(_Model):
    """Object storage used by the dataset, checkpoints and model. Credentials come only from a Secret."""

    endpoint: Optional[str] = Field(
        None,
        description="Endpoint URL of an S3-compatible store (e.g. http://minio.storage:9000). "
        "Omit for AWS S3.",
        pattern=HTTP_URL_PATTERN,
    )
    region: str = Field("us-east-1", description="Region of the bucket.", min_length=1)
    credentials_secret: Optional[str] = _secret_name_field(
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


class Resources(_Model):
    """CPU and memory for each pod; requests equal limits so the pod is Guaranteed."""

    cpu: Optional[Quantity] = Field(None, description="CPU cores, e.g. 4 or 3500m.")
    memory: Optional[Quantity] = Field(None, description="Memory, e.g. 16Gi.")


class Preprocessing(_Model):
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


class Dataset(_Model):
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
    seed: int = Field(42, ge=0, description="Seed of the per-file split and sample.")
    preprocessing: Preprocessing = Field(
        default_factory=Preprocessing, description="The preprocessing Job."
    )


class BaseNetwork(str, Enum):
    efficientnet_lite0 = "efficientnet_lite0"
    mobilenet_v2 = "mobilenet_v2"
    xception = "xception"


class Model(_Model):
    """Transfer learning: a pretrained base network plus a small softmax head."""

    base: BaseNetwork = Field(
        BaseNetwork.efficientnet_lite0, description="Pretrained base network (include_top=False)."
    )
    weights: str = Field(
        "imagenet",
        description="imagenet, none (random init), or the URI of a weights file.",
        pattern=WEIGHTS_PATTERN,
    )
    trainable_base: bool = Field(
        False, description="Fine-tune the base too; by default it is frozen and only the head trains."
    )
    dropout: float = Field(0.2, ge=0, lt=1, description="Dropout before the softmax head.")
    num_classes: Optional[int] = Field(
        None, ge=2, le=100000, description="Number of classes; inferred from the dataset when omitted."
    )


class Optimizer(str, Enum):
    nadam = "nadam"
    adam = "adam"
    sgd = "sgd"


class LearningRateScaling(str, Enum):
    linear = "linear"
    sqrt = "sqrt"
    none = "none"


class Framework(str, Enum):
    keras = "keras"
    pytorch_lightning = "pytorch-lightning"


class Monitor(str, Enum):
    val_loss = "val_loss"
    val_accuracy = "val_accuracy"
    loss = "loss"
    accuracy = "accuracy"


class EarlyStopping(_Model):
    """Stop when the monitored metric stops improving; all ranks stop on the same epoch."""

    enabled: bool = Field(True, description="Use early stopping.")
    monitor: Monitor = Field(Monitor.val_loss, description="Metric to watch (averaged across workers).")
    patience: int = Field(3, ge=0, le=1000, description="Epochs without improvement before stopping.")
    min_delta: float = Field(0.0, ge=0, description="Smallest change that counts as an improvement.")
    restore_best_weights: bool = Field(
        True, description="Keep the weights of the best epoch, not the last one."
    )
    stopping_threshold: Optional[float] = Field(
        None, description="Stop as soon as the monitored metric reaches this value."
    )


class Checkpoint(_Model):
    """Checkpoints, progress and the final model, written by rank 0 only."""

    location: Optional[str] = Field(
        None,
        description="URI for checkpoints, progress and the final model. "
        "Default: <dataset.output>/runs/<run name>.",
        pattern=DATA_URI_PATTERN,
    )
    every_epochs: int = Field(1, ge=1, le=1000, description="Write a checkpoint every N epochs.")


class InputPipeline(_Model):
    """The training reader (Petastorm over the Parquet shards): what to raise when InputBound is True."""

    reader_workers: int = Field(
        4, ge=1, le=64, description="Threads per process that read and decode Parquet row groups."
    )
    row_group_cache: int = Field(
        50,
        ge=1,
        le=10000,
        description="Row groups each process reads ahead and keeps in memory (Petastorm's results queue).",
    )


class Training(_Model):
    """Data-parallel training (Keras + Horovod, or PyTorch Lightning DDP). The learning rate is scaled with the
    number of processes."""

    framework: Framework = Field(
        Framework.keras,
        description="keras: tf.keras with Horovod (the default image). pytorch-lightning: PyTorch Lightning DDP "
        "(gloo on CPU, nccl on GPU) over the same MPIJob, in the Lightning image; it trains only base "
        "efficientnet_lite0 and saves the model as TorchScript (model.pt).",
    )
    optimizer: Optimizer = Field(Optimizer.nadam, description="Optimizer, wrapped by Horovod.")
    batch_size_per_worker: BatchSize = Field(
        32,
        description="Batch size of each Horovod process; effective = x processes. \"auto\": before training, "
        "a short probe on one worker doubles the batch size from 8 until out-of-memory or a ceiling and takes "
        "the smallest size within 5 % of the best images/s; baseLearningRate then counts for a batch of 32 "
        "on one process and is scaled by learningRateScaling with effective batch / 32.",
    )
    base_learning_rate: float = Field(
        0.001, gt=0, le=10, description="Learning rate for one process, before scaling."
    )
    learning_rate_scaling: LearningRateScaling = Field(
        LearningRateScaling.linear,
        description="How the learning rate grows with the number of processes N: x N (linear), "
        "x sqrt(N) (sqrt) or unchanged (none).",
    )
    max_epochs: int = Field(20, ge=1, le=10000, description="Upper bound on epochs.")
    early_stopping: EarlyStopping = Field(default_factory=EarlyStopping, description="Early stopping.")
    checkpoint: Checkpoint = Field(default_factory=Checkpoint, description="Checkpoint location and frequency.")
    resume: bool = Field(True, description="Continue from the latest checkpoint of this run when one exists.")
    backoff_limit: int = Field(
        3, ge=0, le=1000, description="Interruptions allowed before the run fails: worker pods lost, launcher "
        "restarts and children (Job, MPIJob) deleted mid-run, all counted in status.training.restarts.")
    input: InputPipeline = Field(default_factory=InputPipeline, description="The training reader's threads and "
                                 "read-ahead.")


class TolerationOperator(str, Enum):
    exists = "Exists"
    equal = "Equal"


class TaintEffect(str, Enum):
    no_schedule = "NoSchedule"
    prefer_no_schedule = "PreferNoSchedule"
    no_execute = "NoExecute"


class Toleration(_Model):
    """A pod toleration, as in the Pod API."""

    key: Optional[str] = Field(None, description="Taint key; empty with Exists matches all taints.")
    operator: TolerationOperator = Field(TolerationOperator.equal, description="Exists or Equal.")
    value: Optional[str] = Field(None, description="Taint value for Equal.", pattern=LABEL_VALUE_PATTERN, max_length=63)
    effect: Optional[TaintEffect] = Field(None, description="Taint effect to match; empty matches all.")
    toleration_seconds: Optional[int] = Field(None, ge=0, description="For NoExecute: how long to stay bound.")


class Workers(_Model):
    """The MPIJob workers: one Horovod process per GPU (slotsPerWorker = gpusPerWorker)."""

    replicas: int = Field(1, ge=1, le=1024, description="Number of worker pods (usually nodes).")
    gpus_per_worker: int = Field(
        1, ge=0, le=16, description="GPUs per worker, = Horovod slots per worker; 0 trains on CPU (1 slot)."
    )
    cpu: Optional[Quantity] = Field(None, description="CPU per worker, e.g. 8.")
    memory: Optional[Quantity] = Field(None, description="Memory per worker, e.g. 32Gi.")
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
    """CPU and memory of the launcher pod; requests equal limits. Each field has its own default."""

    cpu: Optional[Quantity] = Field("100m", description="CPU of the launcher, e.g. 100m or 1.")
    memory: Optional[Quantity] = Field("256Mi", description="Memory of the launcher, e.g. 256Mi.")


class Launcher(_Model):
    """The MPIJob launcher: it only runs mpirun (rank 0 trains on a worker), so it needs little."""

    resources: LauncherResources = Field(
        default_factory=LauncherResources,
        description="Resources of the launcher pod. Default cpu 100m, memory 256Mi: enough for mpirun, "
        "and small enough to fit beside the workers on a small node. Requests equal limits.",
    )


class CleanPodPolicy(str, Enum):
    none = "None"
    running = "Running"
    all = "All"


class SchedulingPolicy(_Model):
    """Gang scheduling, passed through to Volcano or scheduler-plugins."""

    min_available: Optional[int] = Field(None, ge=1, description="Pods that must be schedulable together.")
    queue: Optional[str] = Field(None, description="Volcano queue.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    priority_class: Optional[str] = Field(
        None, description="PriorityClass of the gang.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    schedule_timeout_seconds: Optional[int] = Field(None, ge=1, description="Gang scheduling timeout.")


class RunPolicy(_Model):
    """How the MPIJob runs and is cleaned up."""

    backoff_limit: int = Field(3, ge=0, le=100, description="Launcher retries before the run fails.")
    active_deadline_seconds: Optional[int] = Field(
        None, ge=1, description="Fail the training after this many seconds."
    )
    ttl_seconds_after_finished: Optional[int] = Field(
        None, ge=0, description="Delete the MPIJob this long after it finishes."
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


class Tracking(_Model):
    """MLflow experiment tracking: rank 0 logs parameters, per-epoch metrics, the best epoch and the model URI."""

    mlflow_tracking_uri: str = Field(
        ..., description="MLflow tracking server URL, e.g. http://mlflow.mlops:5000.", pattern=HTTP_URL_PATTERN
    )
    experiment_name: Optional[str] = Field(
        None, description="MLflow experiment (created when missing); default: the run name.", min_length=1, max_length=500
    )
    credentials_secret: Optional[str] = _secret_name_field(
        "Name of a Secret in the run's namespace with MLflow's own variables as keys: "
        "MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD."
    )


class ScalingRunSpec(_Model):
    """What to preprocess, which model to train, and on how many workers."""

    storage: Storage = Field(default_factory=Storage, description="Object storage and its credentials.")
    dataset: Dataset = Field(..., description="Source images, Parquet output and split.")
    model: Model = Field(default_factory=Model, description="Base network and head.")
    training: Training = Field(default_factory=Training, description="Optimizer, batch, learning rate, epochs.")
    workers: Workers = Field(default_factory=Workers, description="MPIJob workers.")
    launcher: Launcher = Field(default_factory=Launcher, description="MPIJob launcher (runs mpirun).")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Retries, deadlines, cleanup, scheduling.")
    tracking: Optional[Tracking] = Field(None, description="Experiment tracking (MLflow).")


# --- status ---------------------------------------------------------------------------------------


class Phase(str, Enum):
    pending = "Pending"
    preprocessing = "Preprocessing"
    training = "Training"
    succeeded = "Succeeded"
    failed = "Failed"
    suspended = "Suspended"


class Condition(_Model):
    """A Kubernetes-style condition."""

    type: str = Field(..., description="e.g. Ready, Preprocessed, Trained, Failed, Suspended.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: Optional[str] = Field(None, description="CamelCase reason, e.g. PreprocessingFailed.")
    message: Optional[str] = Field(None, description="What happened and what to do about it.")
    last_transition_time: Optional[str] = Field(None, description="When the status last changed (RFC 3339).")
    observed_generation: Optional[int] = Field(None, description="Generation the condition was set for.")


class PreprocessingStatus(_Model):
    """Facts about the preprocessing step."""

    job_name: Optional[str] = Field(None, description="Name of the preprocessing Job.")
    reused: Optional[bool] = Field(None, description="True when a dataset with the same fingerprint existed.")
    fingerprint: Optional[str] = Field(None, description="Fingerprint of inputs and parameters.")
    images_written: Optional[int] = Field(None, description="Images written to Parquet.")
    images_skipped: Optional[int] = Field(None, description="Undecodable files skipped.")
    shards: Optional[int] = Field(None, description="Number of preprocessing shards.")
    classes: Optional[int] = Field(None, description="Number of classes found.")


class TrainingPod(_Model):
    """A launcher or worker pod as the operator last saw it: what interruptions are counted against."""

    name: str = Field(..., description="Pod name.")
    uid: str = Field(..., description="Pod UID: a new pod under the same name is a replacement.")
    role: Literal["launcher", "worker"] = Field(..., description="launcher or worker.")
    restarts: int = Field(0, description="Container restarts of this pod already counted.")
    lost: bool = Field(False, description="True once the pod's loss (failed, evicted, deleted) was counted.")


class ProbedBatchSize(_Model):
    """One batch size the probe tried."""

    batch_size: int = Field(..., description="Batch size per process.")
    images_per_second: Optional[float] = Field(None, description="Training throughput of one process at it.")
    out_of_memory: bool = Field(False, description="True when this size ran out of memory (the probe stopped).")


class BatchSizeProbe(_Model):
    """How batchSizePerWorker: auto was chosen."""

    chosen: Optional[int] = Field(None, description="The batch size per process the probe picked.")
    seconds: Optional[float] = Field(None, description="How long the probe took (before the first epoch).")
    stopped_by: Optional[str] = Field(None, description="outOfMemory or ceiling: why no larger size was tried.")
    table: list[ProbedBatchSize] = Field(default_factory=list, description="Sizes tried, smallest first.")


class InputEpoch(_Model):
    """Input-pipeline figures of one epoch."""

    epoch: int = Field(..., description="Epoch (1-based).")
    input_wait_fraction: Optional[float] = Field(
        None, description="Share of training step time spent waiting for input batches (0-1).")
    gpu_utilization: Optional[float] = Field(None, description="Mean GPU utilisation in percent (NVML); none on CPU.")


class TrainingStatus(_Model):
    """Progress of the training, mirrored from the trainer's progress document."""

    mpi_job_name: Optional[str] = Field(None, description="Name of the MPIJob.")
    processes: Optional[int] = Field(None, description="Horovod processes (replicas x slots).")
    epoch: Optional[int] = Field(None, description="Last finished epoch (1-based).")
    max_epochs: Optional[int] = Field(None, description="Epoch limit.")
    best_epoch: Optional[int] = Field(None, description="Epoch with the best monitored metric.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Metrics of the last epoch.")
    best_metrics: dict[str, float] = Field(default_factory=dict, description="Metrics of the best epoch.")
    images_per_second: Optional[float] = Field(None, description="Training throughput, all processes.")
    learning_rate: Optional[float] = Field(None, description="Scaled learning rate in use.")
    effective_batch_size: Optional[int] = Field(None, description="Batch size across all processes.")
    mlflow_run_id: Optional[str] = Field(None, description="MLflow run the trainer logs to, when tracking is set.")
    launcher_log_tail: Optional[str] = Field(
        None, description="When the MPIJob failed: the last 20 lines of the failed launcher's log (at most 4000 "
        "characters, the end kept).")
    resumed_from_epoch: Optional[int] = Field(
        None, description="Epoch the current attempt resumed from (its last checkpoint); none for a fresh start.")
    restarts: Optional[int] = Field(
        None, description="Interruptions of the training: worker pods lost plus launcher restarts. Each has an "
        "Event naming the pod and the reason.")
    worker_pods_lost: Optional[int] = Field(None, description="Worker pods deleted, evicted or failed.")
    launcher_restarts: Optional[int] = Field(None, description="Launcher restarts (container or new pod).")
    mpi_job_uid: Optional[str] = Field(
        None, description="UID of the MPIJob these figures belong to; a new MPIJob starts them again.")
    batch_size_per_worker: Optional[int] = Field(
        None, description="Batch size per process in use (the probe's choice when the spec says auto).")
    batch_size_probe: Optional[BatchSizeProbe] = Field(None, description="The auto batch-size probe, when it ran.")
    input_wait_fraction: Optional[float] = Field(
        None, description="Last epoch's share of step time spent waiting for input (0-1).")
    gpu_utilization: Optional[float] = Field(None, description="Last epoch's mean GPU utilisation in percent.")
    input_history: list[InputEpoch] = Field(
        default_factory=list, description="Input wait and GPU utilisation of the last epochs (InputBound reads it).")
    pods: list[TrainingPod] = Field(
        default_factory=list, description="Launcher and worker pods as last seen, so that a restarted operator "
        "neither counts an interruption twice nor misses one.")


class ScalingRunStatus(_Model):
    """Observed state, written by the operator (or by `scalingrun run --local`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    phase: Optional[Phase] = Field(None, description="Pending, Preprocessing, Training, Succeeded, Failed or Suspended.")
    message: Optional[str] = Field(
        None, description="What the run is doing now, or what holds it up (e.g. an image that cannot be pulled, "
        "pods that cannot be scheduled) and what to do about it.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions with reasons.")
    observed_generation: Optional[int] = Field(None, description="Spec generation last acted upon.")
    preprocessing: Optional[PreprocessingStatus] = Field(None, description="Preprocessing facts.")
    training: Optional[TrainingStatus] = Field(None, description="Training facts.")
    model_uri: Optional[str] = Field(None, description="Where the final model was saved.")
    start_time: Optional[dt.datetime] = Field(None, description="When the run started.")
    completion_time: Optional[dt.datetime] = Field(None, description="When the run finished.")


class ObjectMeta(BaseModel):
    """The parts of metadata we read; the rest is kept as is."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(..., min_length=1, max_length=40, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    namespace: Optional[str] = None


class ScalingRun(BaseModel):
    """A ScalingRun resource: preprocessing Job, then a Horovod MPIJob, with status."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["scalingrun.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["ScalingRun"]
    metadata: ObjectMeta
    spec: ScalingRunSpec
    status: Optional[ScalingRunStatus] = None


# --- ScalingSweep ---------------------------------------------------------------------------------

SWEEP_KIND = "ScalingSweep"
SWEEP_PLURAL = "scalingsweeps"
SWEEP_SINGULAR = "scalingsweep"
SWEEP_SHORT_NAMES = ["ssweep"]


class ScalingSweepSpec(_Model):
    """The same ScalingRun at several worker counts, one point after another, on one preprocessed dataset."""

    template: ScalingRunSpec = Field(
        ..., description="The ScalingRun spec of every point; each point sets workers.replicas (and "
        "workers.gpusPerWorker when given) and the learning rate follows training.learningRateScaling.")
    workers: list[Annotated[int, Field(ge=1, le=1024)]] = Field(
        ..., min_length=1, max_length=16,
        description="Worker counts, one point each, e.g. [1, 2, 4, 8]; unique. The first point is the "
        "baseline of speedup and efficiency.")
    gpus_per_worker: Optional[list[Annotated[int, Field(ge=0, le=16)]]] = Field(
        None, min_length=1, max_length=16,
        description="GPUs per worker of each point (same length as workers); default: "
        "template.workers.gpusPerWorker for every point.")
    max_parallel: int = Field(
        1, ge=1, le=16, description="Points that may run at once; 1 keeps them from competing for nodes.")
    efficiency_threshold: float = Field(
        0.7, gt=0, le=1, description="Lowest efficiency (speedup / scale) a recommended point may have.")
    accuracy_tolerance: float = Field(
        0.01, ge=0, le=1,
        description="How far below the best point's best val_accuracy a recommended point may be.")


class SweepPhase(str, Enum):
    pending = "Pending"
    running = "Running"
    succeeded = "Succeeded"
    failed = "Failed"


class SweepPoint(_Model):
    """One point of the sweep: its child ScalingRun and what it measured."""

    run: str = Field(..., description="Name of the child ScalingRun.")
    workers: int = Field(..., description="Worker pods.")
    gpus_per_worker: int = Field(..., description="GPUs per worker (0: CPU, one process per worker).")
    processes: int = Field(..., description="Horovod processes (workers x slots).")
    phase: Optional[str] = Field(None, description="Phase of the child ScalingRun; none before it exists.")
    effective_batch_size: Optional[int] = Field(None, description="Batch size across all processes.")
    learning_rate: Optional[float] = Field(None, description="Scaled learning rate the point trained with.")
    epochs: Optional[int] = Field(None, description="Epochs run (early stopping may end a point sooner).")
    best_val_accuracy: Optional[float] = Field(None, description="val_accuracy of the best epoch.")
    best_val_loss: Optional[float] = Field(None, description="val_loss of the best epoch.")
    wall_seconds: Optional[float] = Field(None, description="Training wall time of the point, in seconds.")
    seconds_per_epoch: Optional[float] = Field(None, description="wallSeconds / epochs.")
    images_per_second: Optional[float] = Field(None, description="Median training throughput of its epochs.")
    speedup: Optional[float] = Field(
        None, description="Seconds per epoch of the first point / this point's seconds per epoch.")
    efficiency: Optional[float] = Field(
        None, description="speedup / scale, where scale = processes / the first point's processes; 1 is linear.")
    worker_hours: Optional[float] = Field(None, description="processes x wall time, in hours: the cost.")


class SweepRecommendation(_Model):
    """The largest point that still scales (efficiency >= threshold) and trains as well (accuracy within tolerance)."""

    run: str = Field(..., description="The recommended point's ScalingRun.")
    workers: int = Field(..., description="Its worker count.")
    processes: int = Field(..., description="Its Horovod processes.")
    message: str = Field(..., description="Why this point, and what the larger points lost.")


class ScalingSweepStatus(_Model):
    """Observed state of the sweep, written by the operator (or printed by `scalingrun sweep --local`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    phase: Optional[SweepPhase] = Field(None, description="Pending, Running, Succeeded or Failed.")
    message: Optional[str] = Field(None, description="What the sweep is doing now, or why it stopped.")
    progress: Optional[str] = Field(None, description="Points finished / points, e.g. 2/4.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions with reasons.")
    observed_generation: Optional[int] = Field(None, description="Spec generation last acted upon.")
    points: list[SweepPoint] = Field(default_factory=list, description="One row per point, in spec order.")
    recommendation: Optional[SweepRecommendation] = Field(
        None, description="Set when every point has finished.")
    start_time: Optional[dt.datetime] = Field(None, description="When the first point started.")
    completion_time: Optional[dt.datetime] = Field(None, description="When the last point finished.")


class ScalingSweep(BaseModel):
    """A ScalingSweep resource: one child ScalingRun per worker count, with a scaling table and a recommendation."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["scalingrun.dev/v1alpha1"] = Field(..., alias="apiVersion")
    kind: Literal["ScalingSweep"]
    metadata: ObjectMeta
    spec: ScalingSweepSpec
    status: Optional[ScalingSweepStatus] = None
