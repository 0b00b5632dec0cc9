"""spec.training: how data-parallel training runs (our trainer, or your own command)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator

from .common import BatchSize, DATA_URI_PATTERN, ApiModel, Duration, DurationOrAuto

# Where every pod of a run finds the trainer config (the operator mounts its ConfigMap there), and the variable that
# tells a training.command's ranks (the SDK) where it is; the local runner points it at its own file.
CONFIG_PATH = "/etc/scalingrun/config.json"
CONFIG_VARIABLE = "SCALINGRUN_CONFIG"


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


class Strategy(str, Enum):
    """How the replicas of a framework train together."""

    horovod = "horovod"
    multi_worker_mirrored = "multi-worker-mirrored"
    ddp = "ddp"


# Each framework's strategies, its default first. A strategy outside its framework's list is refused (by the
# operator's validation: the CRD of a 1.20 API server cannot relate two fields).
FRAMEWORK_STRATEGIES: dict[str, tuple[str, ...]] = {
    Framework.keras.value: (Strategy.horovod.value, Strategy.multi_worker_mirrored.value),
    Framework.pytorch_lightning.value: (Strategy.ddp.value,),
}


class FeatureCacheMode(str, Enum):
    auto = "auto"
    off = "off"


def _feature_cache_word(value: object) -> object:
    """YAML 1.1 (PyYAML, and kubectl's parser) reads an unquoted `off` or `no` as false, `on` or `yes` as true:
    taken as meant, false as off and true as auto (the cache on)."""
    if isinstance(value, bool):
        return FeatureCacheMode.auto if value else FeatureCacheMode.off
    return value


# The CRD admits the booleans too: a 1.20 structural schema has no anyOf of types, so the node is untyped
# (x-kubernetes-preserve-unknown-fields) and its enum holds both words and both booleans.
FeatureCacheWord = Annotated[
    FeatureCacheMode,
    BeforeValidator(_feature_cache_word),
    WithJsonSchema({"enum": [FeatureCacheMode.auto.value, FeatureCacheMode.off.value, False, True],
                    "x-kubernetes-preserve-unknown-fields": True}),
]


class OnStall(str, Enum):
    restart = "restart"
    fail = "fail"


class Monitor(str, Enum):
    val_loss = "val_loss"
    val_accuracy = "val_accuracy"
    loss = "loss"
    accuracy = "accuracy"


class EarlyStopping(ApiModel):
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


class Checkpoint(ApiModel):
    """Checkpoints, progress and the final model, written by rank 0 only."""

    location: Optional[str] = Field(
        None,
        description="URI for checkpoints, progress and the final model. "
        "Default: <dataset.output>/runs/<run name>.",
        pattern=DATA_URI_PATTERN,
    )
    every_epochs: int = Field(1, ge=1, le=1000, description="Write a checkpoint every N epochs.")


class InputPipeline(ApiModel):
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


class Training(ApiModel):
    """Data-parallel training by one of three engines (Keras + Horovod, Keras + MultiWorkerMirroredStrategy,
    PyTorch Lightning + DDP). The learning rate is scaled with the number of replicas."""

    framework: Framework = Field(
        Framework.keras,
        description="keras: tf.keras (the default image), with Horovod or TensorFlow's MultiWorkerMirroredStrategy "
        "(training.strategy). pytorch-lightning: PyTorch Lightning DDP "
        "(gloo on CPU, nccl on GPU) over the same MPIJob, in the Lightning image; it trains base "
        "efficientnet_lite0 or a model.builder's torch network and saves the model as TorchScript (model.pt). "
        "With training.command: the default image (and locally the venv) your script runs in.",
    )
    strategy: Optional[Strategy] = Field(
        None,
        description="How the replicas train together. keras: horovod (the default: one Horovod process per GPU) or "
        "multi-worker-mirrored (TensorFlow's MultiWorkerMirroredStrategy: one process per worker pod using all "
        "of its GPUs, NCCL on GPU, ring all-reduce on CPU; no Horovod). pytorch-lightning: ddp (the default and "
        "only one). Default: the framework's default.",
    )
    optimizer: Optimizer = Field(Optimizer.nadam, description="Optimizer; its gradients are averaged over all "
                                 "replicas.")
    batch_size_per_worker: BatchSize = Field(
        32,
        description="Batch size of each data-parallel replica (a process per GPU, or a GPU of a "
        "multi-worker-mirrored process); effective = x replicas. \"auto\": before training, "
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
        3, ge=0, le=1000, description="Failures of the code allowed before the run fails: a launcher or worker "
        "container that exited non-zero on a healthy node (status.training.interruptions launcherFailed and "
        "workerFailed). Pods deleted, nodes lost, evictions, stalls and children deleted count against "
        "maxInterruptions instead.")
    input: InputPipeline = Field(default_factory=InputPipeline, description="The training reader's threads and "
                                 "read-ahead.")
    command: Optional[list[Annotated[str, Field(min_length=1, description="One word of the command line.")]]] = Field(
        None, min_length=1, max_length=256,
        description="Your own training script instead of our trainer, e.g. [python, -m, mypkg.train]: started on "
        "every rank by the MPIJob's mpirun (locally mpirun -np N) in the workers' image. The operator still "
        "prepares the data, mirrors progress and runs sweeps; the script reports through the SDK "
        "(scalingrun_trainer.sdk: context(), report_epoch(), finish()). framework picks the default image "
        "(keras: TensorFlow + Horovod; pytorch-lightning: torch). Excludes model.builder, base, weights, "
        "trainableBase and dropout, and batchSizePerWorker auto.")
    feature_cache: FeatureCacheWord = Field(
        FeatureCacheMode.auto,
        description="auto: with a frozen built-in base (model.trainableBase false), each process runs the base once "
        "over its share of the data, keeps the pooled features (in memory, on local disk beyond 512 MiB) and trains "
        "the head on them in every epoch; the same model trained the same way (val_accuracy and val_loss within the "
        "seeds' own spread of an uncached run's, docs/feature-cache.md), without the base's forward pass in every "
        "epoch. off: "
        "every epoch runs the whole network (an unquoted off, which YAML reads as false, is off; true is auto). "
        "Rebuilt by every attempt (a resumed one too); "
        "status.training.featureCache says whether it was used and what it cost.",
    )
    stall_timeout: DurationOrAuto = Field(
        "auto",
        description="How long the training may go without a heartbeat (rank 0 beats from the training loop at most "
        "every 30 s) before the run is Stalled: seconds or a duration (10m). auto: the larger of 10 minutes and 3x "
        "the longest gap between heartbeats seen in this attempt. 0 turns stall detection off.",
    )
    on_stall: OnStall = Field(
        OnStall.restart,
        description="What a stall does. restart: delete the suspect pods (or all workers when none stands out), so "
        "that the MPIJob starts them and the launcher again, resuming from the checkpoint; counted against "
        "maxInterruptions. fail: the run fails.",
    )
    node_loss_grace_period: Duration = Field(
        60,
        description="How long a worker or launcher pod's node may be NotReady or Unknown before its pods are taken "
        "as lost and force-deleted so that they start elsewhere (seconds or a duration). Workers also tolerate "
        "the unreachable and not-ready taints for this long.",
    )
    max_interruptions: int = Field(
        10, ge=0, le=10000,
        description="Interruptions by the infrastructure allowed before the run fails: pods deleted, nodes lost, "
        "evictions and preemptions, stalls, children deleted. Failures of the code (a non-zero exit on a healthy "
        "node) count against backoffLimit instead.",
    )

    @model_validator(mode="after")
    def _framework_default_strategy(self) -> "Training":
        """An omitted strategy is the framework's default, so that every spec keeps its meaning; the CRD has no
        default for it (one value there would name a strategy for every framework)."""
        if self.strategy is None:
            self.strategy = FRAMEWORK_STRATEGIES[self.framework][0]
        return self
