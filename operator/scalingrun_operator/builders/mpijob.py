"""The training MPIJob (kubeflow.org/v2beta1): a launcher running mpirun and N sshd workers."""

from __future__ import annotations

import shlex
from typing import Any, Optional, Sequence

from scalingrun_api.engines import engine
from scalingrun_api.heartbeat import COLLECTIVE_TIMEOUT_VARIABLE, collective_timeout_seconds
from scalingrun_api.models import MPIJOB_API_VERSION, PodRole, ScalingRun, Toleration, Workers, quantity_value
from scalingrun_api.models.common import duration_seconds
from scalingrun_api.models.run import DEFAULT_GPU_RESOURCE, DEFAULT_SHARED_MEMORY, SMALL_POD_MEMORY
from scalingrun_api.models.training import CONFIG_VARIABLE
from scalingrun_api.status_push import STATUS_PATH_VARIABLE
from .common import (
    CONFIG_FILE,
    TMP_DIR,
    config_volume,
    container_security_context,
    metadata,
    mpijob_name,
    pod_spec,
    queue_labels,
    resources,
    storage_env,
    tracking_env,
    trainer_image,
    writable_dirs,
)
from .config import slots_per_worker, total_processes
from .locations import logs_uri
from .overrides import apply_overrides, launcher_variables, override_tolerations

# What serves the MPIJobs this renders (MPIJOB_API_VERSION): Kubeflow's mpi-operator v0.8, and how to install it
# (the quick start's check, `scalingrun doctor` and the run's MPIJobServed condition say it).
MPI_OPERATOR = "Kubeflow's mpi-operator v0.8"
MPI_OPERATOR_INSTALL = ("kubectl apply --server-side -f https://raw.githubusercontent.com/kubeflow/mpi-operator/"
                        "v0.8.2/deploy/v2beta1/mpi-operator.yaml")

MPI_USER_HOME = "/home/mpiuser"
HOSTFILE = "/etc/mpi/hostfile"
# The trainer image's non-root sshd listens here (Dockerfile.trainer, /etc/ssh/sshd_config).
SSH_PORT = 2222
# ... and keeps its host key (made by the entrypoint at start) and pid file here: a worker's one writable
# folder besides /tmp (the root filesystem is read-only; ~/.ssh is mpi-operator's Secret, read-only).
SSHD_STATE_DIR = f"{MPI_USER_HOME}/.sshd"
# The image's entrypoint creates this pod's own ssh host key (none is baked in), then execs sshd. Rendering
# a command keeps mpi-operator from substituting its default `sshd -De`, which would bypass the entrypoint.
WORKER_COMMAND = ["/usr/local/bin/scalingrun-entrypoint", "/usr/sbin/sshd", "-De"]
WORKER_WAIT_SECONDS = 300
# What workers that ask for GPUs tolerate unless the operator's gpuTolerations setting (chart value gpuTolerations)
# says otherwise: GKE's GPU node pools, and most AKS and EKS ones, taint their nodes nvidia.com/gpu (NoSchedule); the
# AKS guide's own taint is sku=gpu. A toleration only allows a node; the GPU request and nodeSelector choose it.
DEFAULT_GPU_TOLERATIONS = (
    Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
    Toleration(key="sku", operator="Equal", value="gpu", effect="NoSchedule"),
)
SHARED_MEMORY_DIR = "/dev/shm"
FORWARDED_ENV = ("AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", STATUS_PATH_VARIABLE)


def command_env(run: ScalingRun) -> list[dict[str, Any]]:
    """training.command: where the SDK (scalingrun_trainer.sdk.context) finds the run's config on every rank."""
    if not run.spec.training.command:
        return []
    return [{"name": CONFIG_VARIABLE, "value": CONFIG_FILE}]


def rank_command(run: ScalingRun) -> list[str]:
    """What mpirun starts on every rank: the user's training.command, or our trainer (which dispatches on
    training.framework in the config; the image, trainer_image, holds that framework's trainer)."""
    return list(run.spec.training.command or ["scalingrun-trainer", "train", "--config", CONFIG_FILE])


def _engine(run: ScalingRun):
    return engine(run.spec.training.framework, run.spec.training.strategy)


def framework_env(run: ScalingRun) -> list[dict[str, Any]]:
    """An engine with a thread variable (Lightning: torch's CPU threads per process) gets it from the worker's CPU
    (torch would otherwise start one per node core and oversubscribe the pod): its CPU limit (cpuLimit, else cpu)
    / slots, rounded down. The other engines' settings are unchanged."""
    w = run.spec.workers
    cores = w.cpu_limit or w.cpu
    variable = _engine(run).thread_variable
    if not variable or not cores:
        return []
    threads = max(1, int(quantity_value(cores) // slots_per_worker(run)))
    return [{"name": variable, "value": str(threads)}]


def stall_env(run: ScalingRun) -> list[dict[str, Any]]:
    """The engine's rank environment (Keras + Horovod: Horovod's stall shutdown, off by default in Horovod, so that
    a rank that stops submitting tensors ends the run instead of holding it)."""
    return [{"name": name, "value": value} for name, value in _engine(run).rank_env]


def gpu_env(run: ScalingRun) -> list[dict[str, Any]]:
    """With GPUs: NCCL's errors and timeouts end the rank instead of leaving it inside a collective (torch reads
    TORCH_NCCL_ASYNC_ERROR_HANDLING, before 2.2 NCCL_ASYNC_ERROR_HANDLING), and the trainer's collective timeout,
    from which every engine's own follows, comes from spec.training.stallTimeout (scalingrun_api.heartbeat)."""
    if not run.spec.workers.gpus_per_worker:
        return []
    timeout = collective_timeout_seconds(run.spec.training.stall_timeout)
    return [{"name": "NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
            {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
            {"name": COLLECTIVE_TIMEOUT_VARIABLE, "value": str(timeout)}]


def rank_env(run: ScalingRun) -> list[dict[str, Any]]:
    """The launcher's and workers' environment; mpirun forwards it to every rank."""
    return (storage_env(run) + tracking_env(run) + framework_env(run) + command_env(run) + stall_env(run)
            + gpu_env(run))


def shared_memory_size(workers: Workers) -> str:
    """spec.workers.sharedMemory, else 1Gi, or half of the worker's memory when that is under 2Gi (what /dev/shm
    holds counts against the memory limit, so a small pod keeps room for its processes)."""
    if workers.shared_memory:
        return workers.shared_memory
    if workers.memory and quantity_value(workers.memory) < quantity_value(SMALL_POD_MEMORY):
        return f"{max(1, int(quantity_value(workers.memory) / 2 / 2**20))}Mi"
    return DEFAULT_SHARED_MEMORY


def shared_memory(workers: Workers) -> tuple[dict[str, Any], dict[str, Any]]:
    """/dev/shm as a memory-backed emptyDir of shared_memory_size: (volume, volumeMount). Kubernetes 1.22+ sizes
    the tmpfs by sizeLimit; before, the kubelet evicts a pod that writes more."""
    name = SHARED_MEMORY_DIR.strip("/").replace("/", "-")
    return ({"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": shared_memory_size(workers)}},
            {"name": name, "mountPath": SHARED_MEMORY_DIR})


def launcher_script(run: ScalingRun, workers: int) -> str:
    """Waits until every worker in the hostfile answers ssh (`scalingrun-trainer launch`; upstream
    mpi-operator #386, #482, #615), then runs mpirun of the trainer (or training.command): one rank per slot of
    the `workers` workers (slots_per_worker: one per GPU, or one per worker pod for multi-worker-mirrored). The
    launcher archives the attempt's log in `<runLocation>/logs` (status.logs) when it ends."""
    mpirun = [
        # --tag-output: each rank's lines marked [1,<rank>], so that the archived log keeps every rank's last lines.
        "mpirun", "-np", str(total_processes(run, workers)), "--hostfile", HOSTFILE, "--tag-output",
        "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
    ]
    # Rank 0 runs on a worker, started through mpirun: the MLflow credentials must travel with it too.
    ours = FORWARDED_ENV + tuple(e["name"] for e in rank_env(run) if e["name"] not in FORWARDED_ENV)
    for var in ours + tuple(name for name in launcher_variables(run) if name not in ours):
        mpirun += ["-x", var]
    mpirun += rank_command(run)
    launch = ["scalingrun-trainer", "launch", "--hostfile", HOSTFILE, "--ssh-port", str(SSH_PORT),
              "--timeout", str(WORKER_WAIT_SECONDS), "--logs", logs_uri(run), "--"]
    return "exec " + shlex.join(launch + mpirun)


def _pod_template(run: ScalingRun, namespace: str, labels: dict[str, str], container: dict[str, Any],
                  volumes: list[dict[str, Any]], workers: bool,
                  gpu_tolerations: Sequence[Toleration] = ()) -> dict[str, Any]:
    w = run.spec.workers
    # Neither mpirun (over ssh, not kubectl exec) nor the trainer calls the Kubernetes API.
    pod = pod_spec(run, namespace, container, volumes)
    pod["terminationGracePeriodSeconds"] = termination_grace_seconds(w)
    role = PodRole.workers if workers else PodRole.launcher
    user = [_toleration(t) for t in w.tolerations] if workers else []
    user += override_tolerations(run, role)
    if workers and w.gpus_per_worker:
        user += missing_tolerations(user, gpu_tolerations)
    pod["tolerations"] = node_loss_tolerations(user, duration_seconds(run.spec.training.node_loss_grace_period))
    if workers:
        if w.node_selector:
            pod["nodeSelector"] = dict(w.node_selector)
        if w.priority_class_name:
            pod["priorityClassName"] = w.priority_class_name
    return apply_overrides(run, role, {"metadata": {"labels": dict(labels)}, "spec": pod})


def termination_grace_seconds(workers: Workers) -> int:
    """spec.workers.terminationGracePeriod: the time a worker's ranks have after SIGTERM for the checkpoint at the
    next step (scalingrun_trainer.core.preemption). The launcher gets the same, so that its mpirun, which forwards a
    SIGTERM of its own to the ranks, is not killed before them."""
    return duration_seconds(workers.termination_grace_period)


def _toleration(toleration: Toleration) -> dict[str, Any]:
    return toleration.model_dump(mode="json", by_alias=True, exclude_none=True)


def _tolerates(own: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether toleration `own` already lets a pod onto every node that `wanted` does."""
    if own.get("effect") not in (None, wanted.get("effect")):
        return False
    if own.get("operator") == "Exists":
        return not own.get("key") or own.get("key") == wanted.get("key")
    return (own.get("key"), own.get("value")) == (wanted.get("key"), wanted.get("value")) and \
        wanted.get("operator") != "Exists"


def missing_tolerations(user: list[dict[str, Any]], wanted: Sequence[Toleration]) -> list[dict[str, Any]]:
    """The operator's GPU tolerations that the user's own do not already give."""
    rendered = [_toleration(t) for t in wanted]
    return [t for t in rendered if not any(_tolerates(own, t) for own in user)]


# The taints a node gets when it stops answering (unreachable) or reports NotReady; without a toleration of its
# own a pod gets the cluster's default of 300 s.
NODE_LOSS_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


def node_loss_tolerations(user: list[dict[str, Any]], grace_seconds: int) -> list[dict[str, Any]]:
    """The user's tolerations, plus NoExecute ones for a lost node's taints that end after
    spec.training.nodeLossGracePeriod, so the cluster evicts a lost node's pods as soon as the operator would.
    A toleration of the user's for the same taint (or for every NoExecute taint) is kept as it is."""
    out = list(user)
    for key in NODE_LOSS_TAINTS:
        covered = any(t.get("effect") in (None, "NoExecute") and (t.get("key") == key or (
            not t.get("key") and t.get("operator") == "Exists")) for t in user)
        if not covered:
            out.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": grace_seconds})
    return out


def _run_policy(run: ScalingRun, workers: int) -> dict[str, Any]:
    policy = run.spec.run_policy
    out: dict[str, Any] = {
        "cleanPodPolicy": policy.clean_pod_policy,
        # The launcher's Job counts every launcher restart, a lost worker's or a stall's too (and a deleted launcher
        # pod): room for spec.training.maxInterruptions more, so that the operator's own limits end the run first
        # and the infrastructure's interruptions do not use up the code's retries.
        "backoffLimit": policy.backoff_limit + run.spec.training.max_interruptions,
        # Kueue admits a job by un-suspending it: created running, it would start before its quota is granted.
        "suspend": policy.suspend or bool(policy.kueue_queue_name),
    }
    if policy.active_deadline_seconds is not None:
        out["activeDeadlineSeconds"] = policy.active_deadline_seconds
    if policy.ttl_seconds_after_finished is not None:
        out["ttlSecondsAfterFinished"] = policy.ttl_seconds_after_finished
    if policy.scheduling_policy is not None:
        gang = policy.scheduling_policy.model_dump(mode="json", by_alias=True, exclude_none=True)
        if gang.get("minAvailable") and gang["minAvailable"] > workers + 1:
            gang["minAvailable"] = workers + 1  # an elastic run below its most: the gang it has is all there is
        out["schedulingPolicy"] = gang
    return out


def build_mpijob(run: ScalingRun, namespace: str, gpu_tolerations: Sequence[Toleration] = DEFAULT_GPU_TOLERATIONS,
                 workers: Optional[int] = None) -> dict[str, Any]:
    """The MPIJob of `run` at `workers` workers (None: spec.workers.replicas; an elastic run's size is fewer);
    workers that ask for GPUs also get `gpu_tolerations` (the operator's setting)."""
    w = run.spec.workers
    replicas = w.replicas if workers is None else workers
    if not 1 <= replicas <= w.replicas:
        raise ValueError(f"run {run.metadata.name}'s MPIJob cannot have {replicas} workers: it has 1 to "
                         f"spec.workers.replicas ({w.replicas})")
    meta = metadata(run, mpijob_name(run), namespace, "training")
    meta["labels"].update(queue_labels(run))
    volume, mount = config_volume(run)
    launcher_scratch, launcher_mounts = writable_dirs(TMP_DIR)
    worker_scratch, worker_mounts = writable_dirs(TMP_DIR, SSHD_STATE_DIR)
    shm_volume, shm_mount = shared_memory(w)  # workers only: the launcher runs mpirun, rank 0 trains on a worker
    launcher = {
        "name": "launcher",
        "image": trainer_image(run),
        "command": ["/bin/sh", "-c", launcher_script(run, replicas)],
        "env": rank_env(run),
        "resources": resources(run.spec.launcher.resources.cpu, run.spec.launcher.resources.memory,
                               cpu_limit=run.spec.launcher.resources.cpu_limit),
        "securityContext": container_security_context(),
        "volumeMounts": [mount, *launcher_mounts],
    }
    worker = {
        "name": "worker",
        "image": trainer_image(run),
        "command": WORKER_COMMAND,
        "env": rank_env(run),
        "resources": resources(w.cpu, w.memory, w.gpus_per_worker, cpu_limit=w.cpu_limit,
                               gpu_resource=w.gpu_resource or DEFAULT_GPU_RESOURCE),
        "securityContext": container_security_context(),
        "volumeMounts": [mount, *worker_mounts, shm_mount],
    }
    return {
        "apiVersion": MPIJOB_API_VERSION,
        "kind": "MPIJob",
        "metadata": meta,
        "spec": {
            "slotsPerWorker": slots_per_worker(run),
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": f"{MPI_USER_HOME}/.ssh",
            # Gang schedulers start all pods together; waiting for workers would deadlock (mpi-operator #608).
            "launcherCreationPolicy": (
                "AtStartup" if run.spec.run_policy.scheduling_policy else "WaitForWorkersReady"
            ),
            "runPolicy": _run_policy(run, replicas),
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": _pod_template(run, namespace, meta["labels"], launcher,
                                              [volume, *launcher_scratch], workers=False),
                },
                "Worker": {
                    "replicas": replicas,
                    "restartPolicy": "Never",
                    "template": _pod_template(run, namespace, meta["labels"], worker,
                                              [volume, *worker_scratch, shm_volume], workers=True,
                                              gpu_tolerations=gpu_tolerations),
                },
            },
        },
    }
