"""The preprocessing Job: an Indexed Job, one completion per shard of the source files."""

from __future__ import annotations

from typing import Any

from scalingrun_api.models import ScalingRun
from .common import (
    CONFIG_FILE,
    TMP_DIR,
    config_volume,
    container_security_context,
    metadata,
    pod_security_context,
    preprocess_job_name,
    resources,
    storage_env,
    trainer_image,
    writable_dirs,
)


def build_preprocess_job(run: ScalingRun, namespace: str, indexed: bool = True) -> dict[str, Any]:
    """`indexed=False` is for servers without Indexed Jobs (< 1.22): one pod runs every shard in turn."""
    pre = run.spec.dataset.preprocessing
    shards = pre.parallelism
    volume, mount = config_volume(run)
    scratch, scratch_mounts = writable_dirs(TMP_DIR)
    meta = metadata(run, preprocess_job_name(run), namespace, "preprocess")
    container = {
        "name": "preprocess",
        "image": trainer_image(run),
        # The shard index comes from JOB_COMPLETION_INDEX, set by the Indexed Job; --all-shards runs every
        # shard in turn instead.
        "command": ["scalingrun-trainer", "preprocess", "--config", CONFIG_FILE, "--shard-count", str(shards),
                    *([] if indexed else ["--all-shards"])],
        "env": storage_env(run),
        "resources": resources(pre.resources.cpu, pre.resources.memory, cpu_limit=pre.resources.cpu_limit),
        "securityContext": container_security_context(),
        "volumeMounts": [mount, *scratch_mounts],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            **({"completionMode": "Indexed", "completions": shards, "parallelism": shards} if indexed
               else {"completions": 1, "parallelism": 1}),
            # Kubernetes < 1.28 has no per-index limit: allow the per-shard retries for every shard.
            "backoffLimit": pre.backoff_limit * shards,
            "template": {
                "metadata": {"labels": dict(meta["labels"])},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,  # it reads storage, never the Kubernetes API
                    "securityContext": pod_security_context(),
                    "containers": [container],
                    "volumes": [volume, *scratch],
                },
            },
        },
    }
