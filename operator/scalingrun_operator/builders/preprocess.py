"""The preprocessing Job: an Indexed Job, one completion per shard of the source files."""

from __future__ import annotations

from typing import Any

from scalingrun_api.logs import PREPROCESS_FOLDER
from scalingrun_api.models import DatasetFormat, PodRole, ScalingRun
from .common import (
    CONFIG_FILE,
    TMP_DIR,
    config_volume,
    container_security_context,
    metadata,
    pod_spec,
    preprocess_job_name,
    queue_labels,
    resources,
    storage_env,
    trainer_image,
    writable_dirs,
)
from .locations import join, logs_uri
from .overrides import apply_overrides, override_tolerations


# Shard 0 lists the source once and writes the plan under this id; the other shards wait for the plan with their
# Job's uid, so a plan left by an earlier Job (of an older tree) is never used (scalingrun_trainer.preprocess.plan).
# The Job controller labels its pods with the Job's uid as `batch.kubernetes.io/controller-uid` since Kubernetes 1.27
# and as the legacy `controller-uid` before (still set beside it, but due to go): both are passed, a missing label
# reads as an empty value, and the trainer takes the first one set (scalingrun_trainer.cli.plan_id_from).
PLAN_ID_ENVS = [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
                for name, label in (("SCALINGRUN_PLAN_ID", "batch.kubernetes.io/controller-uid"),
                                    ("SCALINGRUN_PLAN_ID_LEGACY", "controller-uid"))]


def is_parquet_table(run: ScalingRun) -> bool:
    """dataset.format parquet: the Job checks the user's table instead of preprocessing a JPEG tree."""
    return run.spec.dataset.format == DatasetFormat.parquet.value


def shard_count(run: ScalingRun) -> int:
    """Completions of the preprocessing Job: one per shard, or the one check of a Parquet table."""
    return 1 if is_parquet_table(run) else run.spec.dataset.preprocessing.parallelism


def _command(run: ScalingRun, shards: int, indexed: bool) -> list[str]:
    if is_parquet_table(run):
        # Checks the table and writes the dataset manifest the preprocessing would (the operator has no pyarrow).
        return ["scalingrun-trainer", "inspect", "--config", CONFIG_FILE]
    # The shard index comes from JOB_COMPLETION_INDEX, set by the Indexed Job; --all-shards runs every shard in
    # turn instead.
    return ["scalingrun-trainer", "preprocess", "--config", CONFIG_FILE, "--shard-count", str(shards),
            *([] if indexed else ["--all-shards"])]


def preprocess_logs_uri(run: ScalingRun) -> str:
    return join(logs_uri(run), PREPROCESS_FOLDER)


def build_preprocess_job(run: ScalingRun, namespace: str, indexed: bool = True) -> dict[str, Any]:
    """`indexed=False` is for servers without Indexed Jobs (< 1.22): one pod runs every shard in turn. With
    dataset.format parquet, one pod checks the table (scalingrun-trainer inspect), in the same Job's place."""
    pre = run.spec.dataset.preprocessing
    shards = shard_count(run)
    volume, mount = config_volume(run)
    scratch, scratch_mounts = writable_dirs(TMP_DIR)
    meta = metadata(run, preprocess_job_name(run), namespace, "preprocess")
    container = {
        "name": "preprocess",
        "image": trainer_image(run),
        # Its log archived in the run's storage when it ends (scalingrun logs RUN --preprocess, after the pod).
        "command": ["scalingrun-trainer", "logged", "--logs", preprocess_logs_uri(run), "--",
                    *_command(run, shards, indexed)],
        # What failed (a table's missing column, an undecodable source) is the pod's termination message, which
        # the operator quotes: written by the command, else the end of its log.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": [*storage_env(run), *([] if is_parquet_table(run) else PLAN_ID_ENVS)],
        "resources": resources(pre.resources.cpu, pre.resources.memory, cpu_limit=pre.resources.cpu_limit),
        "securityContext": container_security_context(),
        "volumeMounts": [mount, *scratch_mounts],
    }
    # Kueue admits a job by un-suspending it (as the MPIJob): created running, it would start before its quota.
    queued = queue_labels(run)
    tolerations = override_tolerations(run, PodRole.preprocess)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**meta, "labels": {**meta["labels"], **queued}},
        "spec": {
            **({"suspend": True} if queued else {}),
            **({"completionMode": "Indexed", "completions": shards, "parallelism": shards} if indexed
               else {"completions": 1, "parallelism": 1}),
            # Kubernetes < 1.28 has no per-index limit: allow the per-shard retries for every shard.
            "backoffLimit": pre.backoff_limit * shards,
            # The Job fails with DeadlineExceeded past it (its pods are stopped): preprocessing has a bound too.
            **({"activeDeadlineSeconds": pre.active_deadline_seconds} if pre.active_deadline_seconds else {}),
            "template": apply_overrides(run, PodRole.preprocess, {
                "metadata": {"labels": dict(meta["labels"])},
                # It reads storage, never the Kubernetes API.
                "spec": {"restartPolicy": "Never", **pod_spec(run, namespace, container, [volume, *scratch]),
                         **({"tolerations": tolerations} if tolerations else {})},
            }),
        },
    }
