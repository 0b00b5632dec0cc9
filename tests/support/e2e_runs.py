"""A ScalingRun in the e2e cluster: its body, its children, its phase and conditions, its launcher's log."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from typing import Any

import pytest
import yaml

from tests.e2e.environment import DATA_SOURCE, RELEASE

OPERATOR_PODS = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"  # the chart's pods


# The launcher's line when an attempt starts from a checkpoint: an epoch's end, or a step within one (written on a
# preemption notice: the SIGTERM of a deleted or evicted pod too).
RESUMED = "resuming "
_RESUMED_FROM = re.compile(r"resuming (?:after epoch (\d+)|at step \d+ of epoch (\d+))")


def resumed_epochs(log: str) -> int:
    """The epochs finished before the last attempt the log shows resuming: the checkpoint's epoch, or for a step
    checkpoint the epoch it was written in, less one."""
    found = list(_RESUMED_FROM.finditer(log))
    assert found, f"no resumed attempt in the launcher's log:\n{log[-3000:]}"
    after, within = found[-1].groups()
    return int(after) if after is not None else int(within) - 1


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


def run_body(cluster, name: str, *, output: str, epochs: int = 2, parallelism: int = 1,
             image: str | None = None, worker_cpu: str = "500m", patience: int = 10) -> dict[str, Any]:
    """A run that fits a 2-CPU node: 2 workers at 500m, a small launcher, preprocessing at 500m."""
    return {
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": name},
        "spec": {
            "storage": {"endpoint": cluster.s3_endpoint, "credentialsSecret": cluster.s3_secret},
            "dataset": {
                "source": DATA_SOURCE, "output": output, "imageSize": 64, "validationFraction": 0.2, "seed": 7,
                "preprocessing": {"parallelism": parallelism, "maxBadFraction": 0.05,
                                  "resources": {"cpu": "500m", "memory": "1Gi"}},
            },
            "model": {"base": "efficientnet_lite0", "weights": "imagenet"},
            "training": {"batchSizePerWorker": 16, "maxEpochs": epochs,
                         "earlyStopping": {"monitor": "val_loss", "patience": patience}},
            "workers": {"replicas": 2, "gpusPerWorker": 0, "cpu": worker_cpu, "memory": "2Gi",
                        "image": image or cluster.trainer_image},
        },
    }


def phase(run: dict[str, Any]) -> str | None:
    return (run.get("status") or {}).get("phase")


def condition_texts(run: dict[str, Any]) -> str:
    status = run.get("status") or {}
    parts = [f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
             for c in status.get("conditions") or []]
    return "\n".join(parts + [str(status.get("message") or "")])


def finished(run: dict[str, Any]) -> bool:
    if phase(run) == "Failed":
        pytest.fail(f"{run['metadata']['name']} failed:\n{condition_texts(run)}")
    return phase(run) == "Succeeded"


def child_objects(cluster, name: str) -> dict[str, list[tuple[str, str]]]:
    """The run's children by kind as (name, uid), found by its label: a duplicate or a re-creation shows."""
    from kubernetes import client

    selector = f"scalingrun.dev/run={name}"
    batch = client.BatchV1Api(cluster.api)
    mpijobs = cluster.custom().list_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.namespace,
                                                             "mpijobs", label_selector=selector)["items"]
    jobs = [j for j in batch.list_namespaced_job(cluster.namespace, label_selector=selector).items
            if (j.metadata.labels or {}).get("app.kubernetes.io/component") == "preprocess"]
    configmaps = cluster.core().list_namespaced_config_map(cluster.namespace, label_selector=selector).items
    return {"MPIJob": [(m["metadata"]["name"], m["metadata"]["uid"]) for m in mpijobs],
            "Job": [(j.metadata.name, j.metadata.uid) for j in jobs],
            "ConfigMap": [(c.metadata.name, c.metadata.uid) for c in configmaps]}


def children(cluster, name: str) -> dict[str, list[str]]:
    return {kind: [n for n, _ in objects] for kind, objects in child_objects(cluster, name).items()}


def launcher_log(cluster, name: str) -> str:
    """The log of the launcher's current container (a restarted one starts a new log)."""
    result = subprocess.run([*cluster.kubectl, "logs", "-n", cluster.namespace, f"job/{name}-train-launcher",
                             "--tail=-1"], capture_output=True, text=True)
    return result.stdout + result.stderr


def wait_for_launcher_line(cluster, name: str, text: str, timeout: float, after: str = "") -> None:
    """Waits for a line of rank 0's output (after the last `after` line, when given): the launcher's log is
    live, status follows at the next poll."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = launcher_log(cluster, name)
        at = log.rfind(after) if after else 0
        if at >= 0 and text in log[at:]:
            return
        time.sleep(1)
    pytest.fail(f"{name}: no {text!r} in the launcher's log within {timeout:.0f} s:\n"
                f"{launcher_log(cluster, name)[-3000:]}")


def launcher_attempt(cluster, name: str) -> tuple[str, int]:
    """(pod uid, container restarts) of the running launcher: it changes when mpirun starts again."""
    launchers = [p for p in cluster.run_pods(name)
                 if (p.metadata.labels or {}).get("training.kubeflow.org/job-role") == "launcher"
                 and p.status.phase in ("Pending", "Running") and p.metadata.deletion_timestamp is None]
    if len(launchers) != 1:
        return "", -1
    pod = launchers[0]
    running = [c for c in pod.status.container_statuses or [] if c.state.running]
    return (pod.metadata.uid, running[0].restart_count) if running else ("", -1)


def sync_the_chart_twice(cluster) -> None:
    """What Argo CD does on every sync: renders the chart without the cluster (its values as the e2e installed it) and
    applies the render. Two renders are byte-identical, and applying both changes neither the operator's certificate
    (its Secret, the same version: the pods keep trusting it) nor its pods (no rollout)."""
    import os
    from pathlib import Path

    from tests.e2e.environment import SYSTEM_NAMESPACE, chart_values, status_push
    from tests.support.env import ROOT

    # Without the PodDisruptionBudget: a render without the cluster picks policy/v1, which 1.20 lacks (Argo CD's
    # --api-versions only add to Helm's defaults), as manifests/base leaves it out. No --kubeconfig: Argo CD renders
    # without the cluster.
    render = [str(Path(os.environ["SCALINGRUN_TOOLS"]) / "helm"), "template", RELEASE, "charts/scalingrun",
              "-n", SYSTEM_NAMESPACE, "--set", "podDisruptionBudget.enabled=false",
              *chart_values(os.environ["SCALINGRUN_E2E_OPERATOR_IMAGE"])]
    renders = [subprocess.run(render, cwd=ROOT, capture_output=True, text=True, check=True).stdout
               for _ in range(2)]
    assert renders[0] == renders[1], "two renders of the chart differ: every sync would change the cluster"

    def certificate_and_operators() -> tuple[Any, list[str]]:
        secrets = cluster.core().list_namespaced_secret(SYSTEM_NAMESPACE).items
        kept = [(s.metadata.name, s.metadata.resource_version) for s in secrets
                if s.metadata.name.endswith("-status-tls")]
        pods = cluster.core().list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=OPERATOR_PODS).items
        return kept, sorted(p.metadata.uid for p in pods if p.metadata.deletion_timestamp is None)

    before = certificate_and_operators()
    assert before[0] or not status_push(), "the push path's operator made no certificate Secret"
    try:
        for rendered in renders:
            gitops_apply(cluster, rendered)
        assert certificate_and_operators() == before
    finally:
        # The sync's manager gives its fields back (helm's install owns them too): the CRDs outlive `helm uninstall`,
        # and a later `helm install` of another chart version met this manager's ownership as a conflict.
        gitops_apply(cluster, "---\n".join(yaml.safe_dump(identity(document))
                                           for document in yaml.safe_load_all(renders[0]) if document),
                     "--validate=false")  # kubectl's own check wants a CRD's spec; the API server merges helm's


def identity(document: dict[str, Any]) -> dict[str, Any]:
    """An object's kind and name: applied alone, its manager keeps no field of the object."""
    keep = {key: document["metadata"][key] for key in ("name", "namespace") if key in document["metadata"]}
    return {"apiVersion": document["apiVersion"], "kind": document["kind"], "metadata": keep}


def gitops_apply(cluster, documents: str, *flags: str) -> None:
    applied = subprocess.run([*cluster.kubectl, "apply", "--server-side", "--force-conflicts",
                              "--field-manager=gitops-sync", *flags, "-f", "-"], input=documents, capture_output=True,
                             text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
