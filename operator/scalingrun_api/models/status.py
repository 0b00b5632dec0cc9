"""A ScalingRun's status: phase, conditions, and the preprocessing and training facts the operator mirrors."""

from __future__ import annotations

import datetime as dt
from enum import Enum
from typing import Literal, Optional

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from .common import ApiModel


class Phase(str, Enum):
    pending = "Pending"
    preprocessing = "Preprocessing"
    training = "Training"
    succeeded = "Succeeded"
    failed = "Failed"
    suspended = "Suspended"
    queued = "Queued"


class Condition(ApiModel):
    """A Kubernetes-style condition."""

    type: str = Field(..., description="e.g. Ready, Preprocessed, Trained, Failed, Suspended.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: Optional[str] = Field(None, description="CamelCase reason, e.g. PreprocessingFailed.")
    message: Optional[str] = Field(None, description="What happened and what to do about it.")
    last_transition_time: Optional[str] = Field(None, description="When the status last changed (RFC 3339).")
    observed_generation: Optional[int] = Field(None, description="Generation the condition was set for.")


class PreprocessingStatus(ApiModel):
    """Facts about the preprocessing step."""

    job_name: Optional[str] = Field(None, description="Name of the preprocessing Job.")
    reused: Optional[bool] = Field(None, description="True when a dataset with the same fingerprint existed.")
    fingerprint: Optional[str] = Field(None, description="Fingerprint of inputs and parameters.")
    images_written: Optional[int] = Field(None, description="Images written to Parquet.")
    images_skipped: Optional[int] = Field(None, description="Undecodable files skipped.")
    shards: Optional[int] = Field(None, description="Number of preprocessing shards.")
    shards_reused: Optional[int] = Field(
        None, description="Shards kept from an earlier dataset because their files did not change (the source grew "
        "or changed elsewhere); the others were made anew.")
    classes: Optional[int] = Field(None, description="Number of classes found.")


class TrainingPod(ApiModel):
    """A launcher or worker pod as the operator last saw it: what interruptions are counted against."""

    name: str = Field(..., description="Pod name.")
    uid: str = Field(..., description="Pod UID: a new pod under the same name is a replacement.")
    role: Literal["launcher", "worker"] = Field(..., description="launcher or worker.")
    restarts: int = Field(0, description="Container restarts of this pod already counted.")
    lost: bool = Field(False, description="True once the pod's loss (failed, evicted, deleted) was counted.")


class Interruptions(ApiModel):
    """Restarts of the training by cause. The code's failures (launcherFailed, workerFailed) count against
    spec.training.backoffLimit; the others, the infrastructure's, against spec.training.maxInterruptions."""

    pod_deleted: int = Field(0, description="Launcher or worker pods deleted (by a person, a controller, a drain).")
    node_lost: int = Field(0, description="Pods lost with their node: NotReady or Unknown past "
                           "spec.training.nodeLossGracePeriod (the operator force-deleted them), or deleted by the "
                           "taint manager or the pod garbage collector.")
    node_terminating: int = Field(0, description="Nodes that got a cloud's termination taint (GKE, AWS NTH) under "
                                  "training pods: the operator deleted those pods with their grace period, so that "
                                  "the training checkpointed at its next step before the node went.")
    evicted: int = Field(0, description="Pods evicted (node pressure, the eviction API) or preempted.")
    stalled: int = Field(0, description="Restarts because no heartbeat came for spec.training.stallTimeout.")
    child_deleted: int = Field(0, description="The Job or MPIJob deleted mid-run.")
    launcher_failed: int = Field(0, description="The launcher exited non-zero on a healthy node: the code's failure.")
    worker_failed: int = Field(0, description="A worker container exited non-zero on a healthy node (an OOM kill "
                               "too): the code's failure.")


class HeartbeatStatus(ApiModel):
    """The training's last heartbeat as the operator read it (spec.training.stallTimeout), for this attempt."""

    launcher_uid: Optional[str] = Field(None, description="The launcher pod of the attempt this belongs to.")
    time: Optional[str] = Field(None, description="The last heartbeat (its writer's clock), or the launcher's start "
                                "while none came (RFC 3339).")
    phase: Optional[str] = Field(None, description="The phase it was in: training, restore, probe, feature-cache, ...")
    epoch: Optional[int] = Field(None, description="The epoch it was in.")
    step: Optional[int] = Field(None, description="The step it had reached.")
    timeout_seconds: Optional[float] = Field(None, description="The stall timeout in force (auto: the larger of 10 "
                                             "minutes and 3x the longest gap between beats so far).")
    deadline: Optional[str] = Field(None, description="When the training is Stalled unless it beats again; the "
                                    "operator reads the heartbeat again then (RFC 3339).")


class PodSummary(ApiModel):
    """The training's pods counted, for a run with more pods than status lists one by one (over 64)."""

    total: int = Field(..., description="Launcher and worker pods recorded.")
    listed: int = Field(0, description="Of those that need a look, how many `pods` lists (at most 32).")
    needing_a_look: int = Field(0, description="Pods lost, restarted, or not running (yet): the first of them are in "
                                "`pods`.")
    phases: dict[str, int] = Field(default_factory=dict, description="Pods by phase (Gone: recorded, no longer there).")
    reasons: dict[str, int] = Field(default_factory=dict, description="Pods by the reason they report (Evicted, "
                                    "ImagePullBackOff, OOMKilled, ...), the 20 most common.")


class ProbedBatchSize(ApiModel):
    """One batch size the probe tried."""

    batch_size: int = Field(..., description="Batch size per process.")
    images_per_second: Optional[float] = Field(None, description="Training throughput of one process at it.")
    out_of_memory: bool = Field(False, description="True when this size ran out of memory (the probe stopped).")


class BatchSizeProbe(ApiModel):
    """How batchSizePerWorker: auto was chosen."""

    chosen: Optional[int] = Field(None, description="The batch size per process the probe picked.")
    seconds: Optional[float] = Field(None, description="How long the probe took (before the first epoch).")
    stopped_by: Optional[str] = Field(None, description="outOfMemory or ceiling: why no larger size was tried.")
    table: list[ProbedBatchSize] = Field(default_factory=list, description="Sizes tried, smallest first.")


class InputEpoch(ApiModel):
    """Input-pipeline figures of one epoch."""

    epoch: int = Field(..., description="Epoch (1-based).")
    input_wait_fraction: Optional[float] = Field(
        None, description="Share of training step time spent waiting for input batches (0-1).")
    gpu_utilization: Optional[float] = Field(None, description="Mean GPU utilisation in percent (NVML); none on CPU.")


class DeviceKind(str, Enum):
    gpu = "gpu"
    cpu = "cpu"


class Devices(ApiModel):
    """What rank 0 trains on, as the framework sees it in its process (every rank of a run runs the same image on
    the same kind of worker)."""

    kind: DeviceKind = Field(..., description="gpu, or cpu when the process sees no GPU.")
    count: int = Field(0, ge=0, le=1024, description="GPUs rank 0's process drives: 1 per process under Horovod and "
                       "DDP, all of its worker's under multi-worker-mirrored; 0 on CPU.")
    name: Optional[str] = Field(None, description="The GPU's name (e.g. NVIDIA H100 80GB HBM3), when known.",
                                max_length=256)


class FeatureCache(ApiModel):
    """spec.training.featureCache: whether this attempt trained the head on features the frozen base computed once,
    and what computing them cost."""

    used: bool = Field(..., description="True when the head trained on cached features (the same model as without "
                       "them, within the seeds' own spread).")
    reason: Optional[str] = Field(
        None, description="Why not, when not used: featureCache off, a trainable base, or a custom network.")
    seconds: Optional[float] = Field(
        None, description="Wall time of computing the features (the slowest process), before the first epoch.")
    bytes: Optional[int] = Field(None, description="Size of the cached features, all processes together.")
    rows: Optional[int] = Field(None, description="Images whose features were cached (training and validation).")
    on_disk: Optional[bool] = Field(
        None, description="True when some process kept its features in a local file (beyond 512 MiB) instead of "
        "memory.")


class Resize(ApiModel):
    """One resize of an elastic run: from how many workers to how many, why, and what it cost."""

    from_: int = Field(..., alias="from", description="Workers before.")
    to: int = Field(..., description="Workers after.")
    cause: str = Field(..., description="Why: workersUnplaced (lost workers' replacements the scheduler could not "
                       "place within spec.workers.resizeAfter), with the pods and the scheduler's words; "
                       "capacityReturned (capacity probes placed), with the probes.")
    lost_at: Optional[str] = Field(None, description="When the loss began: the first unplaced replacement's creation; "
                                   "for a grow, when the capacity was seen (RFC 3339).")
    decided_at: Optional[str] = Field(None, description="When the operator decided the resize (RFC 3339).")
    training_at: Optional[str] = Field(None, description="When the MPIJob at the new size ran again (RFC 3339).")
    cost_seconds: Optional[int] = Field(None, description="Seconds from lostAt to trainingAt.")


class CapacitySeen(ApiModel):
    """Capacity probes placed: how many workers would fit, since when, and the epoch after which the run grows."""

    workers: int = Field(..., description="Workers that fit now (the MPIJob's plus the placed probes).")
    seen_at: Optional[str] = Field(None, description="When the probes were seen placed (RFC 3339).")
    seen_at_epoch: Optional[int] = Field(None, description="The epoch then; the run grows once a later one ends.")


class SizeTime(ApiModel):
    """An elastic run's time at one size, and what it held: workers x time (x GPUs per worker)."""

    workers: int = Field(..., description="The worker count.")
    seconds: int = Field(..., description="Seconds the run trained at this size: from when it trained at it (its "
                         "first MPIJob, or a resize's trainingAt) to the next resize's trainingAt or the end; a "
                         "suspended or queued MPIJob's time is at no size.")
    worker_hours: float = Field(..., description="workers x seconds, in hours.")
    gpu_hours: Optional[float] = Field(None, description="workerHours x spec.workers.gpusPerWorker, when the workers "
                                       "ask for GPUs.")


class SizeCounting(ApiModel):
    """The size whose time runs now (added to sizes when it changes, the MPIJob is paused, or it ends)."""

    workers: int = Field(..., description="The worker count.")
    since: str = Field(..., description="Since when its time runs (RFC 3339).")


MAX_RESIZES = 20  # ElasticStatus.resizes keeps the last ones: status stays small


class ElasticStatus(ApiModel):
    """An elastic run's size (spec.workers.minReplicas): the worker count its MPIJob has now, and its resizes."""

    workers: Optional[int] = Field(None, description="Workers the MPIJob has (spec.workers.replicas at full size).")
    resizing: Optional[Resize] = Field(None, description="A resize under way (the MPIJob being made again at `to`).")
    capacity: Optional[CapacitySeen] = Field(None, description="Capacity probes placed: the run grows at the next "
                                             "epoch boundary.")
    resizes: list[Resize] = Field(default_factory=list, max_length=MAX_RESIZES,
                                  description="The last 20 resizes, oldest first: the worker count over time.")
    started_at: Optional[str] = Field(None, description="When its first MPIJob was made (or first found), at "
                                      "the first resize's `from` workers (RFC 3339).")
    sizes: list[SizeTime] = Field(default_factory=list, description="The time at each size seen, the largest first, "
                                  "with its worker-hours and GPU-hours; the size counting now adds its time since "
                                  "counting.since (`scalingrun get -o wide` and `scalingrun report` add it).")
    counting: Optional[SizeCounting] = Field(None, description="The size whose time runs now, and since when; "
                                             "absent while the MPIJob is suspended, queued or finished.")


class ShippedFunction(ApiModel):
    digest: str = Field(description="sha256 of the payload (the function, its arguments, packages and code) that "
                        "every rank checked before it ran it.")
    location: str = Field(description="The folder of the payload and of rank 0's return value: "
                          "<runLocation>/function/<sha256>.")


class TrainingStatus(ApiModel):
    """Progress of the training, mirrored from the trainer's progress document."""

    mpi_job_name: Optional[str] = Field(None, description="Name of the MPIJob.")
    processes: Optional[int] = Field(None, description="Training processes (replicas x slots): one per GPU, or one "
                                     "per worker under multi-worker-mirrored.")
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
    estimated_completion: Optional[str] = Field(
        None, description="When the training would end at maxEpochs, at this attempt's mean epoch time (RFC 3339); "
        "early stopping may end it sooner. Recomputed at each new epoch.")
    resumed_from_epoch: Optional[int] = Field(
        None, description="Epoch the current attempt resumed from (its last checkpoint); none for a fresh start.")
    restarts: Optional[int] = Field(
        None, description="Restarts of the training, of every cause (the sum of interruptions): worker pods lost, "
        "launcher restarts of their own (a worker lost and the launcher restart it causes are one), stalls, children "
        "deleted. Each has an Event naming the pod and the reason.")
    interruptions: Optional[Interruptions] = Field(
        None, description="The restarts by cause, and so by the limit they count against (backoffLimit: the code's "
        "failures; maxInterruptions: the rest).")
    worker_pods_lost: Optional[int] = Field(None, description="Worker pods deleted, evicted or failed.")
    launcher_restarts: Optional[int] = Field(
        None, description="Launcher restarts (container or new pod), but for those a worker's loss caused.")
    suspend_applied: Optional[bool] = Field(
        None, description="spec.runPolicy.suspend as last applied to the MPIJob. With runPolicy.kueueQueueName, Kueue "
        "suspends and resumes the MPIJob, and the operator changes its suspend only when spec.runPolicy.suspend "
        "differs from this.")
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
    feature_cache: Optional[FeatureCache] = Field(
        None, description="Whether the head trained on features the frozen base computed once, and what that cost. "
        "The same model as without the cache: its val_accuracy and val_loss differ from an uncached run's by no more "
        "than the seeds' own spread (docs/feature-cache.md).")
    devices: Optional[Devices] = Field(
        None, description="What rank 0 trains on (GPUsUnused says when GPUs were asked for and none is used).")
    process_hours: Optional[float] = Field(
        None, description="What this attempt has cost so far: training processes x its training time (progress "
        "elapsedSeconds), in hours; as a sweep's workerHours. Earlier attempts of a restarted run are not counted.")
    gpu_hours: Optional[float] = Field(
        None, description="processHours x the GPUs each process drives (devices.count), when training on GPUs.")
    heartbeat: Optional[HeartbeatStatus] = Field(
        None, description="The last heartbeat of this attempt and the stall deadline it sets.")
    pods: list[TrainingPod] = Field(
        default_factory=list, description="Launcher and worker pods as last seen, so that a restarted operator "
        "neither counts an interruption twice nor misses one. Over 64 pods: only those that need a look (lost, "
        "restarted, not running), at most 32; podRecords then keeps every pod and podSummary counts them.")
    pod_records: Optional[str] = Field(
        None, description="Over 64 pods: every pod's record, compact (name after the MPIJob's name:first 8 "
        "characters of its uid:restarts counted[:lost]), space-separated; at most 4096 pods.")
    pod_summary: Optional[PodSummary] = Field(None, description="Over 64 pods: the pods counted by phase and reason.")
    function: Optional[ShippedFunction] = Field(
        None, description="A run of a shipped function (scalingrun.HorovodRunner): what its training.command runs.")
    elastic: Optional[ElasticStatus] = Field(
        None, description="An elastic run's (spec.workers.minReplicas) worker count and its resizes, each with its "
        "cause and cost.")


class ScalingRunStatus(ApiModel):
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
    logs: Optional[str] = Field(
        None, description="Where the launcher archives each attempt's log, to read after the pods are gone "
        "(`scalingrun logs`): <runLocation>/logs, with attempt-<n>/launcher.log and rank-<r>.log in it.")
    start_time: Optional[dt.datetime] = Field(None, description="When the run started.")
    completion_time: Optional[dt.datetime] = Field(None, description="When the run finished.")
    pinned_spec: Optional[str] = Field(
        None, description="The spec the run started with, as JSON (zlib+base64 when large), written by the operator "
        "at its first look: later edits but runPolicy.suspend are not applied (condition SpecChangeIgnored). Only "
        "the status verb writes it; the old annotation scalingrun.dev/pinned-spec is ignored.")
